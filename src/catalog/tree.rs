//! The inode tree. Directories are listed on first use, with one delimited listing of
//! their prefix. Without `--metadata-ttl` the listing is kept for the life of the mount
//! (dataset objects are immutable); with it, the first lookup or readdir after the
//! listing's age passed the TTL lists the store again (in a task, like the first
//! listing), and concurrent callers share that one listing. A failed relisting keeps
//! the listing it had, for another TTL.
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectMeta, ObjectStore};
use parking_lot::{Mutex, RwLock};
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::hint::{Announcement, HINT_FILE};
use scdl_format::layout::{parse_chunk_dir_name, CHUNKED_DIR, HEADER_FILE};
use scdl_format::{ArrayKind, Backend, Header};
use tokio::time::Instant;

use super::dataset::FlatDataset;
use super::monolithic::{Dataset, MonolithicDataset, DEFAULT_VIRTUAL_CHUNK_ROWS};
use super::objects::ObjectRegistry;
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::{pinned_get, ObjectInfo};
use crate::parts::ObjectId;

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
    prefix: ObjectPath,
    mode: DirMode,
    /// A listing of the directory's prefix made before its first use, taken as its
    /// first listing while current instead of asking the store again.
    prelisted: Mutex<Option<Prelisted>>,
    /// The current listing, once made.
    listing: Mutex<Option<Arc<Listing>>>,
    /// Held while the store is listed, so that concurrent callers share one listing.
    listing_store: tokio::sync::Mutex<()>,
}

/// The store's delimited listing of a prefix, and when it was made. The mount's check
/// that the store answers lists the root; a chunked dataset's listing is also that of
/// its raw view, `.chunked/`, which shows the same prefix.
#[derive(Clone)]
struct Prelisted {
    at: Instant,
    common_prefixes: Vec<ObjectPath>,
    objects: Vec<ObjectMeta>,
}

impl Prelisted {
    /// A listing made just now.
    fn now(listed: ListResult) -> Prelisted {
        Prelisted {
            at: Instant::now(),
            common_prefixes: listed.common_prefixes,
            objects: listed.objects,
        }
    }
}

impl DirNode {
    fn new(prefix: ObjectPath, mode: DirMode, prelisted: Option<Prelisted>) -> DirNode {
        DirNode {
            prefix,
            mode,
            prelisted: Mutex::new(prelisted),
            listing: Mutex::new(None),
            listing_store: tokio::sync::Mutex::new(()),
        }
    }

    /// The listing, if it was made and has not expired.
    fn current_listing(&self) -> Option<Arc<Listing>> {
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

/// A listed directory: entry names in sorted order, with their inodes.
pub struct Listing {
    pub entries: Vec<(String, u64)>,
    by_name: HashMap<String, u64>,
    /// When the store is to be listed again; `None`: never (no `--metadata-ttl`).
    expires: Option<Instant>,
}

impl Listing {
    pub fn get(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).copied()
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

pub struct Tree {
    store: Arc<dyn ObjectStore>,
    registry: ObjectRegistry,
    /// Datasets by prefix, so the flat view and `.chunked/` share one dataset (one
    /// set of plans and checks). Each has its own lock, held while it is discovered or
    /// checked against the store, so both views get the same one.
    datasets: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<KnownDataset>>>>>,
    nodes: RwLock<Vec<Arc<Node>>>,
    mount_time: SystemTime,
    /// How long a listing stands before the store is listed again (`None`: forever).
    metadata_ttl: Option<Duration>,
    metrics: Arc<Metrics>,
}

/// A directory with a `header.sch`, as last discovered.
struct KnownDataset {
    /// `None` for a directory found not to be a dataset (shown as stored).
    dataset: Option<Dataset>,
    /// The versions of the objects its discovery read: any change is a new dataset.
    sources: Vec<ObjectId>,
    /// Whether the header was chunked: its chunks are found by a recursive listing.
    chunked: bool,
    /// The header's bytes as discovery read them (the version `sources` starts with),
    /// served to readers of the stored `header.sch` without another request.
    header_bytes: Option<Bytes>,
    /// When it was last compared with the store.
    checked: Instant,
}

impl KnownDataset {
    /// The dataset, and its header's bytes if `header` is the version they are of (a
    /// listing newer than the last check may show another).
    fn found(&self, header: &ObjectInfo) -> (Option<Dataset>, Option<Bytes>) {
        let bytes = self.header_bytes.clone().filter(|_| self.read(header));
        (self.dataset.clone(), bytes)
    }

    /// Whether discovery read this version of the header.
    fn read(&self, header: &ObjectInfo) -> bool {
        self.sources.first() == Some(&header.id)
    }
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

/// A chunked dataset's objects, by key relative to its prefix.
type ChunkObjects = HashMap<String, Arc<ObjectInfo>>;

/// What discovering a dataset found, and from what.
struct Discovery {
    dataset: Option<Dataset>,
    /// Whether its header is chunked.
    chunked: bool,
    /// A chunked dataset's objects, if they could be listed.
    chunk_objects: Option<ChunkObjects>,
    /// The header as read, if it could be.
    header_bytes: Option<Bytes>,
}

/// The object versions a dataset's discovery read: its header first, then a chunked
/// dataset's objects in chunk directories (`chunk_objects`), or else the arrays among
/// the directory's `objects` (a monolithic dataset's).
fn sources_of(
    header: &ObjectInfo,
    objects: &HashMap<&str, Arc<ObjectInfo>>,
    chunk_objects: Option<&ChunkObjects>,
) -> Vec<ObjectId> {
    let mut ids: Vec<ObjectId> = match chunk_objects {
        Some(listed) => listed
            .iter()
            .filter(|(key, _)| {
                key.split('/')
                    .next()
                    .and_then(parse_chunk_dir_name)
                    .is_some()
            })
            .map(|(_, object)| object.id)
            .collect(),
        None => ArrayKind::ALL
            .iter()
            .filter_map(|kind| objects.get(kind.file_name()))
            .map(|object| object.id)
            .collect(),
    };
    ids.sort_unstable();
    ids.insert(0, header.id);
    ids
}

impl Tree {
    /// The tree of `store` under `root`; `metadata_ttl`: how long a listing stands
    /// (`None`: for the mount's life); `root_listing`: the store's delimited listing of
    /// `root` if one was just made, which the root's first use then takes.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        root: ObjectPath,
        mode: DirMode,
        registry: ObjectRegistry,
        metadata_ttl: Option<Duration>,
        metrics: Arc<Metrics>,
        root_listing: Option<ListResult>,
    ) -> Tree {
        let root = Arc::new(Node {
            ino: fuser::INodeNo::ROOT.0,
            parent: fuser::INodeNo::ROOT.0,
            kind: NodeKind::Dir(DirNode::new(root, mode, root_listing.map(Prelisted::now))),
        });
        Tree {
            store,
            registry,
            datasets: Mutex::new(HashMap::new()),
            nodes: RwLock::new(vec![root]),
            mount_time: SystemTime::now(),
            metadata_ttl,
            metrics,
        }
    }

    /// When what is listed now is to be listed again.
    fn expiry(&self) -> Option<Instant> {
        self.metadata_ttl.map(|ttl| Instant::now() + ttl)
    }

    fn is_current(&self, checked: Instant) -> bool {
        self.metadata_ttl.is_none_or(|ttl| checked.elapsed() < ttl)
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
    /// `--metadata-ttl` has passed.
    pub async fn listing(&self, ino: u64) -> FsResult<Arc<Listing>> {
        let node = self.node(ino)?;
        let NodeKind::Dir(dir) = &node.kind else {
            return Err(FsError::NotADirectory);
        };
        if let Some(current) = dir.current_listing() {
            return Ok(current);
        }
        let _listing_store = dir.listing_store.lock().await;
        // Made meanwhile by the caller that held the lock.
        if let Some(current) = dir.current_listing() {
            return Ok(current);
        }
        let previous = dir.listing.lock().clone();
        let listing = match (self.list_store(dir).await, previous) {
            (Ok(entries), previous) => {
                if previous.is_some() {
                    Metrics::add(&self.metrics.listings_refreshed, 1);
                }
                self.adopt(ino, entries, previous.as_deref())
            }
            (Err(error), Some(previous)) => {
                tracing::warn!(directory = %dir.prefix, %error, "cannot list the directory again; keeping its listing for another --metadata-ttl");
                Listing {
                    entries: previous.entries.clone(),
                    by_name: previous.by_name.clone(),
                    expires: self.expiry(),
                }
            }
            (Err(error), None) => return Err(error),
        };
        let listing = Arc::new(listing);
        *dir.listing.lock() = Some(listing.clone());
        Ok(listing)
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
            by_name: HashMap::with_capacity(entries.len()),
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
            listing.by_name.insert(name.clone(), ino);
            listing.entries.push((name, ino));
        }
        listing
    }

    /// The directory's entries as the store lists them now (or as it listed them
    /// before the directory's first use, while that listing is current).
    async fn list_store(&self, dir: &DirNode) -> FsResult<Vec<(String, Pending)>> {
        let (prefix, mode) = (&dir.prefix, dir.mode);
        let prelisted = dir.prelisted.lock().take();
        let listed = match prelisted.filter(|p| self.is_current(p.at)) {
            Some(prelisted) => prelisted,
            None => Prelisted::now(
                self.store
                    .list_with_delimiter(non_empty(prefix))
                    .await
                    .map_err(|e| FsError::store(prefix.as_ref(), &e))?,
            ),
        };
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
        for dir in &listed.common_prefixes {
            if let Some(name) = dir.filename() {
                entries.push((name.to_owned(), Pending::Dir(dir.clone(), mode, None)));
            }
        }
        let Some(header) = header else {
            return Ok(entries);
        };
        let has_chunk_dirs = listed
            .common_prefixes
            .iter()
            .any(|dir| dir.filename().and_then(parse_chunk_dir_name).is_some());
        let (dataset, header_bytes) = self
            .dataset_at(prefix, &header, &objects, has_chunk_dirs)
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
        Ok(match (dataset, mode) {
            (Some(Dataset::Chunked(dataset)), DirMode::Discover) => {
                flat_entries(prefix, dataset, entries, listed.clone())
            }
            (Some(dataset), _) => {
                entries.push((HINT_FILE.to_owned(), hint_file(dataset)));
                entries
            }
            (None, _) => entries,
        })
    }

    /// The dataset at `prefix`, whose directory lists `header` and `objects` (by name)
    /// and chunk directories if `has_chunk_dirs`, and the header's bytes if discovery
    /// could read them: discovered on first use and kept; with `--metadata-ttl`,
    /// compared with the store once the TTL has passed, and discovered anew if an
    /// object it read changed.
    async fn dataset_at(
        &self,
        prefix: &ObjectPath,
        header: &Arc<ObjectInfo>,
        objects: &HashMap<&str, Arc<ObjectInfo>>,
        has_chunk_dirs: bool,
    ) -> (Option<Dataset>, Option<Bytes>) {
        let slot = self
            .datasets
            .lock()
            .entry(prefix.as_ref().to_owned())
            .or_default()
            .clone();
        let mut known = slot.lock().await;
        let mut chunk_objects = None;
        if let Some(known) = known.as_mut() {
            if self.is_current(known.checked) {
                return known.found(header);
            }
            let same_header = known.read(header);
            if same_header && known.chunked {
                match self.list_chunk_objects(prefix).await {
                    Ok(listed) => chunk_objects = Some(listed),
                    Err(error) => {
                        tracing::warn!(dataset = %prefix, %error, "cannot list the dataset again; keeping it as it was for another --metadata-ttl");
                        known.checked = Instant::now();
                        return known.found(header);
                    }
                }
            }
            if same_header && sources_of(header, objects, chunk_objects.as_ref()) == known.sources {
                known.checked = Instant::now();
                return known.found(header);
            }
            Metrics::add(&self.metrics.datasets_rediscovered, 1);
            tracing::info!(dataset = %prefix, "the dataset changed in the store: discovered again; files opened before keep the old one");
        }
        let discovery = self
            .discover_dataset(prefix, header, objects, chunk_objects, has_chunk_dirs)
            .await;
        let found = KnownDataset {
            sources: sources_of(header, objects, discovery.chunk_objects.as_ref()),
            dataset: discovery.dataset,
            chunked: discovery.chunked,
            header_bytes: discovery.header_bytes,
            checked: Instant::now(),
        };
        known.insert(found).found(header)
    }

    /// The objects under a chunked dataset's prefix, by key relative to it.
    async fn list_chunk_objects(&self, prefix: &ObjectPath) -> FsResult<ChunkObjects> {
        let listed: Vec<_> = self
            .store
            .list(non_empty(prefix))
            .try_collect()
            .await
            .map_err(|e| FsError::store(prefix.as_ref(), &e))?;
        Ok(listed
            .iter()
            .filter_map(|meta| {
                let relative = meta.location.prefix_match(prefix)?;
                let relative = relative
                    .map(|p| p.as_ref().to_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                Some((relative, self.registry.register(meta)))
            })
            .collect())
    }

    /// The dataset at `prefix`: a flat dataset if its header is chunked and its objects
    /// agree with it (`chunk_objects`, listed here unless given), a monolithic one if
    /// its header is monolithic and its arrays agree with it (`objects`: the
    /// directory's, by name); otherwise logs why and finds `None`, leaving the
    /// directory as stored, without a hint file. A directory with chunk directories
    /// (`has_chunk_dirs`) is listed while its header is read, not after: the first read
    /// of a chunked dataset waits for one round trip less.
    async fn discover_dataset(
        &self,
        prefix: &ObjectPath,
        header: &Arc<ObjectInfo>,
        objects: &HashMap<&str, Arc<ObjectInfo>>,
        chunk_objects: Option<ChunkObjects>,
        has_chunk_dirs: bool,
    ) -> Discovery {
        let mut discovery = Discovery {
            dataset: None,
            chunked: false,
            chunk_objects: None,
            header_bytes: None,
        };
        if header.size > MAX_HEADER_BYTES {
            tracing::error!(object = %header.key, size = header.size, "larger than any SCDL header ({MAX_HEADER_BYTES} bytes); showing the directory as stored");
            return discovery;
        }
        let (read, listed_early) = match chunk_objects {
            Some(listed) => (self.read_small_object(header).await, Some(Ok(listed))),
            None if has_chunk_dirs => {
                let (read, listed) = tokio::join!(
                    self.read_small_object(header),
                    self.list_chunk_objects(prefix)
                );
                (read, Some(listed))
            }
            None => (self.read_small_object(header).await, None),
        };
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(object = %header.key, %error, "cannot read dataset header; showing the directory as stored");
                return discovery;
            }
        };
        discovery.header_bytes = Some(bytes.clone());
        let decoded = match Header::decode(&bytes) {
            Ok(decoded) => decoded,
            Err(error) => {
                tracing::error!(object = %header.key, %error, "not a valid SCDL header; showing the directory as stored");
                return discovery;
            }
        };
        if decoded.backend == Backend::Monolithic {
            discovery.dataset = self.monolithic_dataset(prefix, &decoded, objects);
            return discovery;
        }
        discovery.chunked = true;
        let listed = match listed_early {
            Some(listed) => listed,
            None => self.list_chunk_objects(prefix).await,
        };
        let chunk_objects = match listed {
            Ok(listed) => discovery.chunk_objects.insert(listed),
            Err(error) => {
                tracing::error!(dataset = %prefix, %error, "cannot list the chunked dataset; showing it as stored");
                return discovery;
            }
        };
        discovery.dataset = match FlatDataset::validate(
            prefix.clone(),
            decoded,
            header.mtime,
            chunk_objects,
        ) {
            Ok(dataset) => {
                tracing::info!(
                    dataset = %prefix,
                    rows = dataset.layout.total_rows(),
                    values = dataset.layout.total_nnz(),
                    chunks = dataset.chunks.len(),
                    "chunked dataset presented as a monolithic archive"
                );
                Some(Dataset::Chunked(Arc::new(dataset)))
            }
            Err(reason) => {
                tracing::error!(dataset = %prefix, %reason, "chunked dataset is inconsistent; showing it as stored, not flat");
                None
            }
        };
        discovery
    }

    fn monolithic_dataset(
        &self,
        prefix: &ObjectPath,
        header: &Header,
        objects: &HashMap<&str, Arc<ObjectInfo>>,
    ) -> Option<Dataset> {
        match MonolithicDataset::validate(
            prefix.clone(),
            header,
            objects,
            DEFAULT_VIRTUAL_CHUNK_ROWS,
        ) {
            Ok(dataset) => {
                tracing::info!(
                    dataset = %prefix,
                    rows = dataset.geometry.total_rows,
                    values = dataset.total_nnz,
                    virtual_chunks = dataset.geometry.num_chunks(),
                    "monolithic dataset: hint file with virtual chunks of {} rows",
                    dataset.geometry.chunk_size
                );
                Some(Dataset::Monolithic(Arc::new(dataset)))
            }
            Err(reason) => {
                tracing::error!(dataset = %prefix, %reason, "monolithic dataset is inconsistent; showing it as stored, without a hint file");
                None
            }
        }
    }

    /// A whole small object (a header), at its pinned version.
    async fn read_small_object(&self, info: &ObjectInfo) -> FsResult<Bytes> {
        let result = pinned_get(self.store.as_ref(), info, None).await?;
        let bytes = result
            .bytes()
            .await
            .map_err(|e| FsError::store(info.key.as_ref(), &e))?;
        if bytes.len() as u64 != info.size {
            return Err(FsError::ShortRead {
                key: info.key.to_string(),
                expected: info.size,
                got: bytes.len() as u64,
            });
        }
        Ok(bytes)
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

/// The flat view of a chunked dataset whose directory lists `raw` entries (`listed`,
/// also the first listing of the raw view, `.chunked/`, which shows the same prefix).
fn flat_entries(
    prefix: &ObjectPath,
    dataset: Arc<FlatDataset>,
    raw: Vec<(String, Pending)>,
    listed: Prelisted,
) -> Vec<(String, Pending)> {
    let virtual_file = |content: FileContent, size: u64| {
        Pending::File(FileNode {
            content,
            size,
            mtime: dataset.mtime,
        })
    };
    let mut entries: Vec<(String, Pending)> = raw
        .into_iter()
        .filter(|(name, _)| {
            name != HEADER_FILE
                && ArrayKind::from_file_name(name).is_none()
                && parse_chunk_dir_name(name).is_none()
        })
        .collect();
    entries.push((
        HEADER_FILE.to_owned(),
        virtual_file(
            FileContent::Bytes(dataset.flat_header.clone()),
            dataset.flat_header.len() as u64,
        ),
    ));
    for kind in ArrayKind::ALL {
        entries.push((
            kind.file_name().to_owned(),
            virtual_file(
                FileContent::FlatArray(dataset.clone(), kind),
                dataset.layout.file_len(kind),
            ),
        ));
    }
    entries.push((
        HINT_FILE.to_owned(),
        hint_file(Dataset::Chunked(dataset.clone())),
    ));
    entries.push((
        CHUNKED_DIR.to_owned(),
        Pending::Dir(prefix.clone(), DirMode::Raw, Some(listed)),
    ));
    entries
}
