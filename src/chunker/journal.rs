//! The resume record of a chunking job, kept at the target under `.scdlfs-chunk/` from
//! the first upload until the header is published, then deleted.
//!
//! `job.json` names the job (the source's header checksum, array sizes and every
//! source object's ETag, the chunk size): a second run resumes only the same job, and
//! refuses a target that holds another's, or this one's over a source changed since.
//! It is created only where none exists, so that of two jobs started at once into one
//! empty target exactly one begins. Each uploaded object gets a marker `done/<key>.json` with its size, the
//! CRC32C of the bytes sent and the ETag the store gave back: a rerun skips an object
//! whose size and ETag still match its marker, and re-sends the rest. Uploads are
//! atomic in every store (a single PUT, or a multipart upload completed at the end), so
//! a present object is a whole one; the ETag catches one changed since.
//!
//! The record is versioned; `FORMAT_VERSION` changes with any change of these files,
//! and the golden test below fails when the encoding does.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::{relative_key, ChunkError};

/// The directory, below the target prefix, that holds the record.
pub const JOURNAL_DIR: &str = ".scdlfs-chunk";
const JOB_FILE: &str = "job.json";
const DONE_DIR: &str = "done";
const MARKER_SUFFIX: &str = ".json";
pub const FORMAT_VERSION: u32 = 2;

/// Markers read at once when a job resumes.
const MARKER_READS_IN_FLIGHT: usize = 16;

/// What makes two runs the same job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIdentity {
    pub format: u32,
    pub chunk_rows: u32,
    pub source_header_crc32c: u32,
    /// Bytes of the source's data, row-offset and column-id arrays.
    pub source_array_bytes: [u64; 3],
    /// The ETag of every source object the job reads, by path below the archive
    /// (absent from records of format 1, which then differ by their format).
    #[serde(default)]
    pub source_e_tags: BTreeMap<String, String>,
}

impl JobIdentity {
    /// What the job `self` is, said against `other`, for a refusal.
    pub fn unlike(&self, other: &JobIdentity) -> String {
        let same_shape = JobIdentity {
            source_e_tags: other.source_e_tags.clone(),
            ..self.clone()
        };
        if &same_shape != other {
            return "another source or --chunk-rows".into();
        }
        let changed: Vec<&str> = other
            .source_e_tags
            .iter()
            .filter(|(name, e_tag)| self.source_e_tags.get(*name) != Some(*e_tag))
            .map(|(name, _)| name.as_str())
            .collect();
        format!(
            "this source, which changed since (now another version: {}): its objects there \
             hold the earlier version",
            changed.join(", ")
        )
    }
}

/// One object as it was uploaded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uploaded {
    pub size: u64,
    pub crc32c: u32,
    pub e_tag: Option<String>,
}

/// The record at one target.
pub struct Journal {
    store: Arc<dyn ObjectStore>,
    dir: ObjectPath,
}

impl Journal {
    pub fn new(store: Arc<dyn ObjectStore>, target_prefix: &ObjectPath) -> Journal {
        Journal {
            store,
            dir: target_prefix.clone().join(JOURNAL_DIR),
        }
    }

    fn job_location(&self) -> ObjectPath {
        self.dir.clone().join(JOB_FILE)
    }

    fn marker_location(&self, key: &str) -> ObjectPath {
        let mut path = self.dir.clone().join(DONE_DIR);
        let mut parts = key.split('/').peekable();
        while let Some(part) = parts.next() {
            path = if parts.peek().is_some() {
                path.join(part)
            } else {
                path.join(format!("{part}{MARKER_SUFFIX}"))
            };
        }
        path
    }

    /// The job this target is in the middle of, if any.
    pub async fn job(&self) -> Result<Option<JobIdentity>, ChunkError> {
        let location = self.job_location();
        match self.store.get(&location).await {
            Ok(result) => {
                let bytes = result
                    .bytes()
                    .await
                    .map_err(|source| ChunkError::store(&location, source))?;
                serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                    ChunkError::TargetOccupied(format!(
                        "{location} is not a resume record this scdlfs can read ({e})"
                    ))
                })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(ChunkError::store(&location, source)),
        }
    }

    /// Starts the record, refused if another job started one meanwhile.
    pub async fn begin(&self, job: &JobIdentity) -> Result<(), ChunkError> {
        let location = self.job_location();
        let bytes = serde_json::to_vec(job).expect("the record serializes");
        match super::create(&self.store, &location, bytes).await {
            Err(ChunkError::AlreadyExists(_)) => Err(ChunkError::TargetOccupied(
                "another job began there at the same time".to_owned(),
            )),
            other => other,
        }
    }

    pub async fn record(&self, key: &str, uploaded: &Uploaded) -> Result<(), ChunkError> {
        self.put_json(&self.marker_location(key), uploaded).await
    }

    /// Every object recorded as uploaded, by key below the target prefix.
    pub async fn uploaded(&self) -> Result<HashMap<String, Uploaded>, ChunkError> {
        let done = self.dir.clone().join(DONE_DIR);
        let markers: Vec<_> = self
            .store
            .list(Some(&done))
            .try_collect()
            .await
            .map_err(|source| ChunkError::store(&done, source))?;
        futures::stream::iter(markers)
            .map(|meta| {
                let done = &done;
                async move {
                    let key = relative_key(&meta.location, done).unwrap_or_default();
                    let Some(key) = key.strip_suffix(MARKER_SUFFIX) else {
                        return Ok(None);
                    };
                    let bytes = self
                        .store
                        .get(&meta.location)
                        .await
                        .map_err(|source| ChunkError::store(&meta.location, source))?
                        .bytes()
                        .await
                        .map_err(|source| ChunkError::store(&meta.location, source))?;
                    // A marker that does not parse only costs a re-upload of its object.
                    Ok(serde_json::from_slice::<Uploaded>(&bytes)
                        .ok()
                        .map(|uploaded| (key.to_owned(), uploaded)))
                }
            })
            .buffer_unordered(MARKER_READS_IN_FLIGHT)
            .try_filter_map(|entry| async move { Ok(entry) })
            .try_collect()
            .await
    }

    /// Deletes the record: the last step of a published job.
    pub async fn remove(&self) -> Result<(), ChunkError> {
        let locations = self
            .store
            .list(Some(&self.dir))
            .map_ok(|meta| meta.location)
            .boxed();
        self.store
            .delete_stream(locations)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|source| ChunkError::store(&self.dir, source))?;
        Ok(())
    }

    async fn put_json(
        &self,
        location: &ObjectPath,
        value: &impl Serialize,
    ) -> Result<(), ChunkError> {
        let bytes = serde_json::to_vec(value).expect("the record serializes");
        self.store
            .put(location, PutPayload::from(bytes))
            .await
            .map_err(|source| ChunkError::store(location, source))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[test]
    fn the_record_format_is_stable() {
        let job = JobIdentity {
            format: FORMAT_VERSION,
            chunk_rows: 8192,
            source_header_crc32c: 0xdead_beef,
            source_array_bytes: [400, 88, 200],
            source_e_tags: BTreeMap::from([
                ("data.npy".into(), "\"e1\"".into()),
                ("header.sch".into(), "7-5f-20".into()),
            ]),
        };
        assert_eq!(
            serde_json::to_string(&job).unwrap(),
            r#"{"format":2,"chunk_rows":8192,"source_header_crc32c":3735928559,"source_array_bytes":[400,88,200],"source_e_tags":{"data.npy":"\"e1\"","header.sch":"7-5f-20"}}"#
        );
        let uploaded = Uploaded {
            size: 12,
            crc32c: 7,
            e_tag: Some("\"abc\"".into()),
        };
        assert_eq!(
            serde_json::to_string(&uploaded).unwrap(),
            r#"{"size":12,"crc32c":7,"e_tag":"\"abc\""}"#
        );
    }

    #[tokio::test]
    async fn markers_round_trip_by_key_and_vanish_with_the_record() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = ObjectPath::from("atlas/tahoe");
        let journal = Journal::new(store.clone(), &prefix);
        assert_eq!(journal.job().await.unwrap(), None);
        let job = JobIdentity {
            format: FORMAT_VERSION,
            chunk_rows: 10,
            source_header_crc32c: 1,
            source_array_bytes: [1, 2, 3],
            source_e_tags: BTreeMap::from([("data.npy".into(), "v1".into())]),
        };
        journal.begin(&job).await.unwrap();
        let data = Uploaded {
            size: 5,
            crc32c: 9,
            e_tag: None,
        };
        journal.record("chunk_00000/data.npy", &data).await.unwrap();
        journal.record("version.json", &data).await.unwrap();
        assert_eq!(journal.job().await.unwrap(), Some(job));
        let uploaded = journal.uploaded().await.unwrap();
        assert_eq!(uploaded.len(), 2);
        assert_eq!(uploaded["chunk_00000/data.npy"], data);
        assert_eq!(uploaded["version.json"], data);

        journal.remove().await.unwrap();
        let left: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
}
