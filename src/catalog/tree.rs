//! The inode tree. Directories are listed on first use, with one delimited listing of
//! their prefix, and the listing is kept for the life of the mount (dataset objects are
//! immutable). Inode numbers are handed out as entries are first listed and never
//! reused, so the kernel's view stays consistent.
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
use std::time::SystemTime;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore};
use parking_lot::{Mutex, RwLock};
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::hint::{announcement, HINT_FILE};
use scdl_format::layout::{parse_chunk_dir_name, CHUNKED_DIR, HEADER_FILE};
use scdl_format::{ArrayKind, Backend, Header};

use super::dataset::FlatDataset;
use super::monolithic::{Dataset, MonolithicDataset, DEFAULT_VIRTUAL_CHUNK_ROWS};
use super::objects::{ObjectInfo, ObjectRegistry};
use crate::error::{FsError, FsResult};

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
    /// The dataset's read-ahead hint file; read, it gives the daemon's announcement.
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
    listing: tokio::sync::OnceCell<Arc<Listing>>,
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
#[derive(Default)]
pub struct Listing {
    pub entries: Vec<(String, u64)>,
    by_name: HashMap<String, u64>,
}

impl Listing {
    pub fn get(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).copied()
    }
}

pub struct Tree {
    store: Arc<dyn ObjectStore>,
    registry: ObjectRegistry,
    /// Datasets by prefix, so the flat view and `.chunked/` share one dataset (one
    /// set of plans and checks); `None` for a directory found not to be one.
    datasets: Mutex<HashMap<String, Option<Dataset>>>,
    nodes: RwLock<Vec<Arc<Node>>>,
    mount_time: SystemTime,
}

/// An entry of a directory being built, before it has an inode.
enum Pending {
    Dir(ObjectPath, DirMode),
    File(FileNode),
}

impl Tree {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        root: ObjectPath,
        mode: DirMode,
        registry: ObjectRegistry,
    ) -> Tree {
        let root = Arc::new(Node {
            ino: fuser::INodeNo::ROOT.0,
            parent: fuser::INodeNo::ROOT.0,
            kind: NodeKind::Dir(DirNode {
                prefix: root,
                mode,
                listing: Default::default(),
            }),
        });
        Tree {
            store,
            registry,
            datasets: Mutex::new(HashMap::new()),
            nodes: RwLock::new(vec![root]),
            mount_time: SystemTime::now(),
        }
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

    /// The directory's listing if it was made already: lets the FUSE glue answer
    /// without leaving its thread.
    pub fn cached_listing(&self, ino: u64) -> FsResult<Option<Arc<Listing>>> {
        match &self.node(ino)?.kind {
            NodeKind::Dir(dir) => Ok(dir.listing.get().cloned()),
            NodeKind::File(_) => Err(FsError::NotADirectory),
        }
    }

    /// The directory's listing, listing the store on first use.
    pub async fn listing(&self, ino: u64) -> FsResult<Arc<Listing>> {
        let node = self.node(ino)?;
        let NodeKind::Dir(dir) = &node.kind else {
            return Err(FsError::NotADirectory);
        };
        dir.listing
            .get_or_try_init(|| async {
                let entries = self.list_store(&dir.prefix, dir.mode).await?;
                Ok(Arc::new(self.adopt(ino, entries)))
            })
            .await
            .cloned()
    }

    /// Gives inodes to a directory's entries.
    fn adopt(&self, parent: u64, mut entries: Vec<(String, Pending)>) -> Listing {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        let mut nodes = self.nodes.write();
        let mut listing = Listing::default();
        for (name, pending) in entries {
            let ino = nodes.len() as u64 + 1;
            let kind = match pending {
                Pending::Dir(prefix, mode) => NodeKind::Dir(DirNode {
                    prefix,
                    mode,
                    listing: Default::default(),
                }),
                Pending::File(file) => NodeKind::File(file),
            };
            nodes.push(Arc::new(Node { ino, parent, kind }));
            listing.by_name.insert(name.clone(), ino);
            listing.entries.push((name, ino));
        }
        listing
    }

    async fn list_store(
        &self,
        prefix: &ObjectPath,
        mode: DirMode,
    ) -> FsResult<Vec<(String, Pending)>> {
        let listed = self
            .store
            .list_with_delimiter(non_empty(prefix))
            .await
            .map_err(|e| FsError::store(prefix.as_ref(), &e))?;
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
                entries.push((name.to_owned(), Pending::Dir(dir.clone(), mode)));
            }
        }
        let Some(header) = header else {
            return Ok(entries);
        };
        let known = self.datasets.lock().get(prefix.as_ref()).cloned();
        let dataset = match known {
            Some(dataset) => dataset,
            None => {
                let found = self.discover_dataset(prefix, &header, &objects).await;
                self.datasets
                    .lock()
                    .entry(prefix.as_ref().to_owned())
                    .or_insert(found)
                    .clone()
            }
        };
        Ok(match (dataset, mode) {
            (Some(Dataset::Chunked(dataset)), DirMode::Discover) => {
                flat_entries(prefix, dataset, entries)
            }
            (Some(dataset), _) => {
                entries.push((HINT_FILE.to_owned(), hint_file(dataset)));
                entries
            }
            (None, _) => entries,
        })
    }

    /// The dataset at `prefix`: a flat dataset if its header is chunked and its objects
    /// agree with it, a monolithic one if its header is monolithic and its arrays agree
    /// with it (`objects`: the directory's, by name); otherwise logs why and returns
    /// `None`, leaving the directory as stored, without a hint file.
    async fn discover_dataset(
        &self,
        prefix: &ObjectPath,
        header: &Arc<ObjectInfo>,
        objects: &HashMap<&str, Arc<ObjectInfo>>,
    ) -> Option<Dataset> {
        if header.size > MAX_HEADER_BYTES {
            tracing::error!(object = %header.key, size = header.size, "larger than any SCDL header ({MAX_HEADER_BYTES} bytes); showing the directory as stored");
            return None;
        }
        let bytes = match self.read_small_object(header).await {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(object = %header.key, %error, "cannot read dataset header; showing the directory as stored");
                return None;
            }
        };
        let decoded = match Header::decode(&bytes) {
            Ok(decoded) => decoded,
            Err(error) => {
                tracing::error!(object = %header.key, %error, "not a valid SCDL header; showing the directory as stored");
                return None;
            }
        };
        if decoded.backend == Backend::Monolithic {
            return self.monolithic_dataset(prefix, &decoded, objects);
        }
        let listed: Result<Vec<_>, _> = self.store.list(non_empty(prefix)).try_collect().await;
        let listed = match listed {
            Ok(listed) => listed,
            Err(error) => {
                tracing::error!(dataset = %prefix, %error, "cannot list the chunked dataset; showing it as stored");
                return None;
            }
        };
        let objects: HashMap<String, Arc<ObjectInfo>> = listed
            .iter()
            .filter_map(|meta| {
                let relative = meta.location.prefix_match(prefix)?;
                let relative = relative
                    .map(|p| p.as_ref().to_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                Some((relative, self.registry.register(meta)))
            })
            .collect();
        match FlatDataset::validate(prefix.clone(), decoded, header.mtime, &objects) {
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
        }
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
        let options = GetOptions {
            if_match: info.etag.clone(),
            ..Default::default()
        };
        let result = self
            .store
            .get_opts(&info.key, options)
            .await
            .map_err(|e| FsError::store(info.key.as_ref(), &e))?;
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
    let announced = Bytes::from(announcement(dataset.geometry().chunk_size));
    Pending::File(FileNode {
        size: announced.len() as u64,
        mtime: dataset.mtime(),
        content: FileContent::Hints(dataset, announced),
    })
}

/// The entries of a flat dataset's directory, from its raw entries.
fn flat_entries(
    prefix: &ObjectPath,
    dataset: Arc<FlatDataset>,
    raw: Vec<(String, Pending)>,
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
        Pending::Dir(prefix.clone(), DirMode::Raw),
    ));
    entries
}
