//! The manifest of a chunked dataset at a store ([`scdl_format::manifest`]): every
//! object's key, size, modification time and ETag in one object beside `header.sch`,
//! which a mount reads instead of listing the dataset.
//!
//! `scdlfs chunk` writes it from its last listing of the target, after every object was
//! verified and before `header.sch` (the commit point: a manifest without a header is
//! not a dataset, and a rerun of an interrupted job writes it again). `scdlfs manifest
//! URL` ([`write_for_published`]) writes one for a dataset chunked by another tool: one
//! recursive listing and one GET of the header, no HEAD.

use std::collections::HashMap;
use std::time::UNIX_EPOCH;

use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::layout::{chunk_dir_name, HEADER_FILE};
use scdl_format::manifest::{Manifest, ManifestObject, MANIFEST_FILE};
use scdl_format::{ArrayKind, ChunkGeometry, Header};

use super::journal::JOURNAL_DIR;
use super::{list, read_object, ChunkError, Location};

/// What `scdlfs manifest` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestReport {
    pub rows: u64,
    pub chunks: u64,
    pub objects: usize,
    pub bytes: usize,
}

/// The manifest of a dataset of `geometry` made of `objects` (key relative to the
/// dataset, and the object as listed).
pub(super) fn manifest_of<'a>(
    geometry: ChunkGeometry,
    objects: impl IntoIterator<Item = (&'a str, &'a ObjectMeta)>,
) -> Manifest {
    let objects = objects
        .into_iter()
        .map(|(key, meta)| ManifestObject {
            key: key.to_owned(),
            size: meta.size,
            mtime_ns: std::time::SystemTime::from(meta.last_modified)
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() as u64),
            etag: meta.e_tag.clone(),
        })
        .collect();
    Manifest {
        rows: geometry.total_rows,
        chunk_rows: geometry.chunk_size,
        chunks: geometry.num_chunks(),
        objects,
    }
}

/// Writes `manifest` beside the dataset's header, replacing one there; its size.
pub(super) async fn write(target: &Location, manifest: &Manifest) -> Result<usize, ChunkError> {
    let bytes = manifest
        .encode()
        .map_err(|e| ChunkError::Inconsistent(e.to_string()))?;
    let len = bytes.len();
    let location = target.join(MANIFEST_FILE);
    target
        .store
        .put(&location, PutPayload::from(bytes))
        .await
        .map_err(|source| ChunkError::store(&location, source))?;
    Ok(len)
}

/// Writes the manifest of the chunked dataset published at `target` (its header
/// there): every object listed under it but the header, the manifest and a chunking
/// job's record, once each of the header's chunks was found with its three arrays.
pub async fn write_for_published(target: Location) -> Result<ManifestReport, ChunkError> {
    let present: HashMap<String, ObjectMeta> = list(&target).await?;
    let not_chunked = |why: &str| ChunkError::NotAnArchive(format!("{}: {why}", target.prefix));
    let header_meta = present
        .get(HEADER_FILE)
        .ok_or_else(|| not_chunked("no header.sch"))?;
    if header_meta.size > MAX_HEADER_BYTES {
        return Err(not_chunked("header.sch is larger than any SCDL header"));
    }
    let bytes = read_object(&target, HEADER_FILE, header_meta.size).await?;
    let header = Header::decode(&bytes).map_err(|source| ChunkError::Header {
        location: target.join(HEADER_FILE).to_string(),
        source,
    })?;
    let info = header.chunked.ok_or_else(|| {
        not_chunked("header.sch is a monolithic archive's; chunk it with `scdlfs chunk`")
    })?;
    let geometry = ChunkGeometry::new(info.total_rows, info.chunk_size as u64)
        .filter(|g| g.num_chunks() == info.num_chunks as u64)
        .ok_or_else(|| {
            ChunkError::Inconsistent(format!(
                "header.sch says {} rows in {} chunks of {}",
                info.total_rows, info.num_chunks, info.chunk_size
            ))
        })?;
    for chunk in 0..info.num_chunks {
        for kind in ArrayKind::ALL {
            let key = format!("{}/{}", chunk_dir_name(chunk), kind.file_name());
            if !present.contains_key(&key) {
                return Err(ChunkError::Inconsistent(format!(
                    "{key} is missing: the header names {} chunks",
                    info.num_chunks
                )));
            }
        }
    }
    let mut keys: Vec<&String> = present
        .keys()
        .filter(|key| *key != HEADER_FILE && *key != MANIFEST_FILE && !key.starts_with(JOURNAL_DIR))
        .collect();
    keys.sort();
    let manifest = manifest_of(
        geometry,
        keys.iter().map(|key| (key.as_str(), &present[*key])),
    );
    let bytes = write(&target, &manifest).await?;
    Ok(ManifestReport {
        rows: geometry.total_rows,
        chunks: geometry.num_chunks(),
        objects: manifest.objects.len(),
        bytes,
    })
}
