//! The objects of a chunked dataset listed in key ranges at once, for a dataset without
//! a manifest: its chunk directories are named `chunk_00000`, `chunk_00001`, … (zero
//! padded, so in key order), and its header says how many there are, so the keys can be
//! cut at chunk names into [`LISTING_RANGES`] ranges before a page is asked for. Each
//! range is listed from its first chunk's name on (S3's `start-after`) until a key of
//! the next range shows; the first range also takes the keys before the chunks, the
//! last those after them (the header, the global files). A dataset of 24,415 chunks
//! lists its 73,000 objects in about 5 pages' time instead of 74 pages one after the
//! other. Only a store that lists in key order (S3, GCS) can be cut so: a local folder
//! lists in its directories' order, in one range.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore};
use scdl_format::layout::chunk_dir_name;

use super::{too_long_a_listing, MAX_LISTED_ENTRIES};
use crate::error::{FsError, FsResult};
use crate::store::listing_progress::ListingProgress;

/// How many ranges of a dataset's keys are listed at once: each costs a page more than
/// its share of the keys (the last page of a range reads on into the next one's), and
/// a connection. Sixteen cut 74 pages to 5 a range.
pub const LISTING_RANGES: u64 = 16;

/// The most chunks whose names sort as their numbers: `chunk_100000` sorts between
/// `chunk_10000` and `chunk_10001`.
const MOST_ORDERED_CHUNKS: u64 = 100_000;

/// Lists a dataset's keys in ranges at once: the store, and whether it lists keys in
/// key order (S3, GCS), so that they can be cut into ranges.
#[derive(Clone)]
pub(super) struct RangeLister {
    store: Arc<dyn ObjectStore>,
    keys_in_order: bool,
}

impl RangeLister {
    pub(super) fn new(store: Arc<dyn ObjectStore>, keys_in_order: bool) -> RangeLister {
        RangeLister {
            store,
            keys_in_order,
        }
    }

    /// Every object under `prefix`, a chunked dataset of `chunks` chunks, listed in
    /// ranges at once: in one range from a store that lists in another order than the
    /// keys' (a local folder), or for a dataset with more chunks than sort by name.
    pub(super) async fn list_in_ranges(
        &self,
        prefix: &ObjectPath,
        chunks: u64,
    ) -> FsResult<Vec<ObjectMeta>> {
        let ranges = if !self.keys_in_order || chunks > MOST_ORDERED_CHUNKS {
            1
        } else {
            LISTING_RANGES.min(chunks).max(1)
        };
        // The first chunk of each range after the first; its name sorts before its keys.
        let cuts: Vec<ObjectPath> = (1..ranges)
            .map(|i| {
                prefix
                    .clone()
                    .join(chunk_dir_name((chunks * i / ranges) as u32))
            })
            .collect();
        // Entries held by all ranges together, which stop past the cap.
        let held = AtomicUsize::new(0);
        let listings = (0..ranges as usize).map(|i| {
            let from = i.checked_sub(1).map(|before| &cuts[before]);
            let until = cuts.get(i);
            self.list_range(prefix, from, until, &held)
        });
        let listed: Vec<Vec<ObjectMeta>> = futures::future::try_join_all(listings).await?;
        Ok(listed.into_iter().flatten().collect())
    }

    /// The objects under `prefix` after `from` (from the start if `None`) and before
    /// `until` (to the end if `None`), each counted in `held`.
    async fn list_range(
        &self,
        prefix: &ObjectPath,
        from: Option<&ObjectPath>,
        until: Option<&ObjectPath>,
        held: &AtomicUsize,
    ) -> FsResult<Vec<ObjectMeta>> {
        let mut pages = match from {
            Some(offset) => self.store.list_with_offset(Some(prefix), offset),
            None => self.store.list(Some(prefix)),
        };
        let mut listed = Vec::new();
        while let Some(meta) = pages
            .try_next()
            .await
            .map_err(|e| FsError::store(prefix.as_ref(), &e))?
        {
            if until.is_some_and(|until| meta.location.as_ref() >= until.as_ref()) {
                break;
            }
            if held.fetch_add(1, Ordering::Relaxed) >= MAX_LISTED_ENTRIES {
                return Err(too_long_a_listing(prefix));
            }
            ListingProgress::advanced();
            listed.push(meta);
        }
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    #[tokio::test]
    async fn ranges_list_every_key_once_in_order() {
        let store = Arc::new(InMemory::new());
        let mut keys = vec![
            ".scdlfs-manifest".to_owned(),
            "header.sch".into(),
            "var_features/a".into(),
        ];
        for chunk in 0..37 {
            for name in ["col_ptr.npy", "data.npy", "row_ptr.npy"] {
                keys.push(format!("{}/{name}", chunk_dir_name(chunk)));
            }
        }
        for key in &keys {
            let key = ObjectPath::from(format!("ds/{key}"));
            store
                .put(&key, PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        store
            .put(&ObjectPath::from("dt/other"), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        let lister = RangeLister::new(store as Arc<dyn ObjectStore>, true);
        let listed = lister
            .list_in_ranges(&ObjectPath::from("ds"), 37)
            .await
            .unwrap();
        let mut want: Vec<String> = keys.iter().map(|k| format!("ds/{k}")).collect();
        want.sort();
        let got: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
        assert_eq!(got, want);
    }
}
