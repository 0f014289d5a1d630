//! The objects a mount has seen, each with a stable id, its size, modification time and
//! the ETag pinned at first sight, and the cache group it belongs to.
//!
//! Pinning the ETag is what keeps versions from mixing: every later ranged read asks
//! the store for that exact version (`If-Match`), so an object overwritten in the
//! bucket fails loudly instead of splicing new bytes into old ones.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;
use parking_lot::Mutex;
use scdl_format::layout::parse_chunk_dir_name;
use scdl_format::ArrayKind;

use crate::parts::{GroupId, ObjectId};

/// One object of the store, as pinned by this mount.
#[derive(Debug)]
pub struct ObjectInfo {
    pub id: ObjectId,
    pub key: ObjectPath,
    pub size: u64,
    pub etag: Option<String>,
    pub mtime: SystemTime,
    /// The SCDL chunk this object is an array of, if any: its parts are cached and
    /// evicted with the chunk's other arrays.
    pub group: Option<GroupId>,
}

#[derive(Default)]
struct Tables {
    by_key: HashMap<String, Arc<ObjectInfo>>,
    groups: HashMap<String, GroupId>,
}

/// Told of every object the first time it is seen (the cache adopts its parts).
pub type NewObjectListener = Box<dyn Fn(&ObjectInfo) + Send + Sync>;

/// Interns objects by key, so every path to an object (flat view, `.chunked/`, raw
/// view) shares one id and one set of cached parts.
#[derive(Default)]
pub struct ObjectRegistry {
    tables: Mutex<Tables>,
    on_new: Option<NewObjectListener>,
}

impl ObjectRegistry {
    pub fn with_listener(on_new: NewObjectListener) -> ObjectRegistry {
        ObjectRegistry {
            tables: Mutex::default(),
            on_new: Some(on_new),
        }
    }

    pub fn register(&self, meta: &ObjectMeta) -> Arc<ObjectInfo> {
        let key = meta.location.to_string();
        let mut tables = self.tables.lock();
        if let Some(known) = tables.by_key.get(&key) {
            return known.clone();
        }
        let group = chunk_prefix_of(&key).map(|prefix| {
            let next = GroupId(tables.groups.len() as u64);
            *tables.groups.entry(prefix.to_owned()).or_insert(next)
        });
        let info = Arc::new(ObjectInfo {
            id: ObjectId(tables.by_key.len() as u64),
            key: meta.location.clone(),
            size: meta.size,
            etag: meta.e_tag.as_deref().map(canonical_etag),
            mtime: meta.last_modified.into(),
            group,
        });
        tables.by_key.insert(key, info.clone());
        drop(tables);
        if let Some(on_new) = &self.on_new {
            on_new(&info);
        }
        info
    }
}

/// An ETag in its HTTP header form, quoted (`"abc"` or `W/"abc"`), whatever form the
/// store listed it in: GCS's JSON listing and some WebDAV servers (WsgiDAV) give it
/// bare, while their GET answers quote it. Pinned ETags are sent as `If-Match` and
/// compared with the ETag of each answer, so both sides must be in the same form.
pub fn canonical_etag(tag: &str) -> String {
    if tag.starts_with('"') || tag.starts_with("W/\"") {
        tag.to_owned()
    } else {
        format!("\"{tag}\"")
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
    fn etags_take_their_quoted_header_form() {
        assert_eq!(canonical_etag("\"abc\""), "\"abc\"");
        assert_eq!(canonical_etag("W/\"abc\""), "W/\"abc\"");
        assert_eq!(
            canonical_etag("pD9KxgjJ00wUA68b6YuF7w=="),
            "\"pD9KxgjJ00wUA68b6YuF7w==\""
        );
        assert_eq!(canonical_etag("1-2-3"), "\"1-2-3\"");
    }

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
