//! Downloads of parts: each part of each object is fetched once however many readers
//! and prefetches want it, at most `max_concurrent_requests` at a time, demand first
//! ([`permits`]), then stored in the disk cache.
//!
//! A download runs in its own task: a reader that gives up (an interrupted read) does
//! not cancel the download others may be waiting for. Every request asks for the
//! object's pinned version, and a short or failed body is retried a few times before
//! the readers get an error; the bytes handed out are always exactly the part.

pub mod permits;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use object_store::{GetOptions, GetRange, ObjectStore};
use parking_lot::Mutex;

use crate::cache::{DiskCache, PartOrigin, PinnedPart};
use crate::catalog::ObjectInfo;
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::parts::{span, spans_touched, PartKey};
use permits::{Permits, Urgency};

/// Attempts per part before readers get an error.
const ATTEMPTS: u32 = 3;

/// The bytes of one part, from the disk cache or straight from a download.
pub enum PartBytes {
    Cached(PinnedPart),
    Fetched(Bytes),
}

impl PartBytes {
    pub fn copy_to(&self, out: &mut [u8], offset_in_part: u64) -> FsResult<()> {
        match self {
            PartBytes::Cached(part) => Ok(part.read_exact_at(out, offset_in_part)?),
            PartBytes::Fetched(bytes) => {
                let start = offset_in_part as usize;
                out.copy_from_slice(&bytes[start..start + out.len()]);
                Ok(())
            }
        }
    }
}

type SharedDownload = Shared<BoxFuture<'static, FsResult<Bytes>>>;

struct InFlight {
    download: SharedDownload,
    urgency: Arc<Urgency>,
}

pub struct Fetcher {
    store: Arc<dyn ObjectStore>,
    cache: Arc<DiskCache>,
    part_size: u64,
    max_concurrent_requests: usize,
    permits: Arc<Permits>,
    /// Parts the prefetcher brought in that no reader has asked for yet.
    prefetched: Mutex<HashSet<PartKey>>,
    /// The last parts the cache had no room for, kept in memory so that the reads
    /// that follow do not download them again (bounded: one per download slot).
    uncached: Mutex<lru::LruCache<PartKey, Bytes>>,
    in_flight: Mutex<HashMap<PartKey, InFlight>>,
    metrics: Arc<Metrics>,
    /// Downloads are started from FUSE threads, outside the runtime.
    runtime: tokio::runtime::Handle,
}

impl Fetcher {
    /// Must be called within the runtime that will run the downloads.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        cache: Arc<DiskCache>,
        part_size: u64,
        max_concurrent_requests: usize,
        metrics: Arc<Metrics>,
    ) -> Arc<Fetcher> {
        Arc::new(Fetcher {
            store,
            cache,
            part_size: part_size.max(1),
            max_concurrent_requests,
            permits: Permits::new(max_concurrent_requests),
            prefetched: Mutex::new(HashSet::new()),
            uncached: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(max_concurrent_requests.max(1)).unwrap(),
            )),
            in_flight: Mutex::new(HashMap::new()),
            metrics,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    pub fn cache(&self) -> &Arc<DiskCache> {
        &self.cache
    }

    pub fn part_size(&self) -> u64 {
        self.part_size
    }

    /// The parts that bytes `range` of an object fall in.
    pub fn parts_of(&self, range: &Range<u64>) -> Range<u64> {
        spans_touched(range, self.part_size)
    }

    /// Bytes of the object that part `index` holds.
    pub fn part_range(&self, object: &ObjectInfo, index: u64) -> Range<u64> {
        span(index, self.part_size, object.size)
    }

    pub fn key(object: &ObjectInfo, index: u64) -> PartKey {
        PartKey {
            object: object.id,
            index,
        }
    }

    pub fn max_concurrent_requests(&self) -> usize {
        self.max_concurrent_requests
    }

    /// Downloads under way or queued.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.lock().len()
    }

    /// Records that a reader needs the part: counts a prefetch hit if the prefetcher
    /// brought it in.
    pub fn note_demand(&self, key: PartKey) {
        if self.prefetched.lock().remove(&key) {
            Metrics::add(&self.metrics.prefetch_hits, 1);
        }
    }

    /// Whether every part of `object` is in the disk cache.
    pub fn is_cached(&self, object: &ObjectInfo) -> bool {
        self.parts_of(&(0..object.size))
            .all(|index| self.cache.contains(Self::key(object, index)))
    }

    /// Whether the part is being downloaded now.
    fn is_in_flight(&self, key: PartKey) -> bool {
        self.in_flight.lock().contains_key(&key)
    }

    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// The part, waiting for a download if it is not cached.
    pub async fn part(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
    ) -> FsResult<PartBytes> {
        let key = Self::key(object, index);
        loop {
            if let Some(part) = self.cache.get(key) {
                return Ok(PartBytes::Cached(part));
            }
            if let Some(bytes) = self.uncached.lock().get(&key) {
                return Ok(PartBytes::Fetched(bytes.clone()));
            }
            // None: it landed in the cache meanwhile (or was evicted again: retry).
            if let Some(download) = self.start(object, index, Urgency::demand()) {
                return download.await.map(PartBytes::Fetched);
            }
        }
    }

    /// Starts downloading the part in the background unless it is cached or on its way.
    /// Returns whether a new download was started.
    pub fn prefetch(self: &Arc<Self>, object: &Arc<ObjectInfo>, index: u64) -> bool {
        let key = Self::key(object, index);
        if self.cache.contains(key) || self.is_in_flight(key) {
            return false;
        }
        let started = self.start(object, index, Urgency::prefetch()).is_some();
        if started {
            Metrics::add(&self.metrics.prefetch_requests, 1);
        }
        started
    }

    /// The part's download, joined or started; `None` if the part is cached by now.
    fn start(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        urgency: Arc<Urgency>,
    ) -> Option<SharedDownload> {
        let key = Self::key(object, index);
        let mut in_flight = self.in_flight.lock();
        if let Some(existing) = in_flight.get(&key) {
            if urgency.is_demand() {
                existing.urgency.raise();
            }
            return Some(existing.download.clone());
        }
        // A download finishes by caching, then leaving this map: checked under the
        // map's lock, a part is either cached or in flight, never fetched twice.
        if self.cache.contains(key) {
            return None;
        }
        let task = self.runtime.spawn({
            let (this, object, urgency) = (self.clone(), object.clone(), urgency.clone());
            async move {
                let result = this.download(&object, index, urgency.clone()).await;
                if result.is_ok() && !urgency.is_demand() {
                    this.prefetched.lock().insert(key);
                }
                this.in_flight.lock().remove(&key);
                result
            }
        });
        let download = async move {
            task.await.unwrap_or_else(|error| {
                tracing::error!(%error, "a download task failed");
                Err(FsError::CorruptData(format!(
                    "download task failed: {error}"
                )))
            })
        }
        .boxed()
        .shared();
        in_flight.insert(
            key,
            InFlight {
                download: download.clone(),
                urgency,
            },
        );
        Some(download)
    }

    async fn download(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        urgency: Arc<Urgency>,
    ) -> FsResult<Bytes> {
        let range = self.part_range(object, index);
        let mut attempt = 0;
        let bytes = loop {
            attempt += 1;
            // A slot is held for the request only, not for backoff or the disk write.
            let permit = self.permits.acquire(urgency.clone()).await;
            let fetched = self.get_range(object, range.clone()).await;
            drop(permit);
            match fetched {
                Ok(bytes) => break bytes,
                Err(error @ FsError::ObjectChanged { .. }) => {
                    return Err(self.failed(object, error));
                }
                Err(error) if attempt >= ATTEMPTS => return Err(self.failed(object, error)),
                Err(error) => {
                    tracing::warn!(object = %object.key, part = index, attempt, %error, "part download failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        };
        Metrics::add(&self.metrics.bytes_fetched, bytes.len() as u64);
        Metrics::add(&self.metrics.parts_fetched, 1);
        let (cache, key, group, stored, object_info) = (
            self.cache.clone(),
            Self::key(object, index),
            object.group,
            bytes.clone(),
            object.clone(),
        );
        let inserted = tokio::task::spawn_blocking(move || {
            let origin = PartOrigin {
                key: object_info.key.as_ref(),
                etag: object_info.etag.as_deref().unwrap_or_default(),
                object_offset: range.start,
            };
            cache.insert(key, group, origin, &stored)
        })
        .await;
        match inserted {
            Ok(true) => {}
            // No room, or the disk failed (the cache logs that once).
            Ok(false) => {
                self.uncached.lock().put(key, bytes.clone());
            }
            Err(error) => {
                tracing::error!(object = %object.key, part = index, %error, "caching the part failed; serving it from memory");
            }
        }
        Ok(bytes)
    }

    fn failed(&self, object: &ObjectInfo, error: FsError) -> FsError {
        Metrics::add(&self.metrics.fetch_errors, 1);
        tracing::error!(object = %object.key, %error, "download failed; readers get EIO");
        error
    }

    async fn get_range(&self, object: &ObjectInfo, range: Range<u64>) -> FsResult<Bytes> {
        let key = object.key.as_ref();
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            if_match: object.etag.clone(),
            ..Default::default()
        };
        let result = self
            .store
            .get_opts(&object.key, options)
            .await
            .map_err(|e| match e {
                object_store::Error::Precondition { .. } => FsError::ObjectChanged {
                    key: key.to_owned(),
                    pinned: object.etag.clone().unwrap_or_default(),
                },
                other => FsError::store(key, &other),
            })?;
        if let (Some(pinned), Some(now)) = (&object.etag, &result.meta.e_tag) {
            if pinned != now {
                return Err(FsError::ObjectChanged {
                    key: key.to_owned(),
                    pinned: pinned.clone(),
                });
            }
        }
        let bytes = result.bytes().await.map_err(|e| FsError::store(key, &e))?;
        let expected = range.end - range.start;
        if bytes.len() as u64 != expected {
            return Err(FsError::ShortRead {
                key: key.to_owned(),
                expected,
                got: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }
}
