//! `scdlfs chunk`: a monolithic SCDL archive, read from a local folder or any store,
//! partitioned by rows into the chunked layout at any store.
//!
//! The job runs in four steps, each of which may stop the run and none of which loses
//! work:
//! 1. [`source`] reads and checks the whole source (header, array sizes, every row
//!    offset) before anything is written: bad input leaves the target untouched.
//! 2. The target is inspected: empty (a new job), holding this job's resume record
//!    ([`journal`]: resume), holding this very dataset (nothing to do), or holding
//!    anything else (refused).
//! 3. Each missing object is streamed from the source straight to the target: ranged
//!    reads feed a multipart upload a part at a time, so memory stays at a few parts
//!    per object in flight whatever the chunk size, and nothing is staged locally.
//! 4. Everything is verified (sizes and ETags against the record, the row offsets read
//!    back, the totals the header will claim), the [`manifest`] is written from the
//!    target's listing, then `header.sch` is written last: a reader or a mount never
//!    sees a half-written dataset as a chunked one.

pub mod journal;
pub(crate) mod manifest;
pub(crate) mod source;
mod upload;
mod verify;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use scdl_format::chunking::{chunked_header, encode_row_offsets, ChunkingError};
use scdl_format::layout::{chunk_dir_name, HEADER_FILE};
use scdl_format::{ArrayKind, ChunkedInfo, Header, HeaderError};
use tokio_util::sync::CancellationToken;

use crate::progress::Progress;
use journal::{JobIdentity, Journal, Uploaded, FORMAT_VERSION, JOURNAL_DIR};
use source::MonolithicSource;
use upload::upload;
use verify::{verify_contents, verify_sizes};

#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("{0}")]
    Usage(String),
    #[error("not a monolithic SCDL archive: {0}")]
    NotAnArchive(String),
    #[error("{location}: {source}")]
    Header {
        location: String,
        source: HeaderError,
    },
    #[error("inconsistent archive: {0}")]
    Inconsistent(String),
    /// Its text speaks of the target as "it" or "there": the target is named by who
    /// knows it as given (`scdlfs chunk`'s TARGET), not by its prefix in its store,
    /// which a local folder's is not.
    #[error("the target is not free for this job: {0}")]
    TargetOccupied(String),
    #[error(
        "the source changed during the job: {0}; the objects uploaded so far hold its \
         earlier version, so the job cannot continue: delete what it wrote at the target \
         and run it again once the source is stable"
    )]
    SourceChanged(String),
    #[error("{location}: {source}")]
    Store {
        location: String,
        source: object_store::Error,
    },
    #[error("verification failed: {0}")]
    Verification(String),
    #[error("interrupted with {done} of {total} objects uploaded")]
    Interrupted { done: usize, total: usize },
    /// Inside the job: the token was cancelled; [`run`] reports it as `Interrupted`.
    #[error("cancelled")]
    Cancelled,
    /// Inside the job: a conditional create found the object there already.
    #[error("{0} exists already")]
    AlreadyExists(String),
}

impl ChunkError {
    fn store(location: &ObjectPath, source: object_store::Error) -> ChunkError {
        ChunkError::Store {
            location: location.to_string(),
            source,
        }
    }

    /// Whether running the same command again continues the job.
    pub fn resumable(&self) -> bool {
        matches!(
            self,
            ChunkError::Store { .. } | ChunkError::Interrupted { .. } | ChunkError::Verification(_)
        )
    }
}

impl From<ChunkingError> for ChunkError {
    fn from(error: ChunkingError) -> ChunkError {
        ChunkError::Inconsistent(error.to_string())
    }
}

/// `location`'s key below `prefix` (`chunk_00000/data.npy`), if it is below it.
pub fn relative_key(location: &ObjectPath, prefix: &ObjectPath) -> Option<String> {
    let parts: Vec<String> = location
        .prefix_match(prefix)?
        .map(|p| p.as_ref().to_owned())
        .collect();
    Some(parts.join("/"))
}

/// A store and the prefix below which an archive lives.
#[derive(Clone, Debug)]
pub struct Location {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: ObjectPath,
}

impl Location {
    fn join(&self, key: &str) -> ObjectPath {
        key.split('/')
            .fold(self.prefix.clone(), |path, part| path.join(part))
    }
}

/// How the job runs.
#[derive(Clone, Debug)]
pub struct ChunkOptions {
    /// Bytes per multipart part (and the largest object sent in one PUT).
    pub part_size: usize,
    /// Objects uploaded at once; each keeps up to [`PARTS_IN_FLIGHT`] parts in flight.
    pub objects_in_flight: usize,
    /// Also read every uploaded object back and compare its CRC32C.
    pub verify_data: bool,
    pub quiet: bool,
}

/// Parts of one object in flight at once.
pub const PARTS_IN_FLIGHT: usize = 2;

/// What a finished job did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkReport {
    pub rows: u64,
    pub chunks: u32,
    pub objects: usize,
    pub uploaded_objects: usize,
    pub uploaded_bytes: u64,
    pub reused_objects: usize,
    /// The target held this dataset, published, before the run.
    pub already_published: bool,
    /// Objects whose bytes were read back and checked.
    pub read_back_objects: usize,
}

/// Where one target object's bytes come from.
#[derive(Clone, Debug)]
enum Content {
    /// Bytes of a source object.
    Copy { from: ObjectPath, range: Range<u64> },
    /// A chunk's row offsets, rebased to start at 0.
    RowOffsets { chunk: u64 },
}

#[derive(Clone, Debug)]
struct TargetObject {
    key: String,
    size: u64,
    content: Content,
}

/// A checked source and the chunked archive it makes, ready to be written.
pub struct ChunkJob {
    archive: MonolithicSource,
    header_bytes: Vec<u8>,
    objects: Vec<TargetObject>,
    identity: JobIdentity,
}

impl ChunkJob {
    /// Reads and checks the monolithic archive at `source` for chunks of `chunk_rows`.
    pub async fn prepare(source: Location, chunk_rows: u32) -> Result<ChunkJob, ChunkError> {
        let archive = MonolithicSource::open(source.store, source.prefix, chunk_rows).await?;
        let header_bytes = planned_header(&archive)?.encode();
        let objects = plan_objects(&archive);
        let identity = JobIdentity {
            format: FORMAT_VERSION,
            chunk_rows,
            source_header_crc32c: crc32c::crc32c(&archive.header_bytes),
            source_array_bytes: ArrayKind::ALL.map(|kind| archive.array(kind).bytes),
            source_e_tags: archive.e_tags.clone(),
        };
        Ok(ChunkJob {
            archive,
            header_bytes,
            objects,
            identity,
        })
    }

    /// Writes the chunked archive at `target`, or resumes writing it. `cancel` stops
    /// the job between pieces, aborting the multipart uploads in flight.
    pub async fn run(
        &self,
        target: Location,
        options: &ChunkOptions,
        cancel: CancellationToken,
    ) -> Result<ChunkReport, ChunkError> {
        if options.part_size < 5 << 20 {
            return Err(ChunkError::Usage(
                "--part-size must be at least 5MiB (the smallest S3 multipart part)".into(),
            ));
        }
        run(self, target, options, cancel).await
    }
}

async fn run(
    job: &ChunkJob,
    target: Location,
    options: &ChunkOptions,
    cancel: CancellationToken,
) -> Result<ChunkReport, ChunkError> {
    let ChunkJob {
        archive,
        header_bytes,
        objects,
        identity,
    } = job;
    let mut report = ChunkReport {
        rows: archive.geometry.total_rows,
        chunks: archive.geometry.num_chunks() as u32,
        objects: objects.len(),
        ..ChunkReport::default()
    };

    let journal = Journal::new(target.store.clone(), &target.prefix);
    let present = list(&target).await?;
    if let Some(published) = present.get(HEADER_FILE) {
        let bytes = read_object(&target, HEADER_FILE, published.size).await?;
        if &bytes != header_bytes {
            return Err(ChunkError::TargetOccupied(
                "it holds another dataset (its header.sch differs from this job's)".to_owned(),
            ));
        }
        verify_sizes(objects, &present, &HashMap::new())?;
        journal.remove().await?;
        report.already_published = true;
        return Ok(report);
    }
    let recorded = begin_or_resume(&journal, &present, identity).await?;

    let (done, todo): (Vec<_>, Vec<_>) = objects.iter().partition(|object| {
        recorded.get(&object.key).is_some_and(|uploaded| {
            present
                .get(&object.key)
                .is_some_and(|meta| still_as_uploaded(object, uploaded, meta))
        })
    });
    report.reused_objects = done.len();
    let uploaded_now = upload_all(job, &target, &journal, todo, options, &cancel)
        .await
        .map_err(|(error, uploaded)| match error {
            ChunkError::Cancelled => ChunkError::Interrupted {
                done: done.len() + uploaded,
                total: objects.len(),
            },
            other => other,
        })?;
    report.uploaded_bytes += uploaded_now
        .values()
        .map(|uploaded| uploaded.size)
        .sum::<u64>();
    report.uploaded_objects = uploaded_now.len();

    let mut record = recorded;
    record.extend(uploaded_now);
    let present = list(&target).await?;
    verify_sizes(objects, &present, &record)?;
    report.read_back_objects =
        verify_contents(archive, &target, objects, &record, options.verify_data).await?;
    publish(job, &target, &present).await?;
    journal.remove().await?;
    Ok(report)
}

/// The uploads a target records for this job, or a new record begun on an empty target.
async fn begin_or_resume(
    journal: &Journal,
    present: &HashMap<String, ObjectMeta>,
    identity: &JobIdentity,
) -> Result<HashMap<String, Uploaded>, ChunkError> {
    Ok(match journal.job().await? {
        Some(existing) if &existing == identity => journal.uploaded().await?,
        Some(existing) => {
            return Err(ChunkError::TargetOccupied(format!(
                "it holds an interrupted chunking of {}; delete it or choose another target",
                existing.unlike(identity)
            )))
        }
        None => {
            if let Some(stray) = present.keys().find(|k| !k.starts_with(JOURNAL_DIR)) {
                return Err(ChunkError::TargetOccupied(format!(
                    "it is not empty (it holds {stray}); choose an empty target"
                )));
            }
            // Created only if absent: of two jobs that found the target empty at once,
            // one starts and the other is refused here.
            journal.begin(identity).await?;
            HashMap::new()
        }
    })
}

/// Uploads `todo`, recording each object as it lands; on failure, the first error and
/// how many objects landed.
async fn upload_all(
    job: &ChunkJob,
    target: &Location,
    journal: &Journal,
    todo: Vec<&TargetObject>,
    options: &ChunkOptions,
    cancel: &CancellationToken,
) -> Result<HashMap<String, Uploaded>, (ChunkError, usize)> {
    let archive = &job.archive;
    let progress = Progress::new(
        "chunk",
        "objects",
        todo.iter().map(|o| o.size).sum(),
        todo.len() as u64,
        options.quiet,
    );
    let results: Vec<Result<(String, Uploaded), ChunkError>> = futures::stream::iter(todo)
        .map(|object| {
            let progress = &progress;
            async move {
                let uploaded = upload(archive, target, object, options, progress, cancel).await?;
                journal.record(&object.key, &uploaded).await?;
                progress.item_done();
                Ok((object.key.clone(), uploaded))
            }
        })
        .buffer_unordered(options.objects_in_flight.max(1))
        .collect()
        .await;
    progress.finish();
    let mut uploaded_now = HashMap::new();
    let mut first_error = None;
    for result in results {
        match result {
            Ok((key, uploaded)) => {
                uploaded_now.insert(key, uploaded);
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) => Err((error, uploaded_now.len())),
        None => Ok(uploaded_now),
    }
}

/// Writes the dataset's manifest, then its header, which publishes it: every planned
/// object is present (verified), as `present`, the target's last listing, shows it.
async fn publish(
    job: &ChunkJob,
    target: &Location,
    present: &HashMap<String, ObjectMeta>,
) -> Result<(), ChunkError> {
    let (archive, objects, header_bytes) = (&job.archive, &job.objects, &job.header_bytes);
    let listed = objects
        .iter()
        .map(|object| (object.key.as_str(), &present[&object.key]));
    manifest::write(target, &manifest::manifest_of(archive.geometry, listed)).await?;
    let header_location = target.join(HEADER_FILE);
    match create(&target.store, &header_location, header_bytes.clone()).await {
        Ok(()) => {}
        // Another run of this very job published first: the same dataset.
        Err(ChunkError::AlreadyExists(_))
            if read_object(target, HEADER_FILE, header_bytes.len() as u64)
                .await
                .is_ok_and(|published| &published == header_bytes) => {}
        Err(ChunkError::AlreadyExists(_)) => {
            return Err(ChunkError::TargetOccupied(
                "another job published a different dataset there while this one ran".to_owned(),
            ))
        }
        Err(error) => return Err(error),
    }
    Ok(())
}

/// Writes `bytes` at `location` only if nothing is there (`PutMode::Create`: S3's
/// `If-None-Match: *`, GCS's generation 0, a hard link in a local folder);
/// [`ChunkError::AlreadyExists`] if something is. A store that cannot create
/// conditionally (an http(s) server) is written unconditionally, with a warning.
pub(crate) async fn create(
    store: &Arc<dyn ObjectStore>,
    location: &ObjectPath,
    bytes: Vec<u8>,
) -> Result<(), ChunkError> {
    let payload = PutPayload::from(bytes);
    match store
        .put_opts(location, payload.clone(), PutMode::Create.into())
        .await
    {
        Ok(_) => Ok(()),
        Err(object_store::Error::AlreadyExists { .. }) => {
            Err(ChunkError::AlreadyExists(location.to_string()))
        }
        Err(object_store::Error::NotImplemented { .. }) => {
            tracing::warn!(
                "{store} cannot refuse to overwrite {location}: two jobs started at once into \
                 this target would not be told apart"
            );
            store
                .put(location, payload)
                .await
                .map(drop)
                .map_err(|source| ChunkError::store(location, source))
        }
        Err(source) => Err(ChunkError::store(location, source)),
    }
}

/// The header to publish: the source's, less the neighbour arrays, chunked.
fn planned_header(archive: &MonolithicSource) -> Result<Header, ChunkError> {
    let info = ChunkedInfo {
        chunk_size: archive.geometry.chunk_size as u32,
        num_chunks: archive.geometry.num_chunks() as u32,
        total_rows: archive.geometry.total_rows,
    };
    let nnz = archive.boundaries.last().copied().unwrap_or(0);
    Ok(chunked_header(&archive.header, info, nnz)?)
}

/// Every object of the chunked archive, chunk by chunk, then the global entries.
fn plan_objects(archive: &MonolithicSource) -> Vec<TargetObject> {
    let mut objects = Vec::new();
    for chunk in 0..archive.geometry.num_chunks() {
        let rows = archive.geometry.chunk_rows(chunk);
        let values = archive.boundaries[chunk as usize]..archive.boundaries[chunk as usize + 1];
        let dir = chunk_dir_name(chunk as u32);
        for kind in ArrayKind::ALL {
            let array = archive.array(kind);
            let key = format!("{dir}/{}", kind.file_name());
            objects.push(match kind {
                ArrayKind::RowPtr => TargetObject {
                    key,
                    size: (rows.end - rows.start + 1) * array.width,
                    content: Content::RowOffsets { chunk },
                },
                ArrayKind::Data | ArrayKind::ColPtr => TargetObject {
                    key,
                    size: (values.end - values.start) * array.width,
                    content: Content::Copy {
                        from: array.location.clone(),
                        range: values.start * array.width..values.end * array.width,
                    },
                },
            });
        }
    }
    for (key, size) in &archive.globals {
        objects.push(TargetObject {
            key: key.clone(),
            size: *size,
            content: Content::Copy {
                from: archive.location(key),
                range: 0..*size,
            },
        });
    }
    objects
}

/// A chunk's row offsets as its `row_ptr.npy` holds them.
async fn row_offsets(archive: &MonolithicSource, chunk: u64) -> Result<Vec<u8>, ChunkError> {
    let array = archive.array(ArrayKind::RowPtr);
    let rows = archive.geometry.chunk_rows(chunk);
    let raw = archive
        .read_range(
            &array.location,
            rows.start * array.width..(rows.end + 1) * array.width,
        )
        .await?;
    let entries = (rows.end - rows.start + 1) as usize;
    let first = archive.boundaries[chunk as usize];
    let values = archive.boundaries[chunk as usize + 1] - first;
    let mut rebased = Vec::with_capacity(entries);
    for i in 0..entries {
        let offset = array.dtype.read_uint(&raw, i);
        // The offsets were checked when the job began; a store that ignores If-Match
        // (or a source changed outside its ETag) can still answer others now.
        let previous = rebased.last().copied().unwrap_or(0);
        match offset.checked_sub(first) {
            Some(at) if (previous..=values).contains(&at) => rebased.push(at),
            _ => {
                return Err(ChunkError::Inconsistent(format!(
                    "{}: row offset {} ({offset}) is outside chunk {chunk}'s values \
                     {first}..={} or below the one before it; the source changed since \
                     it was checked",
                    array.location,
                    rows.start + i as u64,
                    first + values
                )))
            }
        }
    }
    Ok(encode_row_offsets(array.dtype, &rebased)?)
}

/// Whether a recorded upload is still what the target holds.
fn still_as_uploaded(object: &TargetObject, uploaded: &Uploaded, meta: &ObjectMeta) -> bool {
    meta.size == object.size
        && uploaded.size == object.size
        && match (&uploaded.e_tag, &meta.e_tag) {
            (Some(recorded), Some(now)) => recorded == now,
            _ => true,
        }
}

/// Every object below the target prefix, by key.
async fn list(target: &Location) -> Result<HashMap<String, ObjectMeta>, ChunkError> {
    let listing: Vec<ObjectMeta> = target
        .store
        .list(Some(&target.prefix))
        .try_collect()
        .await
        .map_err(|source| ChunkError::store(&target.prefix, source))?;
    Ok(listing
        .into_iter()
        .filter_map(|meta| Some((relative_key(&meta.location, &target.prefix)?, meta)))
        .collect())
}

async fn read_object(target: &Location, key: &str, size: u64) -> Result<Vec<u8>, ChunkError> {
    let location = target.join(key);
    let bytes = target
        .store
        .get(&location)
        .await
        .map_err(|source| ChunkError::store(&location, source))?
        .bytes()
        .await
        .map_err(|source| ChunkError::store(&location, source))?;
    if bytes.len() as u64 != size {
        return Err(ChunkError::Verification(format!(
            "{key} read back {} bytes, not {size}",
            bytes.len()
        )));
    }
    Ok(bytes.to_vec())
}
