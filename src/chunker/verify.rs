//! Step 4 of a chunk job: the target checked before `header.sch` is written (sizes
//! and ETags against the resume record, the row offsets read back, and with
//! `--verify-data` every object's bytes against the source).

use std::collections::HashMap;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt};
use scdl_format::ArrayKind;

use super::journal::Uploaded;
use super::source::MonolithicSource;
use super::{read_object, still_as_uploaded, ChunkError, Content, Location, TargetObject};

/// Every planned object is present with its size, and unchanged since its upload.
pub(super) fn verify_sizes(
    objects: &[TargetObject],
    present: &HashMap<String, ObjectMeta>,
    record: &HashMap<String, Uploaded>,
) -> Result<(), ChunkError> {
    for object in objects {
        let meta = present.get(&object.key).ok_or_else(|| {
            ChunkError::Verification(format!("{} is missing at the target", object.key))
        })?;
        if meta.size != object.size {
            return Err(ChunkError::Verification(format!(
                "{} holds {} bytes, not {}",
                object.key, meta.size, object.size
            )));
        }
        if let Some(uploaded) = record.get(&object.key) {
            if !still_as_uploaded(object, uploaded, meta) {
                return Err(ChunkError::Verification(format!(
                    "{} changed at the target after it was uploaded",
                    object.key
                )));
            }
        }
    }
    Ok(())
}

/// Reads back the row offsets (always: they are small and decide every row's bounds)
/// or every object (`all`, streamed), comparing each with the CRC32C of the bytes sent,
/// and checks the row offsets end at their chunk's value count. Returns how many
/// objects were read back.
pub(super) async fn verify_contents(
    archive: &MonolithicSource,
    target: &Location,
    objects: &[TargetObject],
    record: &HashMap<String, Uploaded>,
    all: bool,
) -> Result<usize, ChunkError> {
    futures::stream::iter(
        objects
            .iter()
            .filter(|object| all || matches!(object.content, Content::RowOffsets { .. })),
    )
    .map(|object| async move {
        let recorded = record.get(&object.key).ok_or_else(|| {
            ChunkError::Verification(format!("{} has no upload record", object.key))
        })?;
        let crc = match object.content {
            Content::RowOffsets { chunk } => {
                let bytes = read_object(target, &object.key, object.size).await?;
                let dtype = archive.array(ArrayKind::RowPtr).dtype;
                let entries = bytes.len() / archive.array(ArrayKind::RowPtr).width as usize;
                let last = dtype.read_uint(&bytes, entries - 1);
                let values =
                    archive.boundaries[chunk as usize + 1] - archive.boundaries[chunk as usize];
                if last != values {
                    return Err(ChunkError::Verification(format!(
                        "{} ends at {last}, but its chunk holds {values} values",
                        object.key
                    )));
                }
                crc32c::crc32c(&bytes)
            }
            Content::Copy { .. } => stream_crc(target, &object.key, object.size).await?,
        };
        if crc != recorded.crc32c {
            return Err(ChunkError::Verification(format!(
                "{} does not hold the bytes that were sent (CRC32C differs)",
                object.key
            )));
        }
        Ok(())
    })
    .buffer_unordered(8)
    .try_fold(0, |n, ()| async move { Ok(n + 1) })
    .await
}

/// The CRC32C of a target object, read as a stream.
async fn stream_crc(target: &Location, key: &str, size: u64) -> Result<u32, ChunkError> {
    let location = target.join(key);
    let mut body = target
        .store
        .get(&location)
        .await
        .map_err(|source| ChunkError::store(&location, source))?
        .into_stream();
    let (mut crc, mut read) = (0u32, 0u64);
    while let Some(bytes) = body
        .try_next()
        .await
        .map_err(|source| ChunkError::store(&location, source))?
    {
        crc = crc32c::crc32c_append(crc, &bytes);
        read += bytes.len() as u64;
    }
    if read != size {
        return Err(ChunkError::Verification(format!(
            "{key} read back {read} bytes, not {size}"
        )));
    }
    Ok(crc)
}
