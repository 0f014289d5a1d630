//! The download pipeline: a part's download started once however many want it, run in
//! its own task under a slot and a memory reservation, its body spooled into the
//! part's cache file as it arrives (or received whole when the cache cannot take it),
//! then committed to the cache.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::FutureExt;
use futures::TryStreamExt;
use object_store::GetResultPayload;

use super::arriving::Arriving;
use super::memory::{self};
use super::permits::{Permit, Request, Urgency, SMALL_REQUEST_BYTES};
use super::{listed_object, Fetcher, InFlight, SharedDownload, DIRECT_READ_MAX, SPOOL_BUFFER};
use crate::cache::spool::Spool;
use crate::cache::{Admission, PartOrigin};
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::{pinned_by_etag, pinned_get, ObjectInfo};
use crate::parts::PartKey;

/// Where a downloaded body went.
enum Received {
    /// Into the part's cache file, to be committed.
    Spooled(Arc<Spool>),
    /// Into memory, whole (the cache could not take it).
    Whole(Bytes),
}

/// What a part file of bytes from `object_offset` on of `object` records of it.
fn origin_of(object: &ObjectInfo, object_offset: u64) -> PartOrigin<'_> {
    PartOrigin {
        key: object.key.as_ref(),
        etag: object.etag.as_deref().unwrap_or_default(),
        object_offset,
    }
}

/// How a download that did not fail ended.
enum Ending {
    /// Its bytes are all in its [`Arriving`].
    Fetched,
    /// A prefetch that left before its request: the cache had room for it only by
    /// evicting what a plan needs sooner ([`Fetcher::waits_for_room`]).
    WaitsForRoom,
}

/// The eviction rights of a download's reservation: a reader's, or a prefetch's.
fn admission(urgency: &Urgency) -> Admission {
    if urgency.is_demand() {
        Admission::Demand
    } else {
        Admission::Prefetch
    }
}

// Not a type of its own: the pipeline is the Fetcher's own work, over its cache, slots, memory, downloads in flight, parts kept in memory and edges.
impl Fetcher {
    /// Starts downloading the part in the background unless it is cached or on its way,
    /// or the cache could take it only by evicting what a plan needs sooner than it
    /// ([`Admission::Prefetch`]). Returns whether a new download was started.
    pub fn prefetch(self: &Arc<Self>, object: &Arc<ObjectInfo>, index: u64) -> bool {
        self.start_prefetch(object, index).is_some()
    }

    /// Starts the part's prefetch as [`Fetcher::prefetch`] does and, if this call
    /// started it or it was downloading already, runs `then` once the download has
    /// ended without an error: the part is cached then, or was left for lack of room,
    /// so `then` must look again. Returns whether a new download was started.
    pub fn prefetch_then(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        then: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let started = self.start_prefetch(object, index);
        let download = started.clone().or_else(|| {
            let in_flight = self.in_flight.lock();
            let existing = in_flight.get(&Self::key(object, index))?;
            Some(existing.download.clone())
        });
        if let Some(download) = download {
            self.runtime.spawn(async move {
                if download.await.is_ok() {
                    then.await;
                }
            });
        }
        started.is_some()
    }

    fn start_prefetch(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
    ) -> Option<SharedDownload> {
        let key = Self::key(object, index);
        if self.cache.contains(key) || self.is_in_flight(key) || self.waits_for_room(object, index)
        {
            return None;
        }
        let (download, _) = self.start(object, index, Urgency::prefetch())?;
        Metrics::add(&self.metrics.prefetch_requests, 1);
        Some(download)
    }

    /// Whether a prefetch of the part should wait for room
    /// ([`DiskCache::prefetch_waits_for_room`](crate::cache::DiskCache::prefetch_waits_for_room)), which the steps being read free.
    pub(super) fn waits_for_room(&self, object: &ObjectInfo, index: u64) -> bool {
        let range = self.part_range(object, index);
        self.cache.prefetch_waits_for_room(
            Self::key(object, index),
            object.group,
            origin_of(object, range.start),
            range.end - range.start,
        )
    }

    /// Whether bytes `own` of an SCDL chunk's array lie within [`DIRECT_READ_MAX`] of
    /// its start or end, in a part no plan reads within its announced steps while plans
    /// read others: where the kernel's read-around from a window being read crosses into
    /// a chunk the plans reach later, if at all.
    ///
    /// Only a chunk's object: a monolithic array's ends are no chunk's edges, and in an
    /// array of a few MiB every part lies near one. A reader there whose plan has not
    /// located its step yet (the row offsets that place a virtual chunk on its way) would
    /// fetch each of its reads alone and never the part they make up.
    pub(super) fn read_around_into_unplanned(
        &self,
        object: &ObjectInfo,
        index: u64,
        own: &Range<u64>,
    ) -> bool {
        let near_an_edge =
            own.start < DIRECT_READ_MAX || own.end.saturating_add(DIRECT_READ_MAX) > object.size;
        object.group.is_some()
            && near_an_edge
            && self
                .cache
                .unranked_beside_plans(Self::key(object, index), object.group)
    }

    /// Brings the part into the cache at prefetch priority, waiting for its download
    /// (bounded by the per-request deadline), joined or started; at once if cached.
    pub async fn fetch_in_background(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
    ) -> FsResult<()> {
        match self.start(object, index, Urgency::prefetch()) {
            Some((download, _)) => download.await,
            None => Ok(()),
        }
    }

    /// The part's download and its arriving bytes, joined or started; `None` if the part
    /// is cached by now. While the earlier mount's part files are still being adopted,
    /// the part's own file, if one is on disk, is claimed first (one header read).
    pub(super) fn start(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        urgency: Arc<Urgency>,
    ) -> Option<(SharedDownload, Arc<Arriving>)> {
        let key = Self::key(object, index);
        if self.cache.claims_pending()
            && self
                .cache
                .claim_own(&listed_object(object), self.part_size, index)
        {
            return None;
        }
        let mut in_flight = self.in_flight.lock();
        if let Some(existing) = in_flight.get(&key) {
            if urgency.is_demand() {
                self.permits.raise(&existing.urgency);
            }
            return Some((existing.download.clone(), existing.arriving.clone()));
        }
        // A download finishes by caching, then leaving this map: checked under the
        // map's lock, a part is either cached or in flight, never fetched twice.
        if self.cache.contains(key) {
            return None;
        }
        if urgency.is_demand() {
            Metrics::add(&self.metrics.demand_downloads, 1);
        }
        // Queued here, so that whether the request is on the wire is known at once.
        let mut slot = self.slot_request(self.part_range(object, index), urgency.clone());
        let granted = slot.now();
        let arriving = Arc::new(Arriving::default());
        if granted.is_some() {
            arriving.mark_sent();
        }
        let task = self.runtime.spawn({
            let (this, object, urgency, arriving) = (
                self.clone(),
                object.clone(),
                urgency.clone(),
                arriving.clone(),
            );
            async move {
                // Leaves the map however the download ends, a panic included: a part
                // whose download died is fetched afresh by the next reader.
                let mut leave = LeaveInFlight {
                    fetcher: this.clone(),
                    key,
                    arriving: arriving.clone(),
                    wake_planner: true,
                };
                let permit = match granted {
                    Some(permit) => permit,
                    None => slot.granted().await,
                };
                arriving.mark_sent();
                match this
                    .download(&object, index, permit, &arriving, &urgency)
                    .await?
                {
                    Ending::Fetched if !urgency.is_demand() => {
                        this.prefetched.lock().insert(key);
                    }
                    Ending::Fetched => {}
                    // Nothing changed that a new top-up could use.
                    Ending::WaitsForRoom => leave.wake_planner = false,
                }
                Ok(())
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
                arriving: arriving.clone(),
            },
        );
        Some((download, arriving))
    }

    /// A place in the queue for a download slot for bytes `range`: beside the slots
    /// for a few bytes a reader waits for ([`Permits::request_small`](super::permits::Permits::request_small)), at most
    /// [`SMALL_REQUEST_BYTES`] and a quarter of a part (as an edge is).
    pub(super) fn slot_request(&self, range: Range<u64>, urgency: Arc<Urgency>) -> Request {
        if range.end - range.start <= SMALL_REQUEST_BYTES.min(self.part_size / 4) {
            self.permits.request_small(urgency)
        } else {
            self.permits.request(urgency)
        }
    }

    /// Downloads the part on the slot `permit`, its body into `arriving` as it comes:
    /// into the part's cache file if the cache has room for it, otherwise into memory,
    /// then cached if room appeared meanwhile or kept in memory for the next reads. A
    /// cache file that fails while it is written turns caching off
    /// ([`DiskCache::spool`](crate::cache::DiskCache::spool)) and the download starts over into memory.
    async fn download(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        permit: Permit,
        arriving: &Arriving,
        urgency: &Urgency,
    ) -> FsResult<Ending> {
        let range = self.part_range(object, index);
        let len = range.end - range.start;
        let key = Self::key(object, index);
        let held = self.edges.held_edge(key, len);
        let fetched = tokio::time::timeout(self.read_timeout, async {
            let mut spooled = self.spool(object, index, admission(urgency)).await;
            if spooled.is_none() && !urgency.is_demand() && self.waits_for_room(object, index) {
                if self.leave_unwaited(key, urgency) {
                    return Ok(None);
                }
                // A reader joined meanwhile: its part may take any room.
                spooled = self.spool(object, index, Admission::Demand).await;
            }
            if let Some(spool) = spooled {
                let _buffer = self.reserve_memory(SPOOL_BUFFER.min(len)).await;
                arriving.spool_into(spool.clone());
                match self.receive(object, range.clone(), held.as_ref(), arriving).await {
                    Err(FsError::CacheIo(error)) => {
                        tracing::warn!(object = %object.key, part = index, %error, "writing the part's cache file failed; downloading it again into memory");
                    }
                    received => return received.map(|()| Some(Received::Spooled(spool))),
                }
            }
            let memory = self.reserve_memory(len).await;
            arriving.keep_in_memory(len as usize);
            self.receive(object, range.clone(), held.as_ref(), arriving)
                .await?;
            Ok(Some(Received::Whole(arriving.finish(|body| memory.hold(body)))))
        })
        .await
        .unwrap_or_else(|_| {
            Err(FsError::TimedOut {
                key: object.key.to_string(),
                after: self.read_timeout,
            })
        });
        // A slot is held for the request only, not for the disk write.
        drop(permit);
        let Some(received) = fetched.map_err(|error| self.failed(object, index, error))? else {
            return Ok(Ending::WaitsForRoom);
        };
        let reused = held.as_ref().map_or(0, |(_, bytes)| bytes.len() as u64);
        Metrics::add(&self.metrics.bytes_fetched, len - reused);
        Metrics::add(&self.metrics.edge_bytes_reused, reused);
        Metrics::add(&self.metrics.parts_fetched, 1);
        let cached = match received {
            Received::Spooled(spool) => tokio::task::spawn_blocking(move || spool.commit()).await,
            Received::Whole(whole) => {
                let (cache, object_info, kept) =
                    (self.cache.clone(), object.clone(), whole.clone());
                let inserted = tokio::task::spawn_blocking(move || {
                    let origin = origin_of(&object_info, range.start);
                    cache.insert(key, object_info.group, origin, &whole)
                })
                .await;
                // No room, or the disk failed (the cache logs that once).
                if matches!(inserted, Ok(false)) && self.memory.has_room_for(self.part_size) {
                    self.uncached.lock().put(key, kept);
                }
                inserted
            }
        };
        if let Err(error) = cached {
            tracing::error!(object = %object.key, part = index, %error, "caching the part failed; its waiters are served from its download");
        }
        if self.cache.contains(key) {
            // Its part serves the edge's bytes now: the memory goes back to the budget.
            self.edges.forget(key);
        }
        Ok(Ending::Fetched)
    }

    /// Ends a prefetch's download before its request, unless a reader waits for it
    /// (has raised its urgency): checked and done under the lock readers join under, so
    /// no reader joins a download that brings nothing. Returns whether it ended.
    fn leave_unwaited(&self, key: PartKey, urgency: &Urgency) -> bool {
        let mut in_flight = self.in_flight.lock();
        if urgency.is_demand() {
            return false;
        }
        in_flight.remove(&key);
        true
    }

    /// The part's cache file, created with its room reserved, if the cache can take it
    /// evicting only what `admission` may.
    async fn spool(
        &self,
        object: &Arc<ObjectInfo>,
        index: u64,
        admission: Admission,
    ) -> Option<Arc<Spool>> {
        let (cache, object, key) = (self.cache.clone(), object.clone(), Self::key(object, index));
        let range = self.part_range(&object, index);
        tokio::task::spawn_blocking(move || {
            let origin = origin_of(&object, range.start);
            cache.spool(
                key,
                object.group,
                origin,
                range.end - range.start,
                admission,
            )
        })
        .await
        .ok()
        .flatten()
        .map(Arc::new)
    }

    /// Reserves `len` bytes of the budget, first dropping parts and edges kept in memory
    /// if the budget is short. Parts are kept only while a whole part more fits, so a
    /// waiter here never waits behind kept bytes, only behind downloads and readers.
    async fn reserve_memory(&self, len: u64) -> memory::MemoryReservation {
        loop {
            if let Some(reservation) = self.memory.try_reserve(len) {
                return reservation;
            }
            if self.uncached.lock().pop_lru().is_none() && !self.edges.drop_oldest() {
                return self.memory.reserve(len).await;
            }
        }
    }

    fn failed(&self, object: &ObjectInfo, index: u64, error: FsError) -> FsError {
        Metrics::add(&self.metrics.fetch_errors, 1);
        tracing::error!(object = %object.key, part = index, %error, "download failed; readers get EIO");
        error
    }

    /// Receives bytes `range` of the object into `arriving`: those of the `held` edge
    /// (at the range's start or end) from memory, the rest from the store, piece by
    /// piece as the body comes; exactly `range`'s length or an error.
    async fn receive(
        &self,
        object: &ObjectInfo,
        range: Range<u64>,
        held: Option<&(u64, Bytes)>,
        arriving: &Arriving,
    ) -> FsResult<()> {
        let (request, before, after) = match held {
            Some((0, bytes)) => (
                range.start + bytes.len() as u64..range.end,
                Some(bytes),
                None,
            ),
            Some((offset, bytes)) => (range.start..range.start + offset, None, Some(bytes)),
            None => (range, None, None),
        };
        if let Some(bytes) = before {
            arriving.push(bytes.clone()).await?;
        }
        if !request.is_empty() {
            self.receive_from_store(object, request, held.is_some(), arriving)
                .await?;
        }
        if let Some(bytes) = after {
            arriving.push(bytes.clone()).await?;
        }
        arriving.end().await
    }

    /// Appends bytes `range` of the object, from the store, to `arriving`: exactly
    /// `range`'s length or an error. `joined`: the part holds an edge's bytes too, so
    /// the answer must be pinned by its ETag as the edge's was.
    async fn receive_from_store(
        &self,
        object: &ObjectInfo,
        range: Range<u64>,
        joined: bool,
        arriving: &Arriving,
    ) -> FsResult<()> {
        let key = object.key.as_ref();
        let expected = range.end - range.start;
        let result = pinned_get(self.store.as_ref(), object, Some(range)).await?;
        if joined && !pinned_by_etag(object, &result.meta) {
            return Err(FsError::VersionUnconfirmed {
                key: key.to_owned(),
            });
        }
        let mut received = 0;
        if matches!(result.payload, GetResultPayload::File(..)) {
            let bytes = result.bytes().await.map_err(|e| FsError::store(key, &e))?;
            received = bytes.len() as u64;
            if received == expected {
                arriving.push(bytes).await?;
            }
        } else {
            let mut body = result.into_stream();
            while let Some(piece) = body.try_next().await.map_err(|e| FsError::store(key, &e))? {
                received += piece.len() as u64;
                if received > expected {
                    break;
                }
                arriving.push(piece).await?;
            }
        }
        if received != expected {
            return Err(FsError::ShortRead {
                key: key.to_owned(),
                expected,
                got: received,
            });
        }
        Ok(())
    }
}

struct LeaveInFlight {
    fetcher: Arc<Fetcher>,
    key: PartKey,
    /// Which download this is: one that left early ([`Fetcher::leave_unwaited`]) may
    /// have a successor in the map by now, which stays.
    arriving: Arc<Arriving>,
    wake_planner: bool,
}

impl Drop for LeaveInFlight {
    fn drop(&mut self) {
        {
            let mut in_flight = self.fetcher.in_flight.lock();
            if in_flight
                .get(&self.key)
                .is_some_and(|entry| Arc::ptr_eq(&entry.arriving, &self.arriving))
            {
                in_flight.remove(&self.key);
            }
        }
        if self.wake_planner {
            self.fetcher.planner_wake.ring();
        }
    }
}
