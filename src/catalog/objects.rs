//! The objects a mount has seen, each version with an id of its own, its size,
//! modification time and pinned ETag, and the cache group it belongs to.
//!
//! Pinning the ETag is what keeps versions from mixing ([`crate::object`]).
//! Without `--metadata-ttl` the first version seen stays the mount's; with it, a key
//! listed again with another ETag (or, without ETags, another size or modification
//! time) becomes a new [`ObjectInfo`] with a new id, so its parts are cached apart from
//! the old version's, which the files opened before keep.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::SystemTime;

use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;
use parking_lot::Mutex;
use scdl_format::layout::parse_chunk_dir_name;
use scdl_format::ArrayKind;

use crate::metrics::Metrics;
use crate::object::{canonical_etag, Etag, ObjectInfo};
use crate::parts::{GroupId, ObjectId};

#[derive(Default)]
struct Tables {
    /// The current version of each key, found by its key: the key is held once, in
    /// the object (a map from a `String` held it twice).
    by_key: HashSet<ByKey>,
    /// A number for each directory that holds chunk directories: an array's group is
    /// its chunk directory, numbered from its parent's number and the chunk's
    /// ([`GroupId`] of `(parent << 32) | chunk`), so no chunk directory's name is kept.
    chunk_parents: HashMap<String, u32>,
    next_id: u64,
}

/// An object found by its key.
struct ByKey(Arc<ObjectInfo>);

impl ByKey {
    fn key(&self) -> &str {
        self.0.key.as_ref()
    }
}

impl Borrow<str> for ByKey {
    fn borrow(&self) -> &str {
        self.key()
    }
}

/// Hashed as its key's `str`, as `Borrow` requires.
impl Hash for ByKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl PartialEq for ByKey {
    fn eq(&self, other: &ByKey) -> bool {
        self.key() == other.key()
    }
}

impl Eq for ByKey {}

/// Told of every object version the first time it is seen (the cache adopts its parts).
pub type NewObjectListener = Box<dyn Fn(&ObjectInfo) + Send + Sync>;

/// Interns objects by key, so every path to an object (flat view, `.chunked/`, raw
/// view) shares one id and one set of cached parts.
pub struct ObjectRegistry {
    tables: Mutex<Tables>,
    on_new: NewObjectListener,
    /// Whether a key listed with another version than the one known replaces it
    /// (`--metadata-ttl`); otherwise the first version seen is kept for the mount's life.
    follows_changes: bool,
    metrics: Arc<Metrics>,
}

impl ObjectRegistry {
    pub fn new(
        on_new: NewObjectListener,
        follows_changes: bool,
        metrics: Arc<Metrics>,
    ) -> ObjectRegistry {
        ObjectRegistry {
            tables: Mutex::default(),
            on_new,
            follows_changes,
            metrics,
        }
    }

    /// The object a listing's entry stands for: the version known, or a new one.
    pub fn register(&self, meta: &ObjectMeta) -> Arc<ObjectInfo> {
        let etag = meta.e_tag.as_deref().map(canonical_etag);
        self.register_version(
            meta.location.clone(),
            meta.size,
            etag,
            meta.last_modified.into(),
        )
    }

    /// The object at `key` of `size`, ETag (canonical, [`canonical_etag`]) and
    /// modification time (a listing's or a manifest's): the version known, or a new one.
    pub fn register_version(
        &self,
        key: ObjectPath,
        size: u64,
        etag: Option<Etag>,
        mtime: SystemTime,
    ) -> Arc<ObjectInfo> {
        let mut tables = self.tables.lock();
        if let Some(known) = tables.by_key.get(key.as_ref()) {
            let known = &known.0;
            if !self.follows_changes || known.is_version(size, etag.as_deref(), mtime) {
                return known.clone();
            }
            tracing::info!(object = %key, was = ?known.etag, now = ?etag, "the object changed in the store: files opened from now on read the new version");
            Metrics::add(&self.metrics.objects_replaced, 1);
        }
        let group = chunk_of(key.as_ref()).map(|(parent, chunk)| {
            let next = tables.chunk_parents.len() as u32;
            let parent = match tables.chunk_parents.get(parent) {
                Some(&known) => known,
                None => *tables
                    .chunk_parents
                    .entry(parent.to_owned())
                    .or_insert(next),
            };
            GroupId((parent as u64) << 32 | chunk as u64)
        });
        let info = Arc::new(ObjectInfo {
            id: ObjectId(tables.next_id),
            key,
            size,
            etag,
            mtime,
            group,
        });
        tables.next_id += 1;
        tables.by_key.replace(ByKey(info.clone()));
        drop(tables);
        (self.on_new)(&info);
        info
    }
}

/// `("a/b", 3)` for `a/b/chunk_00003/data.npy`: the directory that holds the chunk
/// directory, and the chunk's number; `None` for objects that are not arrays of a
/// chunk.
fn chunk_of(key: &str) -> Option<(&str, u32)> {
    let (dir, file) = key.rsplit_once('/')?;
    ArrayKind::from_file_name(file)?;
    let (parent, chunk_dir) = dir.rsplit_once('/').unwrap_or(("", dir));
    parse_chunk_dir_name(chunk_dir).map(|chunk| (parent, chunk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_arrays_name_their_chunk() {
        assert_eq!(chunk_of("a/ds/chunk_00002/col_ptr.npy"), Some(("a/ds", 2)));
        assert_eq!(chunk_of("chunk_00002/data.npy"), Some(("", 2)));
        assert_eq!(chunk_of("ds/chunk_00002/notes.txt"), None);
        assert_eq!(chunk_of("ds/chunk_2/data.npy"), None);
        assert_eq!(chunk_of("ds/data.npy"), None);
    }

    fn registry(follows_changes: bool) -> ObjectRegistry {
        ObjectRegistry::new(
            Box::new(|_| {}),
            follows_changes,
            Arc::new(Metrics::default()),
        )
    }

    fn meta(key: &str, etag: &str) -> ObjectMeta {
        ObjectMeta {
            location: ObjectPath::from(key),
            last_modified: SystemTime::UNIX_EPOCH.into(),
            size: 10,
            e_tag: Some(etag.to_owned()),
            version: None,
        }
    }

    /// An array's group is its chunk directory: the arrays of one chunk share it, no
    /// two chunk directories do (in one dataset or two), and other objects have none.
    #[test]
    fn chunk_arrays_share_their_chunk_group_and_no_other() {
        let registry = registry(false);
        let group = |key: &str| registry.register(&meta(key, "e")).group;
        let a = group("x/ds/chunk_00002/data.npy");
        assert!(a.is_some());
        assert_eq!(group("x/ds/chunk_00002/row_ptr.npy"), a);
        let others = [
            group("x/ds/chunk_00003/data.npy"),
            group("y/ds/chunk_00002/data.npy"),
            group("chunk_00002/data.npy"),
            group("x/chunk_00002/data.npy"),
        ];
        for (i, other) in others.iter().enumerate() {
            assert!(other.is_some());
            assert_ne!(*other, a);
            assert!(others[..i].iter().all(|earlier| earlier != other));
        }
        assert_eq!(group("x/ds/chunk_00002/notes.txt"), None);
        assert_eq!(group("x/ds/metadata.json"), None);
    }

    /// One object per key, found again by its key; with `--metadata-ttl` a key listed
    /// in another version becomes a new object, found from then on.
    #[test]
    fn a_key_is_one_object_until_it_changes() {
        let kept = registry(false);
        let first = kept.register(&meta("ds/a", "1"));
        assert!(Arc::ptr_eq(&first, &kept.register(&meta("ds/a", "1"))));
        assert!(Arc::ptr_eq(&first, &kept.register(&meta("ds/a", "2"))));
        let other = kept.register(&meta("ds/b", "1"));
        assert_ne!(other.id, first.id);

        let following = registry(true);
        let first = following.register(&meta("ds/a", "1"));
        let second = following.register(&meta("ds/a", "2"));
        assert_ne!(second.id, first.id);
        assert_eq!(second.etag.as_deref(), Some("\"2\""));
        assert!(Arc::ptr_eq(
            &second,
            &following.register(&meta("ds/a", "2"))
        ));
    }
}
