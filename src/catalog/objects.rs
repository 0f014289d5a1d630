//! The objects a mount has seen, each version with an id of its own, its size,
//! modification time and pinned ETag, and the cache group it belongs to.
//!
//! Pinning the ETag is what keeps versions from mixing ([`crate::object`]).
//! Without `--metadata-ttl` the first version seen stays the mount's; with it, a key
//! listed again with another ETag (or, without ETags, another size or modification
//! time) becomes a new [`ObjectInfo`] with a new id, so its parts are cached apart from
//! the old version's, which the files opened before keep.

use std::collections::HashMap;
use std::sync::Arc;

use object_store::ObjectMeta;
use parking_lot::Mutex;
use scdl_format::layout::parse_chunk_dir_name;
use scdl_format::ArrayKind;

use crate::metrics::Metrics;
use crate::object::{canonical_etag, ObjectInfo};
use crate::parts::{GroupId, ObjectId};

#[derive(Default)]
struct Tables {
    /// The current version of each key.
    by_key: HashMap<String, Arc<ObjectInfo>>,
    groups: HashMap<String, GroupId>,
    next_id: u64,
}

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
        let key = meta.location.to_string();
        let etag = meta.e_tag.as_deref().map(canonical_etag);
        let mtime = meta.last_modified.into();
        let mut tables = self.tables.lock();
        if let Some(known) = tables.by_key.get(&key) {
            if !self.follows_changes || known.is_version(meta.size, etag.as_deref(), mtime) {
                return known.clone();
            }
            tracing::info!(object = %key, was = ?known.etag, now = ?etag, "the object changed in the store: files opened from now on read the new version");
            Metrics::add(&self.metrics.objects_replaced, 1);
        }
        let group = chunk_prefix_of(&key).map(|prefix| {
            let next = GroupId(tables.groups.len() as u64);
            *tables.groups.entry(prefix.to_owned()).or_insert(next)
        });
        let info = Arc::new(ObjectInfo {
            id: ObjectId(tables.next_id),
            key: meta.location.clone(),
            size: meta.size,
            etag,
            mtime,
            group,
        });
        tables.next_id += 1;
        tables.by_key.insert(key, info.clone());
        drop(tables);
        (self.on_new)(&info);
        info
    }
}

/// `a/b/chunk_00003` for `a/b/chunk_00003/data.npy`; `None` for objects that are not
/// arrays of a chunk.
fn chunk_prefix_of(key: &str) -> Option<&str> {
    let (dir, file) = key.rsplit_once('/')?;
    ArrayKind::from_file_name(file)?;
    let chunk_dir = dir.rsplit('/').next()?;
    parse_chunk_dir_name(chunk_dir).map(|_| dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_arrays_share_their_chunk_group() {
        assert_eq!(
            chunk_prefix_of("ds/chunk_00002/col_ptr.npy"),
            Some("ds/chunk_00002")
        );
        assert_eq!(chunk_prefix_of("chunk_00002/data.npy"), Some("chunk_00002"));
        assert_eq!(chunk_prefix_of("ds/chunk_00002/notes.txt"), None);
        assert_eq!(chunk_prefix_of("ds/data.npy"), None);
    }
}
