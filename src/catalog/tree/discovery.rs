//! Discovery of a dataset in a directory with a `header.sch`: its header read, a
//! chunked dataset's chunk objects listed (or a monolithic dataset's arrays found), and
//! the versions it read kept, so that any change is found as a new dataset.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use parking_lot::Mutex;
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::manifest::MANIFEST_FILE;
use scdl_format::{ArrayKind, Backend, Header};
use tokio::time::Instant;

use super::manifest::{mtime_of, object_key, DatasetObjects, ManifestOpener, Opened};
use super::{is_current, non_empty, too_long_a_listing, MAX_LISTED_ENTRIES};
use crate::catalog::chunked::{ChunkDirs, FlatDataset};
use crate::catalog::dataset::Dataset;
use crate::catalog::monolithic::{MonolithicDataset, DEFAULT_VIRTUAL_CHUNK_ROWS};
use crate::catalog::objects::ObjectRegistry;
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::{canonical_etag, pinned_get, ObjectInfo};
use crate::parts::ObjectId;
use crate::store::listing_progress::ListingProgress;

/// A directory with a `header.sch`, as last discovered.
pub(super) struct KnownDataset {
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

/// Whether a dataset's directory has a manifest ([`super::manifest`]), which then says
/// what its objects are instead of a recursive listing.
pub(super) enum Manifested {
    /// Read with the directory's listing.
    Read(Box<Opened>),
    /// Not read yet: read if the listing (made before) shows one and the dataset is
    /// to be discovered or checked.
    IfShown,
    No,
}

/// What discovering a dataset found, and from what.
struct Discovery {
    dataset: Option<Dataset>,
    /// Whether its header is chunked.
    chunked: bool,
    /// A chunked dataset's objects, if they could be listed.
    chunk_objects: Option<ChunkDirs>,
    /// The header as read, if it could be.
    header_bytes: Option<Bytes>,
}

/// The object versions a dataset's discovery read: its header first, then a chunked
/// dataset's objects in chunk directories (`chunk_objects`), or else the arrays among
/// the directory's `objects` (a monolithic dataset's).
fn sources_of(
    header: &ObjectInfo,
    objects: &HashMap<&str, Arc<ObjectInfo>>,
    chunk_objects: Option<&ChunkDirs>,
) -> Vec<ObjectId> {
    let mut ids: Vec<ObjectId> = match chunk_objects {
        Some(listed) => listed.ids().collect(),
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

/// The datasets found, by prefix, each discovered on first use and compared with the
/// store again once `metadata_ttl` has passed.
pub(super) struct Datasets {
    store: Arc<dyn ObjectStore>,
    registry: Arc<ObjectRegistry>,
    metrics: Arc<Metrics>,
    metadata_ttl: Option<Duration>,
    /// Reads a manifest the directory shows.
    opener: ManifestOpener,
    /// Datasets by prefix, so the flat view and `.chunked/` share one dataset (one
    /// set of plans and checks). Each has its own lock, held while it is discovered or
    /// checked against the store, so both views get the same one.
    by_prefix: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<KnownDataset>>>>>,
}

impl Datasets {
    pub(super) fn new(
        store: Arc<dyn ObjectStore>,
        registry: Arc<ObjectRegistry>,
        metrics: Arc<Metrics>,
        metadata_ttl: Option<Duration>,
        opener: ManifestOpener,
    ) -> Datasets {
        Datasets {
            store,
            registry,
            metrics,
            metadata_ttl,
            opener,
            by_prefix: Mutex::new(HashMap::new()),
        }
    }

    /// The dataset at `prefix`, whose directory lists `header` and `objects` (by name)
    /// and chunk directories if `has_chunk_dirs`, and the header's bytes if discovery
    /// could read them: discovered on first use and kept; with `--metadata-ttl`,
    /// compared with the store once the TTL has passed, and discovered anew if an
    /// object it read changed.
    pub(super) async fn dataset_at(
        &self,
        prefix: &ObjectPath,
        header: &Arc<ObjectInfo>,
        objects: &HashMap<&str, Arc<ObjectInfo>>,
        has_chunk_dirs: bool,
        manifest: Manifested,
    ) -> (Option<Dataset>, Option<Bytes>) {
        let slot = self
            .by_prefix
            .lock()
            .entry(prefix.as_ref().to_owned())
            .or_default()
            .clone();
        let mut known = slot.lock().await;
        if let Some(known) = known.as_ref() {
            if is_current(self.metadata_ttl, known.checked) {
                return known.found(header);
            }
        }
        let opened = match manifest {
            Manifested::Read(opened) => Some(*opened),
            Manifested::IfShown if objects.contains_key(MANIFEST_FILE) => {
                self.opener.open_manifest(prefix).await
            }
            Manifested::IfShown | Manifested::No => None,
        };
        // The header's bytes as the manifest's reading read them, if of this version.
        let (manifest_objects, header_bytes) = match opened {
            Some(opened) => {
                let bytes = opened.header_bytes_of(header);
                let objects =
                    (opened.objects).map(|objects| self.chunk_objects_of(prefix, objects));
                (Some(objects), bytes)
            }
            None => (None, None),
        };
        let mut chunk_objects = None;
        if let Some(known) = known.as_mut() {
            let same_header = known.read(header);
            if same_header && known.chunked {
                let listed = match &manifest_objects {
                    Some(Ok(objects)) => Ok(objects.clone()),
                    Some(Err(_)) | None => self.list_chunk_objects(prefix).await,
                };
                match listed {
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
            .discover_dataset(
                prefix,
                header,
                objects,
                chunk_objects.map(Ok).or(manifest_objects),
                header_bytes,
                has_chunk_dirs,
            )
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

    /// The objects under a chunked dataset's prefix, by chunk.
    async fn list_chunk_objects(&self, prefix: &ObjectPath) -> FsResult<ChunkDirs> {
        let mut pages = self.store.list(non_empty(prefix));
        let mut listed = Vec::new();
        while let Some(meta) = pages
            .try_next()
            .await
            .map_err(|e| FsError::store(prefix.as_ref(), &e))?
        {
            if listed.len() == MAX_LISTED_ENTRIES {
                return Err(too_long_a_listing(prefix));
            }
            ListingProgress::advanced();
            listed.push(meta);
        }
        Ok(self.chunk_objects_of(prefix, DatasetObjects::Listed(listed)))
    }

    /// The `objects` under `prefix` (listed, or named by its manifest), registered, by
    /// chunk. Each object's key is made once, the one the catalog keeps; a listing's
    /// entries are dropped as they are registered, and a manifest's are read from its
    /// bytes, which go once all are registered.
    fn chunk_objects_of(&self, prefix: &ObjectPath, objects: DatasetObjects) -> ChunkDirs {
        let count = match &objects {
            DatasetObjects::Listed(listed) => listed.len(),
            DatasetObjects::Manifest(manifest) => manifest.len,
        };
        let mut chunks = ChunkDirs::with_capacity(count);
        match objects {
            DatasetObjects::Listed(listed) => {
                for meta in listed {
                    let Some(relative) = relative_key(prefix, &meta.location) else {
                        continue;
                    };
                    let relative = relative.to_owned();
                    let etag = meta.e_tag.as_deref().map(canonical_etag);
                    let mtime = meta.last_modified.into();
                    let info =
                        (self.registry).register_version(meta.location, meta.size, etag, mtime);
                    chunks.insert(&relative, info);
                }
            }
            DatasetObjects::Manifest(manifest) => {
                for object in manifest.objects() {
                    let key = object_key(prefix, object.key);
                    let etag = object.etag.map(canonical_etag);
                    let info =
                        (self.registry).register_version(key, object.size, etag, mtime_of(&object));
                    chunks.insert(object.key, info);
                }
            }
        }
        chunks
    }

    /// The dataset at `prefix`: a flat dataset if its header is chunked and its objects
    /// agree with it (`chunk_objects`, listed here unless given, or why they could not
    /// be; the header read here unless `header_bytes` are given), a monolithic one if
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
        chunk_objects: Option<FsResult<ChunkDirs>>,
        header_bytes: Option<Bytes>,
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
        let read_header = async {
            match header_bytes {
                Some(bytes) => Ok(bytes),
                None => self.read_small_object(header).await,
            }
        };
        let (read, listed_early) = match chunk_objects {
            Some(listed) => (read_header.await, Some(listed)),
            None if has_chunk_dirs => {
                let (read, listed) = tokio::join!(read_header, self.list_chunk_objects(prefix));
                (read, Some(listed))
            }
            None => (read_header.await, None),
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

    /// A whole small object (a header), at its pinned version: asked for as the range
    /// of its listed size, and no more than that taken from the answer, whatever the
    /// store sends. The caller bounds the size ([`MAX_HEADER_BYTES`]).
    async fn read_small_object(&self, info: &ObjectInfo) -> FsResult<Bytes> {
        if info.size == 0 {
            // No range can be asked for; the header decoder refuses it.
            return Ok(Bytes::new());
        }
        let result = pinned_get(self.store.as_ref(), info, Some(0..info.size)).await?;
        let mut body = result.into_stream();
        let mut bytes = BytesMut::with_capacity(info.size as usize);
        while let Some(piece) = body
            .try_next()
            .await
            .map_err(|e| FsError::store(info.key.as_ref(), &e))?
        {
            if (bytes.len() + piece.len()) as u64 > info.size {
                return Err(FsError::ShortRead {
                    key: info.key.to_string(),
                    expected: info.size,
                    got: (bytes.len() + piece.len()) as u64,
                });
            }
            bytes.extend_from_slice(&piece);
        }
        if bytes.len() as u64 != info.size {
            return Err(FsError::ShortRead {
                key: info.key.to_string(),
                expected: info.size,
                got: bytes.len() as u64,
            });
        }
        Ok(bytes.freeze())
    }
}

/// The part of `key` under `prefix` (`chunk_00003/data.npy` of `ds/chunk_00003/data.npy`
/// under `ds`), if it lies under it.
fn relative_key<'k>(prefix: &ObjectPath, key: &'k ObjectPath) -> Option<&'k str> {
    match prefix.as_ref() {
        "" => Some(key.as_ref()),
        prefix => key.as_ref().strip_prefix(prefix)?.strip_prefix('/'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_relative_to_a_prefix_it_lies_under() {
        let key = ObjectPath::from("a/ds/chunk_00001/data.npy");
        let relative = |prefix: &str| relative_key(&ObjectPath::from(prefix), &key);
        assert_eq!(relative("a/ds"), Some("chunk_00001/data.npy"));
        assert_eq!(relative(""), Some("a/ds/chunk_00001/data.npy"));
        assert_eq!(relative("a/d"), None);
        assert_eq!(relative("b"), None);
    }
}
