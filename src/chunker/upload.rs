//! Step 3 of a chunk job: each missing object streamed from the source straight to the
//! target, ranged reads feeding a multipart upload a part at a time, so memory stays at
//! a few parts per object in flight and nothing is staged locally.

use std::ops::Range;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use tokio_util::sync::CancellationToken;

use super::journal::Uploaded;
use super::source::MonolithicSource;
use super::{
    row_offsets, ChunkError, ChunkOptions, Content, Location, TargetObject, PARTS_IN_FLIGHT,
};
use crate::progress::Progress;

/// Sends one object; returns what the store now holds.
pub(super) async fn upload(
    archive: &MonolithicSource,
    target: &Location,
    object: &TargetObject,
    options: &ChunkOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Uploaded, ChunkError> {
    if cancel.is_cancelled() {
        return Err(ChunkError::Cancelled);
    }
    let location = target.join(&object.key);
    let small = match &object.content {
        Content::RowOffsets { chunk } => Some(row_offsets(archive, *chunk).await?),
        Content::Copy { from, range } if object.size <= options.part_size as u64 => {
            Some(archive.read_range(from, range.clone()).await?)
        }
        Content::Copy { .. } => None,
    };
    if let Some(bytes) = small {
        let crc32c = crc32c::crc32c(&bytes);
        let size = bytes.len() as u64;
        let result = target
            .store
            .put(&location, PutPayload::from(bytes))
            .await
            .map_err(|source| ChunkError::store(&location, source))?;
        progress.add_bytes(size);
        return Ok(Uploaded {
            size,
            crc32c,
            e_tag: result.e_tag,
        });
    }
    let Content::Copy { from, range } = &object.content else {
        unreachable!("row offsets always go in one PUT");
    };
    let upload = target
        .store
        .put_multipart(&location)
        .await
        .map_err(|source| ChunkError::store(&location, source))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, options.part_size);
    match stream_into(archive, from, range.clone(), &mut writer, progress, cancel).await {
        Ok(crc32c) => {
            let result = writer
                .finish()
                .await
                .map_err(|source| ChunkError::store(&location, source))?;
            Ok(Uploaded {
                size: object.size,
                crc32c,
                e_tag: result.e_tag,
            })
        }
        Err(error) => {
            // An abandoned multipart upload would linger unseen (and billed) in S3.
            if let Err(abort) = writer.abort().await {
                tracing::warn!("could not abort the upload of {location}: {abort}");
            }
            Err(error)
        }
    }
}

/// Streams `range` of `from` into `writer`; returns the CRC32C of the bytes sent.
async fn stream_into(
    archive: &MonolithicSource,
    from: &ObjectPath,
    range: Range<u64>,
    writer: &mut WriteMultipart,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<u32, ChunkError> {
    let expected = range.end - range.start;
    let mut body = archive.get(from, Some(range)).await?.into_stream();
    let (mut crc, mut sent) = (0u32, 0u64);
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return Err(ChunkError::Cancelled),
            next = body.try_next() => next.map_err(|source| ChunkError::store(from, source))?,
        };
        let Some(bytes) = next else { break };
        writer
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|source| ChunkError::store(from, source))?;
        crc = crc32c::crc32c_append(crc, &bytes);
        sent += bytes.len() as u64;
        writer.write(&bytes);
        progress.add_bytes(bytes.len() as u64);
    }
    if sent != expected {
        return Err(ChunkError::Inconsistent(format!(
            "{from}: expected {expected} bytes, the store sent {sent}"
        )));
    }
    Ok(crc)
}
