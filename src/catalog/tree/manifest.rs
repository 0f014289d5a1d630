//! A chunked dataset opened without listing its directory: from its manifest
//! ([`scdl_format::manifest`]), one GET of the manifest and one of `header.sch` (both
//! at once), or, without a manifest, from the header and a listing of its objects in
//! key ranges at once ([`super::ranges`]). Listed as any directory, a dataset of 24,415
//! chunks takes 25 delimited pages and then 74 recursive ones, one after the other.
//!
//! A directory that is not listed yet is asked for its manifest and its header while
//! its delimited listing starts ([`ManifestOpener::list_level`]): the first to answer with
//! something usable wins. A directory without a chunked header costs two GETs answered
//! 404 (or a monolithic header's) beside its listing, and no wait; a chunk directory is
//! not asked. A listing made first that shows a manifest has it read too (or, for a
//! listing made before, such as the root's, when its dataset is discovered). A manifest
//! that cannot be read, is not one, or disagrees with the header (its rows, rows per
//! chunk, chunk count), or whose version of the first chunk's row offsets is not the
//! store's (a HEAD beside the two GETs: a manifest of a local folder copied into a
//! bucket lists the folder's ETags), is logged and the dataset is listed in ranges
//! instead. The
//! objects keep the ETags the manifest (or the ranges) list: every GET of them sends
//! `If-Match`, so an object changed since is refused (EIO), never mixed.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::{Path as ObjectPath, PathPart};
use object_store::{GetResult, ObjectMeta, ObjectStore, ObjectStoreExt};
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::layout::{parse_chunk_dir_name, HEADER_FILE};
use scdl_format::manifest::{ManifestBytes, ManifestEntry, MANIFEST_FILE, MAX_MANIFEST_BYTES};
use scdl_format::Header;
use tokio::time::Instant;

use super::nodes::{DirNode, Prelisted};
use super::non_empty;
use super::ranges::RangeLister;
use crate::error::{FsError, FsResult};
use crate::object::{canonical_etag, ObjectInfo};

/// What a manifest says of its directory, checked against the header.
pub(super) struct Opened {
    /// The directory's entries as a listing would show them: its objects (the header
    /// and the manifest with them) and its subdirectories; `None` if the objects could
    /// not be listed.
    pub(super) level: Option<Prelisted>,
    /// Every object of the dataset but the header (and the manifest it was read from),
    /// or why they could not be listed: the dataset is then shown as stored, not listed
    /// again.
    pub(super) objects: FsResult<DatasetObjects>,
    /// The header's bytes, as read, and the version they are of.
    header_bytes: Bytes,
    header_meta: ObjectMeta,
}

/// A dataset's objects as listed, or as its manifest lists them: read from the
/// manifest's bytes as they are registered, never copied out whole (an atlas's manifest
/// of 73,000 objects, copied out into the listing's form, held 17 MB beside its 7).
pub(super) enum DatasetObjects {
    Listed(Vec<ObjectMeta>),
    Manifest(ManifestBytes<Bytes>),
}

impl Opened {
    /// The header's bytes as read with the manifest, if `header` is the version read.
    pub(super) fn header_bytes_of(&self, header: &ObjectInfo) -> Option<Bytes> {
        let meta = &self.header_meta;
        let etag = meta.e_tag.as_deref().map(canonical_etag);
        header
            .is_version(meta.size, etag.as_deref(), meta.last_modified.into())
            .then(|| self.header_bytes.clone())
    }
}

/// Opens a directory's dataset from its manifest, or from its header and its keys
/// listed in ranges, while the directory's delimited listing is made: the store, and
/// the ranges' lister.
#[derive(Clone)]
pub(super) struct ManifestOpener {
    store: Arc<dyn ObjectStore>,
    ranges: RangeLister,
}

impl ManifestOpener {
    pub(super) fn new(store: Arc<dyn ObjectStore>, ranges: RangeLister) -> ManifestOpener {
        ManifestOpener { store, ranges }
    }

    /// The directory's delimited listing, or its dataset opened directly if that
    /// answers first ([`ManifestOpener::open_directly`]), with what was opened.
    pub(super) async fn list_level(&self, dir: &DirNode) -> FsResult<(Prelisted, Option<Opened>)> {
        let prefix = &dir.prefix;
        let listing = async {
            self.store
                .list_with_delimiter(non_empty(prefix))
                .await
                .map(Prelisted::now)
                .map_err(|e| FsError::store(prefix.as_ref(), &e))
        };
        // A chunk directory holds arrays, never a dataset.
        if prefix.filename().and_then(parse_chunk_dir_name).is_some() {
            return Ok((listing.await?, None));
        }
        let probe = self.open_directly(prefix);
        tokio::pin!(listing, probe);
        tokio::select! {
            opened = &mut probe => match opened {
                Some(mut opened) if opened.level.is_some() => {
                    let level = opened.level.take().expect("just seen");
                    Ok((level, Some(opened)))
                }
                opened => Ok((listing.await?, opened)),
            },
            listed = &mut listing => {
                let listed = listed?;
                // The probe is under way: it answers a dataset's directory sooner than
                // a listing of its objects begun now.
                let opened = match shows(&listed, MANIFEST_FILE) || shows(&listed, HEADER_FILE) {
                    true => probe.await,
                    false => None,
                };
                Ok((listed, opened))
            }
        }
    }

    /// The dataset at `prefix` opened without listing its directory, if its header is
    /// a chunked one: from its manifest if it has one that can be used, else from a
    /// listing of its objects in key ranges at once ([`RangeLister::list_in_ranges`]).
    /// `None` for a directory without a header (or with another kind), which is listed.
    async fn open_directly(&self, prefix: &ObjectPath) -> Option<Opened> {
        let header_key = prefix.clone().join(HEADER_FILE);
        let (manifest, header, probe) = tokio::join!(
            self.read_manifest(prefix),
            self.whole(&header_key, MAX_HEADER_BYTES),
            self.probe(prefix)
        );
        let (header_meta, header_bytes) = header.ok()?;
        let chunks = Header::decode(&header_bytes).ok()?.chunked?.num_chunks as u64;
        let header = (header_meta, header_bytes);
        if let Some(manifest) = manifest {
            if let Some(opened) = self.opened_from(prefix, manifest, header.clone(), probe) {
                return Some(opened);
            }
        }
        let (header_meta, header_bytes) = header;
        let objects = self
            .ranges
            .list_in_ranges(prefix, chunks)
            .await
            .map(|mut objects| {
                objects.retain(|meta| meta.location != header_key);
                objects
            });
        let level = (objects.as_ref().ok()).map(|objects| {
            let mut level = Level::new(prefix, [header_meta.clone()]);
            for meta in objects {
                level.add(meta.location.prefix_match(prefix), || meta.clone());
            }
            level.done()
        });
        Some(Opened {
            level,
            objects: objects.map(DatasetObjects::Listed),
            header_bytes,
            header_meta,
        })
    }

    /// The dataset at `prefix` opened from its manifest, read with its header, if both
    /// can be read and agree; `None` (logged unless there is no manifest) otherwise.
    pub(super) async fn open_manifest(&self, prefix: &ObjectPath) -> Option<Opened> {
        let header_key = prefix.clone().join(HEADER_FILE);
        let (manifest, header, probe) = tokio::join!(
            self.read_manifest(prefix),
            self.whole(&header_key, MAX_HEADER_BYTES),
            self.probe(prefix)
        );
        match header {
            Ok(header) => self.opened_from(prefix, manifest?, header, probe),
            Err(error) => {
                let manifest = manifest?;
                tracing::warn!(manifest = %manifest.0.location, %error, "cannot read the header the manifest is of; listing the directory instead");
                None
            }
        }
    }

    /// The manifest at `prefix` as read, with its metadata, if there is one that
    /// decodes; logged if there is one that cannot be read or decoded.
    async fn read_manifest(
        &self,
        prefix: &ObjectPath,
    ) -> Option<(ObjectMeta, ManifestBytes<Bytes>)> {
        let key = prefix.clone().join(MANIFEST_FILE);
        let (meta, bytes) = match self.whole(&key, MAX_MANIFEST_BYTES).await {
            Ok(read) => read,
            Err(FsError::NotFound) => return None,
            Err(error) => {
                tracing::warn!(manifest = %key, %error, "cannot read the manifest; listing the dataset instead");
                return None;
            }
        };
        match ManifestBytes::parse(bytes) {
            Ok(manifest) => Some((meta, manifest)),
            Err(error) => {
                tracing::warn!(manifest = %key, %error, "not using the manifest; listing the dataset instead");
                None
            }
        }
    }

    /// What the store says of the first chunk's row offsets ([`PROBED_OBJECT`]), asked
    /// beside the manifest: `None` if it cannot say.
    async fn probe(&self, prefix: &ObjectPath) -> Option<ObjectMeta> {
        let key = PROBED_OBJECT
            .split('/')
            .fold(prefix.clone(), |path, part| path.join(part));
        self.store.head(&key).await.ok()
    }

    /// The dataset at `prefix` as `manifest` says, if it agrees with `header` and the
    /// store's version of [`PROBED_OBJECT`] is the one the manifest lists (`probe`).
    fn opened_from(
        &self,
        prefix: &ObjectPath,
        (manifest_meta, manifest): (ObjectMeta, ManifestBytes<Bytes>),
        (header_meta, header_bytes): (ObjectMeta, Bytes),
        probe: Option<ObjectMeta>,
    ) -> Option<Opened> {
        let agreement = Header::decode(&header_bytes)
            .map_err(|e| e.to_string())
            .and_then(|header| manifest.agrees_with(&header).map_err(|e| e.to_string()))
            .and_then(|()| same_version(&manifest, probe.as_ref()));
        if let Err(reason) = agreement {
            tracing::warn!(manifest = %manifest_meta.location, %reason, "not using the manifest; listing the dataset instead");
            return None;
        }
        let mut level = Level::new(prefix, [header_meta.clone(), manifest_meta]);
        for object in manifest.objects() {
            let within = object.key.split('/').map(PathPart::from);
            level.add(Some(within), || ObjectMeta {
                location: object_key(prefix, object.key),
                last_modified: mtime_of(&object).into(),
                size: object.size,
                e_tag: object.etag.map(str::to_owned),
                version: None,
            });
        }
        tracing::info!(dataset = %prefix, objects = manifest.len, "opened from its manifest; its objects are not listed");
        Some(Opened {
            level: Some(level.done()),
            objects: Ok(DatasetObjects::Manifest(manifest)),
            header_bytes,
            header_meta,
        })
    }

    /// A whole small object with its metadata as the answer gave it: no more than
    /// `most` bytes, refused unread if it says it is larger; [`FsError::NotFound`] if
    /// there is none.
    async fn whole(&self, key: &ObjectPath, most: u64) -> FsResult<(ObjectMeta, Bytes)> {
        let answer: GetResult =
            self.store
                .get_opts(key, Default::default())
                .await
                .map_err(|e| match e {
                    object_store::Error::NotFound { .. } => FsError::NotFound,
                    other => FsError::store(key.as_ref(), &other),
                })?;
        let meta = answer.meta.clone();
        if meta.size > most {
            return Err(FsError::CorruptData(format!(
                "{key}: {} bytes, more than the {most} it may hold",
                meta.size
            )));
        }
        let mut body = answer.into_stream();
        let mut bytes = BytesMut::with_capacity(meta.size as usize);
        while let Some(piece) = body
            .try_next()
            .await
            .map_err(|e| FsError::store(key.as_ref(), &e))?
        {
            if (bytes.len() + piece.len()) as u64 > meta.size {
                return Err(FsError::ShortRead {
                    key: key.to_string(),
                    expected: meta.size,
                    got: (bytes.len() + piece.len()) as u64,
                });
            }
            bytes.extend_from_slice(&piece);
        }
        if bytes.len() as u64 != meta.size {
            return Err(FsError::ShortRead {
                key: key.to_string(),
                expected: meta.size,
                got: bytes.len() as u64,
            });
        }
        Ok((meta, bytes.freeze()))
    }
}

/// The object whose version the store is asked for beside the manifest.
const PROBED_OBJECT: &str = "chunk_00000/row_ptr.npy";

/// Whether the manifest lists the version of [`PROBED_OBJECT`] the store has: a dataset
/// chunked into a local folder and copied into a bucket has a manifest of the folder's
/// ETags, none of which the bucket's objects carry, and every read of them would be
/// refused as a changed object.
fn same_version(manifest: &ManifestBytes<Bytes>, probe: Option<&ObjectMeta>) -> Result<(), String> {
    let listed = manifest.objects().find(|o| o.key == PROBED_OBJECT);
    match (listed, probe) {
        (Some(listed), Some(stored))
            if listed.size == stored.size
                && listed.etag.map(canonical_etag)
                    == stored.e_tag.as_deref().map(canonical_etag) =>
        {
            Ok(())
        }
        (Some(_), Some(_)) => Err(format!(
            "the store's {PROBED_OBJECT} is not the version it lists (copied from another store, or rewritten since)"
        )),
        _ => Err(format!("cannot compare {PROBED_OBJECT} with the store's")),
    }
}

/// Whether a listing shows an object named `name`.
fn shows(listed: &Prelisted, name: &str) -> bool {
    listed
        .objects
        .iter()
        .any(|meta| meta.location.filename() == Some(name))
}

/// The key of a manifest's object at `relative` under `prefix`: each part of it a
/// part of the key, as [`ObjectPath::join`] makes it. A part of plain characters
/// is as written, which a key of the chunked layout is made of, so the key is
/// written out in one allocation, the one the catalog keeps.
pub(super) fn object_key(prefix: &ObjectPath, relative: &str) -> ObjectPath {
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    if relative.split('/').all(plain) {
        let key = match prefix.as_ref() {
            "" => relative.to_owned(),
            prefix => format!("{prefix}/{relative}"),
        };
        if let Ok(key) = ObjectPath::parse(key) {
            return key;
        }
    }
    (relative.split('/')).fold(prefix.clone(), |path, part| path.join(part))
}

/// When a manifest says its object was last modified.
pub(super) fn mtime_of(object: &ManifestEntry<'_>) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_nanos(object.mtime_ns)
}

/// The directory `prefix` as a delimited listing shows it, made from the keys under
/// it: the objects directly in it, and one subdirectory for each first part of a
/// deeper key, in key order.
struct Level<'a> {
    prefix: &'a ObjectPath,
    level: Prelisted,
}

impl<'a> Level<'a> {
    /// Holding `more` objects (the header and the manifest) to begin with.
    fn new<const N: usize>(prefix: &'a ObjectPath, more: [ObjectMeta; N]) -> Level<'a> {
        Level {
            prefix,
            level: Prelisted {
                at: Instant::now(),
                common_prefixes: Vec::new(),
                objects: more.into(),
            },
        }
    }

    /// Adds the object whose key has the parts `within` the prefix (`None`: not under
    /// it): the object itself (`meta`) if it lies directly in the directory, else the
    /// subdirectory of its first part, unless that was the last one added (keys come in
    /// order, so a subdirectory's keys come together: no name is made for each key).
    fn add<'p>(
        &mut self,
        within: Option<impl Iterator<Item = PathPart<'p>>>,
        meta: impl FnOnce() -> ObjectMeta,
    ) {
        let Some(mut parts) = within else {
            return;
        };
        let first = parts.next();
        match (first, parts.next()) {
            (Some(_), None) => self.level.objects.push(meta()),
            (Some(dir), Some(_)) => {
                let last = self.level.common_prefixes.last();
                if last.and_then(|last| last.filename()) != Some(dir.as_ref()) {
                    let dir = self.prefix.clone().join(dir.as_ref());
                    self.level.common_prefixes.push(dir);
                }
            }
            (None, _) => {}
        }
    }

    fn done(mut self) -> Prelisted {
        let level = &mut self.level;
        level.common_prefixes.sort();
        level.common_prefixes.dedup();
        level.objects.sort_by(|a, b| a.location.cmp(&b.location));
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str) -> ObjectMeta {
        ObjectMeta {
            location: ObjectPath::from(key),
            last_modified: UNIX_EPOCH.into(),
            size: 1,
            e_tag: None,
            version: None,
        }
    }

    #[test]
    fn a_manifest_shows_its_directory_as_a_listing_would() {
        let objects = [
            "ds/chunk_00001/data.npy",
            "ds/chunk_00000/data.npy",
            "ds/chunk_00000/row_ptr.npy",
            "ds/metadata.json",
            "ds/var_features/labels.npy",
        ]
        .map(meta);
        let prefix = ObjectPath::from("ds");
        let mut level = Level::new(
            &prefix,
            [meta("ds/header.sch"), meta("ds/.scdlfs-manifest")],
        );
        for object in &objects {
            level.add(object.location.prefix_match(&prefix), || object.clone());
        }
        level.add(meta("other/x").location.prefix_match(&prefix), || {
            meta("other/x")
        });
        let level = level.done();
        let names = |paths: Vec<&ObjectPath>| -> Vec<String> {
            paths.into_iter().map(|p| p.to_string()).collect()
        };
        assert_eq!(
            names(level.common_prefixes.iter().collect()),
            ["ds/chunk_00000", "ds/chunk_00001", "ds/var_features"]
        );
        assert_eq!(
            names(level.objects.iter().map(|m| &m.location).collect()),
            ["ds/.scdlfs-manifest", "ds/header.sch", "ds/metadata.json"]
        );
    }

    proptest::proptest! {
        /// A manifest's key is the one joining its parts makes, written out at once or
        /// not.
        #[test]
        fn a_manifest_key_is_its_parts_joined(
            prefix in "([a-z0-9_.-]{1,6}(/[a-z%. ]{1,4}){0,2})?",
            relative in "[a-zA-Z0-9_./%~ -]{1,20}",
        ) {
            let prefix = ObjectPath::from(prefix.as_str());
            let joined = (relative.split('/')).fold(prefix.clone(), |path, part| path.join(part));
            proptest::prop_assert_eq!(object_key(&prefix, &relative), joined);
        }
    }

    #[test]
    fn a_chunk_array_key_is_written_out_at_once() {
        let key = object_key(&ObjectPath::from("atlas/ds"), "chunk_00012/row_ptr.npy");
        assert_eq!(key.as_ref(), "atlas/ds/chunk_00012/row_ptr.npy");
        let key = object_key(&ObjectPath::from(""), "chunk_00012/row_ptr.npy");
        assert_eq!(key.as_ref(), "chunk_00012/row_ptr.npy");
    }
}
