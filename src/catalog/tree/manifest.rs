//! A dataset opened from its manifest ([`scdl_format::manifest`]): one GET of the
//! manifest and one of `header.sch`, instead of listing the dataset's directory and
//! every object under it (a dataset of 24,415 chunks: 25 delimited and 74 recursive
//! pages, one after the other).
//!
//! A directory that is not listed yet is asked for its manifest while its delimited
//! listing starts ([`Tree::list_level`]): the first to answer with something usable
//! wins, and a directory without a manifest costs one GET answered 404 beside its
//! listing, no wait. A listing made first that shows a manifest has it read too (or,
//! for a listing made before, such as the root's, when its dataset is discovered). A
//! manifest that cannot be read, is not one, or disagrees with the header (its rows,
//! rows per chunk, chunk count) is logged and the directory is listed as without one.
//! The objects keep the ETags the manifest lists: every GET of them sends `If-Match`,
//! so an object changed since the manifest was written is refused (EIO), never mixed.

use std::time::{Duration, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetResult, ObjectMeta, ObjectStore};
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::layout::{parse_chunk_dir_name, HEADER_FILE};
use scdl_format::manifest::{Manifest, MANIFEST_FILE, MAX_MANIFEST_BYTES};
use scdl_format::Header;
use tokio::time::Instant;

use super::nodes::{DirNode, Prelisted};
use super::{non_empty, Tree};
use crate::error::{FsError, FsResult};
use crate::object::{canonical_etag, ObjectInfo};

/// What a manifest says of its directory, checked against the header.
pub(super) struct Opened {
    /// The directory's entries as a listing would show them: its objects (the header
    /// and the manifest with them) and its subdirectories.
    pub(super) level: Prelisted,
    /// Every object of the dataset but the header and the manifest.
    pub(super) objects: Vec<ObjectMeta>,
    /// The header's bytes, as read, and the version they are of.
    header_bytes: Bytes,
    header_meta: ObjectMeta,
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

impl Tree {
    /// The directory's delimited listing, or what its manifest says if it has one that
    /// answers first, with the manifest if one was read.
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
        let probe = self.open_manifest(prefix);
        tokio::pin!(listing, probe);
        tokio::select! {
            opened = &mut probe => match opened {
                Some(opened) => Ok((opened.level.clone(), Some(opened))),
                None => Ok((listing.await?, None)),
            },
            listed = &mut listing => {
                let listed = listed?;
                let opened = match shows_a_manifest(&listed) {
                    true => probe.await,
                    false => None,
                };
                Ok((listed, opened))
            }
        }
    }

    /// The manifest at `prefix` and the header it describes, if both can be read and
    /// agree; `None` (logged unless there is no manifest) otherwise.
    pub(super) async fn open_manifest(&self, prefix: &ObjectPath) -> Option<Opened> {
        let manifest_key = prefix.clone().join(MANIFEST_FILE);
        let (manifest_meta, bytes) = match self.whole(&manifest_key, MAX_MANIFEST_BYTES).await {
            Ok(read) => read,
            Err(FsError::NotFound) => return None,
            Err(error) => {
                tracing::warn!(manifest = %manifest_key, %error, "cannot read the manifest; listing the directory instead");
                return None;
            }
        };
        let ignored = |reason: &dyn std::fmt::Display| {
            tracing::warn!(manifest = %manifest_key, %reason, "not using the manifest; listing the directory instead");
            None
        };
        let manifest = match Manifest::decode(&bytes) {
            Ok(manifest) => manifest,
            Err(error) => return ignored(&error),
        };
        let header_key = prefix.clone().join(HEADER_FILE);
        let (header_meta, header_bytes) = match self.whole(&header_key, MAX_HEADER_BYTES).await {
            Ok(read) => read,
            Err(error) => return ignored(&format!("its header: {error}")),
        };
        let agreement = Header::decode(&header_bytes)
            .map_err(|e| e.to_string())
            .and_then(|header| manifest.agrees_with(&header).map_err(|e| e.to_string()));
        if let Err(reason) = agreement {
            return ignored(&reason);
        }
        let objects: Vec<ObjectMeta> = manifest
            .objects
            .into_iter()
            .map(|object| ObjectMeta {
                location: object
                    .key
                    .split('/')
                    .fold(prefix.clone(), |path, part| path.join(part)),
                last_modified: (UNIX_EPOCH + Duration::from_nanos(object.mtime_ns)).into(),
                size: object.size,
                e_tag: object.etag,
                version: None,
            })
            .collect();
        tracing::info!(dataset = %prefix, objects = objects.len(), "opened from its manifest; its objects are not listed");
        Some(Opened {
            level: level_of(prefix, &objects, [header_meta.clone(), manifest_meta]),
            objects,
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

fn shows_a_manifest(listed: &Prelisted) -> bool {
    listed
        .objects
        .iter()
        .any(|meta| meta.location.filename() == Some(MANIFEST_FILE))
}

/// The directory `prefix` as a delimited listing shows it: the `objects` directly in
/// it and `more` (the header and the manifest), and one subdirectory for each first
/// part of a deeper key, in key order.
fn level_of(prefix: &ObjectPath, objects: &[ObjectMeta], more: [ObjectMeta; 2]) -> Prelisted {
    let mut level = Prelisted {
        at: Instant::now(),
        common_prefixes: Vec::new(),
        objects: more.into(),
    };
    for meta in objects {
        let Some(mut parts) = meta.location.prefix_match(prefix) else {
            continue;
        };
        let first = parts.next();
        match (first, parts.next()) {
            (Some(_), None) => level.objects.push(meta.clone()),
            (Some(dir), Some(_)) => {
                let dir = prefix.clone().join(dir.as_ref());
                if level.common_prefixes.last() != Some(&dir) {
                    level.common_prefixes.push(dir);
                }
            }
            (None, _) => {}
        }
    }
    level.common_prefixes.sort();
    level.common_prefixes.dedup();
    level.objects.sort_by(|a, b| a.location.cmp(&b.location));
    level
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
        let level = level_of(
            &ObjectPath::from("ds"),
            &objects,
            [meta("ds/header.sch"), meta("ds/.scdlfs-manifest")],
        );
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
}
