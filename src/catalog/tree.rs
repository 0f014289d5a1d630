//! The inode tree. Directories are listed on first use, with one delimited listing of
//! their prefix. Without `--metadata-ttl` the listing is kept for the life of the mount
//! (dataset objects are immutable); with it, the first lookup or readdir after the
//! listing's age passed the TTL lists the store again, like the first listing. A
//! listing runs in a task of its own that every caller joins. A caller waits as long
//! as the listing advances (pages of entries keep coming: a dataset of 10^4 chunks
//! lists for longer than `--read-timeout`) and gives up once it brought nothing for
//! `--read-timeout`, leaving it running, so a listing that stalled for a while is
//! still made once and found by a later caller; the listing itself is bounded by
//! [`LISTING_DEADLINES`] deadlines. A failed first listing is not kept (the next caller
//! lists again); a failed relisting keeps the listing it had, for another TTL.
//!
//! Nodes never change. Inode numbers are handed out as entries are first listed and
//! never reused; a relisting keeps the inode of every entry that is still the same
//! (same object version, same dataset, same directory) and gives a changed entry a
//! new one. So a handle open on a file keeps the version it opened (its inode's
//! [`FileContent`], with pinned ETags), the kernel's page cache of a file is never
//! shown for another version, and entries that vanished are gone for new lookups while
//! open files keep their nodes. A dataset is discovered again, as a whole, when any of
//! the objects its discovery read (its header, its chunks' objects, a monolithic
//! dataset's arrays) is listed in another version, or a chunk appears or vanishes: a
//! flat array never mixes chunks of two versions.
//!
//! In the default (flat) view, a directory whose `header.sch` is a chunked SCDL header
//! is shown as the equivalent monolithic archive: synthesized `header.sch`, virtual
//! `data.npy`, `row_ptr.npy`, `col_ptr.npy`, the other entries passed through, and the
//! dataset's objects as stored under `.chunked/`. Below `.chunked/`, and everywhere in
//! the raw view, directories show exactly the store's objects, plus a hint file in each
//! chunked dataset's directory. A directory whose `header.sch` is monolithic is shown
//! as stored, with a hint file ([`super::monolithic`]).

mod discovery;
mod flat_entries;
mod manifest;
mod nodes;
mod ranges;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::FutureExt;
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectStore};
use parking_lot::RwLock;
use scdl_format::hint::{Announcement, HINT_FILE};
use scdl_format::layout::{parse_chunk_dir_name, HEADER_FILE};
use tokio::time::Instant;

use super::dataset::Dataset;
use super::objects::ObjectRegistry;
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::store::listing_progress::ListingProgress;
use discovery::{Datasets, Manifested};
use flat_entries::flat_entries;
use manifest::ManifestOpener;
pub use nodes::{DirMode, DirNode, FileContent, FileNode, Listing, Node, NodeKind};
use nodes::{InFlight, Prelisted};
use ranges::RangeLister;

pub struct Tree {
    registry: Arc<ObjectRegistry>,
    /// The datasets found, by prefix ([`Datasets`]).
    datasets: Datasets,
    /// Opens a directory from its manifest while it is listed ([`ManifestOpener`]).
    opener: ManifestOpener,
    nodes: RwLock<Vec<Arc<Node>>>,
    mount_time: SystemTime,
    /// How long a listing stands before the store is listed again (`None`: forever).
    metadata_ttl: Option<Duration>,
    /// The longest a listing runs ([`LISTING_DEADLINES`]).
    listing_timeout: Duration,
    metrics: Arc<Metrics>,
}

/// How long a tree's listings stand and run.
pub struct ListingTimes {
    /// How long a listing stands before the store is listed again (`None`: for the
    /// mount's life).
    pub metadata_ttl: Option<Duration>,
    /// The longest a listing runs ([`LISTING_DEADLINES`]).
    pub listing_timeout: Duration,
    /// Whether the store lists keys in key order (S3, GCS), so that a chunked dataset's
    /// objects can be listed in key ranges at once.
    pub keys_in_order: bool,
}

/// An entry of a directory being built, before it has an inode.
enum Pending {
    Dir(ObjectPath, DirMode, Option<Prelisted>),
    File(FileNode),
}

impl Pending {
    /// Whether `node` shows what this entry would: then it keeps its inode.
    fn is_same_as(&self, node: &Node) -> bool {
        match (self, &node.kind) {
            (Pending::Dir(prefix, mode, _), NodeKind::Dir(dir)) => {
                dir.prefix == *prefix && dir.mode == *mode
            }
            (Pending::File(new), NodeKind::File(old)) => {
                new.size == old.size
                    && new.mtime == old.mtime
                    && match (&new.content, &old.content) {
                        (FileContent::Object(a), FileContent::Object(b)) => Arc::ptr_eq(a, b),
                        (FileContent::FlatArray(a, k), FileContent::FlatArray(b, l)) => {
                            Arc::ptr_eq(a, b) && k == l
                        }
                        (FileContent::Bytes(a), FileContent::Bytes(b)) => a == b,
                        (FileContent::Hints(a, _), FileContent::Hints(b, _)) => a.same(b),
                        _ => false,
                    }
            }
            _ => false,
        }
    }
}

impl Tree {
    /// The tree of `store` under `root`, listed within `times`; `root_listing`: the
    /// store's delimited listing of `root` if one was just made, which the root's
    /// first use then takes.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        root: ObjectPath,
        mode: DirMode,
        registry: ObjectRegistry,
        times: ListingTimes,
        metrics: Arc<Metrics>,
        root_listing: Option<ListResult>,
    ) -> Tree {
        let root = Arc::new(Node {
            ino: fuser::INodeNo::ROOT.0,
            parent: fuser::INodeNo::ROOT.0,
            kind: NodeKind::Dir(DirNode::new(root, mode, root_listing.map(Prelisted::now))),
        });
        let registry = Arc::new(registry);
        let ranges = RangeLister::new(store.clone(), times.keys_in_order);
        let opener = ManifestOpener::new(store.clone(), ranges);
        Tree {
            datasets: Datasets::new(
                store,
                registry.clone(),
                metrics.clone(),
                times.metadata_ttl,
                opener.clone(),
            ),
            opener,
            registry,
            nodes: RwLock::new(vec![root]),
            mount_time: SystemTime::now(),
            metadata_ttl: times.metadata_ttl,
            listing_timeout: times.listing_timeout,
            metrics,
        }
    }

    /// When what is listed now is to be listed again.
    fn expiry(&self) -> Option<Instant> {
        self.metadata_ttl.map(|ttl| Instant::now() + ttl)
    }

    fn is_current(&self, checked: Instant) -> bool {
        is_current(self.metadata_ttl, checked)
    }

    pub fn mount_time(&self) -> SystemTime {
        self.mount_time
    }

    pub fn node(&self, ino: u64) -> FsResult<Arc<Node>> {
        let index = ino.checked_sub(1).ok_or(FsError::NotFound)? as usize;
        self.nodes
            .read()
            .get(index)
            .cloned()
            .ok_or(FsError::NotFound)
    }

    /// The directory's listing: listing the store on first use, and again once
    /// `--metadata-ttl` has passed. The store is listed by a task of its own that
    /// every caller joins ([`DirNode::in_flight`]). A caller waits while the listing
    /// advances, and stops waiting ([`FsError::TimedOut`]) once it brought no entry
    /// for `patience` (`--read-timeout`): a listing of many pages answers however long
    /// it takes within its own bound ([`LISTING_DEADLINES`]), while one that stalls is
    /// left running, and a later caller takes its result.
    pub async fn listing(self: &Arc<Self>, ino: u64, patience: Duration) -> FsResult<Arc<Listing>> {
        let node = self.node(ino)?;
        let NodeKind::Dir(dir) = &node.kind else {
            return Err(FsError::NotADirectory);
        };
        if let Some(current) = dir.current_listing() {
            return Ok(current);
        }
        let InFlight { mut task, progress } = {
            let mut in_flight = dir.in_flight.lock();
            // Made meanwhile by a listing that ended since the check above.
            if let Some(current) = dir.current_listing() {
                return Ok(current);
            }
            let in_flight =
                in_flight.get_or_insert_with(|| Box::new(self.spawn_listing(node.clone())));
            InFlight::clone(in_flight)
        };
        let started = Instant::now();
        loop {
            let due = progress.last_advance().max(started) + patience;
            if due <= Instant::now() {
                return Err(FsError::TimedOut {
                    key: format!("the listing of {} (no entries for that long)", dir.prefix),
                    after: patience,
                });
            }
            if let Ok(listing) = tokio::time::timeout_at(due, &mut task).await {
                return listing;
            }
        }
    }

    /// Starts listing the directory `node` in a task, bounded by `listing_timeout`:
    /// its result becomes the directory's listing, and its end (a failure or a panic
    /// too) clears [`DirNode::in_flight`], so that a failed listing is tried again by
    /// the next caller rather than kept.
    fn spawn_listing(self: &Arc<Self>, node: Arc<Node>) -> InFlight {
        let tree = self.clone();
        let progress = ListingProgress::new();
        let watch = progress.clone();
        let task = tokio::spawn(async move {
            let NodeKind::Dir(dir) = &node.kind else {
                unreachable!("only a directory is listed");
            };
            let listing = AssertUnwindSafe(tokio::time::timeout(
                tree.listing_timeout,
                watch.watching(tree.list_directory(node.ino, dir)),
            ))
            .catch_unwind()
            .await;
            let listing = match listing {
                Ok(Ok(listing)) => listing.map(Arc::new),
                Ok(Err(_)) => Err(FsError::TimedOut {
                    key: format!("the listing of {}", dir.prefix),
                    after: tree.listing_timeout,
                }),
                Err(panic) => Err(FsError::of_panic(panic)),
            };
            if let Err(error) = &listing {
                tracing::warn!(directory = %dir.prefix, %error, "cannot list the directory; the next lookup lists it again");
            }
            let mut in_flight = dir.in_flight.lock();
            if let Ok(listing) = &listing {
                *dir.listing.lock() = Some(listing.clone());
            }
            *in_flight = None;
            listing
        });
        let task = async move {
            task.await.unwrap_or_else(|error| {
                Err(FsError::Panicked {
                    message: error.to_string(),
                })
            })
        }
        .boxed()
        .shared();
        InFlight { task, progress }
    }

    /// The directory's listing made from the store's listing of it now: a failure
    /// keeps a previous listing for another `--metadata-ttl`.
    async fn list_directory(&self, ino: u64, dir: &DirNode) -> FsResult<Listing> {
        let previous = dir.listing.lock().clone();
        match (self.list_store(dir).await, previous) {
            (Ok(entries), previous) => {
                if previous.is_some() {
                    Metrics::add(&self.metrics.listings_refreshed, 1);
                }
                Ok(self.adopt(ino, entries, previous.as_deref()))
            }
            (Err(error), Some(previous)) => {
                tracing::warn!(directory = %dir.prefix, %error, "cannot list the directory again; keeping its listing for another --metadata-ttl");
                Ok(Listing {
                    entries: previous.entries.clone(),
                    expires: self.expiry(),
                })
            }
            (Err(error), None) => Err(error),
        }
    }

    /// Gives inodes to a directory's entries: an entry still the same as in the
    /// `previous` listing keeps its inode, any other gets a new one.
    fn adopt(
        &self,
        parent: u64,
        mut entries: Vec<(String, Pending)>,
        previous: Option<&Listing>,
    ) -> Listing {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        let mut nodes = self.nodes.write();
        let mut listing = Listing {
            entries: Vec::with_capacity(entries.len()),
            expires: self.expiry(),
        };
        for (name, pending) in entries {
            let kept = previous
                .and_then(|p| p.get(&name))
                .filter(|&ino| pending.is_same_as(&nodes[ino as usize - 1]));
            let ino = kept.unwrap_or_else(|| {
                let ino = nodes.len() as u64 + 1;
                let kind = match pending {
                    Pending::Dir(prefix, mode, prelisted) => {
                        NodeKind::Dir(DirNode::new(prefix, mode, prelisted))
                    }
                    Pending::File(file) => NodeKind::File(file),
                };
                nodes.push(Arc::new(Node { ino, parent, kind }));
                ino
            });
            listing.entries.push((name, ino));
        }
        listing
    }

    /// The directory's entries as the store lists them now (or as it listed them
    /// before the directory's first use, while that listing is current).
    async fn list_store(&self, dir: &DirNode) -> FsResult<Vec<(String, Pending)>> {
        let (prefix, mode) = (&dir.prefix, dir.mode);
        let prelisted = dir.prelisted.lock().take().map(|prelisted| *prelisted);
        let (listed, manifest) = match prelisted.filter(|p| self.is_current(p.at)) {
            Some(prelisted) => (prelisted, Manifested::IfShown),
            None => match self.opener.list_level(dir).await? {
                (listed, Some(opened)) => (listed, Manifested::Read(Box::new(opened))),
                (listed, None) => (listed, Manifested::No),
            },
        };
        let listed_entries = listed.objects.len() + listed.common_prefixes.len();
        if listed_entries > MAX_LISTED_ENTRIES {
            return Err(too_long_a_listing(prefix));
        }
        let mut entries = Vec::new();
        let mut header = None;
        let mut objects = HashMap::new();
        for meta in &listed.objects {
            let Some(name) = meta.location.filename().filter(|n| !n.is_empty()) else {
                continue;
            };
            let info = self.registry.register(meta);
            if name == HEADER_FILE {
                header = Some(info.clone());
            }
            objects.insert(name, info.clone());
            entries.push((name.to_owned(), file_of_object(info)));
        }
        let dirs = |entries: &mut Vec<(String, Pending)>, flat: bool| {
            for dir in &listed.common_prefixes {
                // A flat view shows no chunk directory: no entry is made for them (an
                // atlas has 24,415).
                let name = dir
                    .filename()
                    .filter(|name| !(flat && parse_chunk_dir_name(name).is_some()));
                if let Some(name) = name {
                    entries.push((name.to_owned(), Pending::Dir(dir.clone(), mode, None)));
                }
            }
        };
        let Some(header) = header else {
            dirs(&mut entries, false);
            return Ok(entries);
        };
        let has_chunk_dirs = listed
            .common_prefixes
            .iter()
            .any(|dir| dir.filename().and_then(parse_chunk_dir_name).is_some());
        let (dataset, header_bytes) = self
            .datasets
            .dataset_at(prefix, &header, &objects, has_chunk_dirs, manifest)
            .await;
        if let Some(bytes) = header_bytes {
            let header_entry = entries.iter_mut().find(|(name, _)| name == HEADER_FILE);
            let (_, entry) = header_entry.expect("the header was found among the entries");
            *entry = Pending::File(FileNode {
                size: header.size,
                mtime: header.mtime,
                content: FileContent::Bytes(bytes),
            });
        }
        let flat = matches!(
            (&dataset, mode),
            (Some(Dataset::Chunked(_)), DirMode::Discover)
        );
        dirs(&mut entries, flat);
        Ok(match (dataset, mode) {
            (Some(Dataset::Chunked(dataset)), DirMode::Discover) => {
                flat_entries(prefix, dataset, entries, listed)
            }
            (Some(dataset), _) => {
                entries.push((HINT_FILE.to_owned(), hint_file(dataset)));
                entries
            }
            (None, _) => entries,
        })
    }
}

/// How many operation deadlines (`--read-timeout`) a directory's listing, its
/// dataset's discovery included, may run, whoever waits for it: a deadline ends only a
/// caller's wait, this ends the listing, so that a store that pages without end (each
/// page quick) is not asked for pages for the rest of the mount. With the default
/// 15 s, two minutes: a dataset of 10,000 chunks (30 pages of 1,000 objects) from a
/// store that answers a page in 3 s takes 90 s.
pub const LISTING_DEADLINES: u32 = 8;

/// The most entries one listing may hold (the store layer stops reading pages past it,
/// where the store pages).
pub use crate::store::paged_listings::MAX_LISTED_ENTRIES;

/// The error of a listing of more than [`MAX_LISTED_ENTRIES`] entries, logged.
/// Whether what was listed or checked at `checked` still stands under `metadata_ttl`.
fn is_current(metadata_ttl: Option<Duration>, checked: Instant) -> bool {
    metadata_ttl.is_none_or(|ttl| checked.elapsed() < ttl)
}

fn too_long_a_listing(prefix: &ObjectPath) -> FsError {
    tracing::error!(directory = %prefix, "the store lists more than {MAX_LISTED_ENTRIES} entries under this prefix; refusing the listing");
    FsError::ListingTooLong {
        prefix: prefix.to_string(),
        limit: MAX_LISTED_ENTRIES,
    }
}

fn non_empty(prefix: &ObjectPath) -> Option<&ObjectPath> {
    (!prefix.as_ref().is_empty()).then_some(prefix)
}

fn file_of_object(info: Arc<ObjectInfo>) -> Pending {
    Pending::File(FileNode {
        size: info.size,
        mtime: info.mtime,
        content: FileContent::Object(info),
    })
}

fn hint_file(dataset: Dataset) -> Pending {
    let nothing_held = Announcement::new(dataset.geometry().chunk_size, []);
    let announced = Bytes::from(nothing_held.to_string());
    Pending::File(FileNode {
        size: announced.len() as u64,
        mtime: dataset.mtime(),
        content: FileContent::Hints(dataset, announced),
    })
}
