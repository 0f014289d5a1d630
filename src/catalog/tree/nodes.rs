//! The tree's node types: directories with their listing, files with what their bytes
//! are ([`FileContent`]). Nodes never change; a relisting makes new ones.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectMeta};
use parking_lot::Mutex;
use scdl_format::ArrayKind;
use tokio::time::Instant;

use crate::catalog::chunked::FlatDataset;
use crate::catalog::dataset::Dataset;
use crate::error::FsResult;
use crate::object::ObjectInfo;
use crate::store::listing_progress::ListingProgress;

/// Whether a directory's subtree looks for chunked datasets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirMode {
    /// Chunked datasets are shown flat.
    Discover,
    /// Objects are shown exactly as stored.
    Raw,
}

/// What a file's bytes are.
#[derive(Clone)]
pub enum FileContent {
    Object(Arc<ObjectInfo>),
    FlatArray(Arc<FlatDataset>, ArrayKind),
    Bytes(Bytes),
    /// The dataset's read-ahead hint file; read, it gives the daemon's announcement
    /// (`fs::announce`). The bytes are the announcement of an empty cache, whose
    /// length the file shows as its size.
    Hints(Dataset, Bytes),
}

pub struct FileNode {
    pub content: FileContent,
    pub size: u64,
    pub mtime: SystemTime,
}

pub struct DirNode {
    pub(super) prefix: ObjectPath,
    pub(super) mode: DirMode,
    /// A listing of the directory's prefix made before its first use, taken as its
    /// first listing while current instead of asking the store again. Boxed, as
    /// `in_flight` is: a directory that has neither costs a word for each (an atlas's
    /// `.chunked/` holds 24,415 directories).
    pub(super) prelisted: Mutex<Option<Box<Prelisted>>>,
    /// The current listing, once made.
    pub(super) listing: Mutex<Option<Arc<Listing>>>,
    /// The listing of the store under way, if one is: a task of its own, which every
    /// caller joins, so that a caller's deadline ends its wait, not the listing.
    pub(super) in_flight: Mutex<Option<Box<InFlight>>>,
}

/// A listing of a directory under way, shared by everyone waiting for it.
pub(super) type ListingTask = Shared<BoxFuture<'static, FsResult<Arc<Listing>>>>;

/// A listing under way and how far it has come: a caller waits while it advances.
#[derive(Clone)]
pub(super) struct InFlight {
    pub(super) task: ListingTask,
    pub(super) progress: Arc<ListingProgress>,
}

/// The store's delimited listing of a prefix, and when it was made. The mount's check
/// that the store answers lists the root; a chunked dataset's listing is also that of
/// its raw view, `.chunked/`, which shows the same prefix.
#[derive(Clone)]
pub(super) struct Prelisted {
    pub(super) at: Instant,
    pub(super) common_prefixes: Vec<ObjectPath>,
    pub(super) objects: Vec<ObjectMeta>,
}

impl Prelisted {
    /// A listing made just now.
    pub(super) fn now(listed: ListResult) -> Prelisted {
        Prelisted {
            at: Instant::now(),
            common_prefixes: listed.common_prefixes,
            objects: listed.objects,
        }
    }
}

impl DirNode {
    pub(super) fn new(prefix: ObjectPath, mode: DirMode, prelisted: Option<Prelisted>) -> DirNode {
        DirNode {
            prefix,
            mode,
            prelisted: Mutex::new(prelisted.map(Box::new)),
            listing: Mutex::new(None),
            in_flight: Mutex::new(None),
        }
    }

    /// The listing, if it was made and has not expired.
    pub(super) fn current_listing(&self) -> Option<Arc<Listing>> {
        self.listing.lock().clone().filter(|l| l.is_current())
    }
}

pub enum NodeKind {
    Dir(DirNode),
    File(FileNode),
}

pub struct Node {
    pub ino: u64,
    pub parent: u64,
    pub kind: NodeKind,
}

/// A listed directory: entry names in sorted order, with their inodes (one name each,
/// found by a binary search: a map beside them held every name twice).
pub struct Listing {
    pub entries: Vec<(String, u64)>,
    /// When the store is to be listed again; `None`: never (no `--metadata-ttl`).
    pub(super) expires: Option<Instant>,
}

impl Listing {
    pub fn get(&self, name: &str) -> Option<u64> {
        let at = self
            .entries
            .binary_search_by(|(entry, _)| entry.as_str().cmp(name));
        at.ok().map(|at| self.entries[at].1)
    }

    fn is_current(&self) -> bool {
        self.expires.is_none_or(|at| Instant::now() < at)
    }

    /// How long what this listing says may be taken as true (the kernel's entry
    /// timeout); `None`: for the mount's life.
    pub fn valid_for(&self) -> Option<Duration> {
        self.expires
            .map(|at| at.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name is found among a listing's sorted entries, and only a listed one.
    #[test]
    fn a_listing_finds_its_names() {
        let names = [
            ".chunked",
            "chunk_00000",
            "chunk_00001",
            "header.sch",
            "row_ptr.npy",
        ];
        let listing = Listing {
            entries: (names.iter().enumerate())
                .map(|(i, name)| (name.to_string(), i as u64 + 2))
                .collect(),
            expires: None,
        };
        for (i, name) in names.iter().enumerate() {
            assert_eq!(listing.get(name), Some(i as u64 + 2));
        }
        for missing in ["", "chunk_0000", "chunk_00002", "zzz", ".a"] {
            assert_eq!(listing.get(missing), None);
        }
    }
}
