//! An object of the store as this mount pins it, and the one way its bytes are asked
//! for.
//!
//! Pinning the ETag is what keeps versions from mixing: every GET of an [`ObjectInfo`]
//! goes through [`pinned_get`], which asks the store for that exact version
//! (`If-Match`) and checks the ETag of the answer too, so an object overwritten in the
//! bucket fails loudly ([`FsError::ObjectChanged`]) instead of splicing new bytes into
//! old ones. Both the catalog (headers) and the fetcher (parts) read through it.
//!
//! This module is part of the bottom layer: it imports only [`crate::parts`],
//! [`crate::etag`] and [`crate::error`], and every layer above may use it.

use std::ops::Range;
use std::time::SystemTime;

use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResult, ObjectMeta, ObjectStore};

use crate::error::{FsError, FsResult};
pub use crate::etag::{canonical_etag, Etag};
use crate::parts::{GroupId, ObjectId};

/// One object of the store, as pinned by this mount.
#[derive(Debug)]
pub struct ObjectInfo {
    pub id: ObjectId,
    pub key: ObjectPath,
    pub size: u64,
    pub etag: Option<Etag>,
    pub mtime: SystemTime,
    /// The SCDL chunk this object is an array of, if any: its parts are cached and
    /// evicted with the chunk's other arrays.
    pub group: Option<GroupId>,
}

impl ObjectInfo {
    /// Whether a listing's entry is this version: the same ETag and size, or, where
    /// either side has no ETag, the same size and modification time.
    pub fn is_version(&self, size: u64, etag: Option<&str>, mtime: SystemTime) -> bool {
        self.size == size
            && match (self.etag.as_deref(), etag) {
                (Some(pinned), Some(listed)) => pinned == listed,
                _ => self.mtime == mtime,
            }
    }
}

/// A GET of `range` (the whole object with `None`) of the pinned version of `object`:
/// refused with [`FsError::ObjectChanged`] if the store holds another version now,
/// whether it says so (412) or answers with another ETag; where the pin or the answer
/// has no ETag (a store without them, an HTTP server that ignores `If-Match` and sends
/// none on a 206), if the answer's modification time or object size differ from the
/// listed ones. Such an answer is a version by its time alone, which two writes within
/// one second can share: [`pinned_by_etag`] tells the two apart, and bytes of two
/// answers are joined only if both are pinned by their ETag.
pub async fn pinned_get(
    store: &dyn ObjectStore,
    object: &ObjectInfo,
    range: Option<Range<u64>>,
) -> FsResult<GetResult> {
    let key = object.key.as_ref();
    let options = GetOptions {
        range: range.map(GetRange::Bounded),
        if_match: object.etag.as_deref().map(str::to_owned),
        ..Default::default()
    };
    let changed = || FsError::ObjectChanged {
        key: key.to_owned(),
        pinned: match &object.etag {
            Some(etag) => format!("ETag {etag}"),
            None => format!(
                "{} bytes modified at {}",
                object.size,
                humantime::format_rfc3339_nanos(object.mtime)
            ),
        },
    };
    let result = store
        .get_opts(&object.key, options)
        .await
        .map_err(|e| match e {
            object_store::Error::Precondition { .. } => changed(),
            other => FsError::store(key, &other),
        })?;
    let answer = &result.meta;
    let same = match (&object.etag, &answer.e_tag) {
        (Some(pinned), Some(now)) => *pinned == canonical_etag(now),
        _ => answer.size == object.size && same_time(answer.last_modified.into(), object.mtime),
    };
    if !same {
        return Err(changed());
    }
    Ok(result)
}

/// Whether an answer of [`pinned_get`] is tied to the pinned version by its ETag, not by
/// its modification time alone.
pub fn pinned_by_etag(object: &ObjectInfo, answer: &ObjectMeta) -> bool {
    object.etag.is_some() && answer.e_tag.is_some()
}

/// Whether two modification times are the same, at the coarser precision of the two:
/// an HTTP `Last-Modified` has whole seconds, an S3 listing's milliseconds.
fn same_time(a: SystemTime, b: SystemTime) -> bool {
    let since_epoch = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let (a, b) = (since_epoch(a), since_epoch(b));
    if a.subsec_nanos() == 0 || b.subsec_nanos() == 0 {
        a.as_secs() == b.as_secs()
    } else {
        a == b
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    /// Writes `bytes` as the object `key`, a new version of it if there was one.
    async fn put(store: &InMemory, key: &str, bytes: &[u8]) {
        let payload = PutPayload::from(Bytes::copy_from_slice(bytes));
        store.put(&ObjectPath::from(key), payload).await.unwrap();
    }

    async fn pinned(store: &InMemory, key: &str) -> ObjectInfo {
        let meta = store.head(&ObjectPath::from(key)).await.unwrap();
        ObjectInfo {
            id: ObjectId(0),
            key: meta.location,
            size: meta.size,
            etag: meta.e_tag.as_deref().map(canonical_etag),
            mtime: meta.last_modified.into(),
            group: None,
        }
    }

    #[tokio::test]
    async fn a_pinned_get_reads_the_version_pinned_and_refuses_a_newer_one() {
        let store = Arc::new(InMemory::new());
        put(&store, "ds/header.sch", b"first").await;
        let object = pinned(&store, "ds/header.sch").await;
        let whole = pinned_get(store.as_ref(), &object, None).await.unwrap();
        assert_eq!(whole.bytes().await.unwrap().as_ref(), b"first");
        let part = pinned_get(store.as_ref(), &object, Some(1..3))
            .await
            .unwrap();
        assert_eq!(part.bytes().await.unwrap().as_ref(), b"ir");

        put(&store, "ds/header.sch", b"later").await;
        for range in [None, Some(0..2)] {
            match pinned_get(store.as_ref(), &object, range).await {
                Err(FsError::ObjectChanged { key, .. }) => assert_eq!(key, "ds/header.sch"),
                other => panic!("a rewritten object must be refused, got {other:?}"),
            }
        }
    }

    /// A store that ignores `If-Match` and answers without an ETag.
    #[derive(Debug)]
    struct NoEtags;

    #[async_trait::async_trait]
    impl crate::store::wrapper::StoreHook for NoEtags {
        async fn get(
            &self,
            mut request: crate::store::wrapper::GetRequest<'_>,
        ) -> object_store::Result<GetResult> {
            request.options.if_match = None;
            let mut result = request.send().await?;
            result.meta.e_tag = None;
            Ok(result)
        }
    }

    /// Where the answer has no ETag, the version is its modification time and size: a
    /// rewritten object is refused even by a store that ignores `If-Match`.
    #[tokio::test]
    async fn an_answer_without_an_etag_is_pinned_by_its_modification_time_and_size() {
        let memory = Arc::new(InMemory::new());
        put(&memory, "ds/header.sch", b"first").await;
        let object = pinned(&memory, "ds/header.sch").await;
        let store = crate::store::wrapper::HookedStore::new(memory.clone(), NoEtags);
        let whole = pinned_get(&store, &object, None).await.unwrap();
        assert_eq!(whole.bytes().await.unwrap().as_ref(), b"first");
        for later in [&b"later"[..], b"longer"] {
            put(&memory, "ds/header.sch", later).await;
            match pinned_get(&store, &object, Some(0..2)).await {
                Err(FsError::ObjectChanged { .. }) => {}
                Ok(_) => panic!("{later:?}: another version's bytes were accepted"),
                Err(other) => panic!("{later:?}: not the changed object's error: {other:?}"),
            }
        }
    }
}
