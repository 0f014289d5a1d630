//! Downloads of parts: each part of each object is fetched once however many readers
//! and prefetches want it, at most `max_concurrent_requests` at a time, demand first
//! ([`permits`]), then stored in the disk cache.
//!
//! A download runs in its own task: a reader that gives up (an interrupted read) does
//! not cancel the download others may be waiting for. Every request asks for the
//! object's pinned version; the bytes handed out are always exactly the part.
//!
//! Retries are not made here: the object client is the one retry layer
//! ([`crate::store::bounds`]). The fetcher adds the hard bounds: a download runs at
//! most `read_timeout` once it holds a slot, and a reader waits at most `read_timeout`
//! for a part, then gets EIO ([`FsError::TimedOut`]) while the download may go on for
//! others.
//!
//! A reader waits only for its own bytes of a part: it is answered once the part's body
//! has passed them ([`arriving`]), and when they are far off (the download still
//! queued for a slot, or its body more than [`DIRECT_READ_LEAD`] short of them) it asks
//! the store for just its bytes too and takes whichever comes first. So the first read
//! of an epoch reaches the wire at once even while prefetches fill the link, at the
//! cost of one small extra request: one per download at most, so that a reader going
//! through a queued part in small pieces does not fetch it again piece by piece.
//!
//! A reader's few bytes of a part nobody is downloading, which the cache could take
//! only by evicting what the plans need sooner (a prefetch of it would wait for room),
//! are asked for alone and not cached: they are the kernel's read-around across a
//! chunk's edge into a chunk read many steps later, and their whole part would evict a
//! chunk for a few KiB of another.
//!
//! A body goes into its part's cache file as it arrives ([`crate::cache::spool`]), so a
//! download holds about a block of it in memory; only a part the cache cannot take
//! (no room, a failed disk) is received into memory whole. Memory is capped
//! ([`memory`]): every byte the fetcher holds (a body's unwritten block, a body
//! received whole, a part kept in memory because the cache had no room, an edge, a
//! reader's own range) counts against one budget, reserved before the request is sent
//! and released when the last copy of the bytes is dropped.

pub mod arriving;
pub mod memory;
pub mod permits;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::TryStreamExt;
use object_store::{GetResultPayload, ObjectStore};
use parking_lot::Mutex;

use crate::cache::adopt::ListedObject;
use crate::cache::spool::Spool;
use crate::cache::{Admission, DiskCache, PartOrigin, PinnedPart, Recency};
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::{pinned_get, ObjectInfo};
use crate::parts::{span, spans_touched, PartKey};
use crate::planner_wake::PlannerWake;
use arriving::Arriving;
use memory::MemoryBudget;
use permits::{Permit, Permits, Urgency};

/// How far ahead of a download's body a reader's bytes may be for the reader to wait
/// for the body rather than ask for its bytes itself: at a link's share of ~15 MB/s
/// (sixteen downloads on 2 Gbit/s), about 70 ms.
pub const DIRECT_READ_LEAD: u64 = 1 << 20;

/// The most bytes a reader asks for on its own: more is the part's download's work.
const DIRECT_READ_MAX: u64 = 1 << 20;
/// A plan's opening ([`permits`]) lasts until its reader's first row is read: a row's
/// offsets, its values, its column ids, each a read that waits for the network, and
/// one more for the offsets' check or a row across a part's edge.
const OPENING_READS: usize = 4;
/// The longest an opening holds prefetches, for a plan whose readers start late (a
/// DataLoader's workers) or read only what is cached.
const OPENING_LIMIT: Duration = Duration::from_millis(250);
/// Edges kept in memory at most: the read-around margins of the window being read and
/// of the windows a plan prefetches ahead of it (each window of four chunks has up to
/// sixteen; the default `--prefetch-lookahead` is four steps). An edge is of use only
/// while its window is read, and kept longer it only held memory: with 256 kept, the
/// fetcher's peak grew with the number of chunks of an epoch (8.7 MiB on a 1.46 GB
/// dataset, 20 MiB on 4.4 GB).
const EDGES_KEPT: usize = 96;
/// Memory a download into the part's cache file holds: its body's pieces until a
/// whole block can be written.
const SPOOL_BUFFER: u64 = 2 * crate::cache::part_file::BLOCK_LEN as u64;

/// Bytes of one part: from the disk cache, from its cache file while it is being
/// written, or in memory from `offset` on (a whole part from its download, or the
/// range a reader waited for).
pub enum PartBytes {
    Cached(PinnedPart),
    Spooled(Arc<Spool>),
    InMemory { offset: u64, bytes: Bytes },
}

impl PartBytes {
    fn whole(bytes: Bytes) -> PartBytes {
        PartBytes::InMemory { offset: 0, bytes }
    }

    /// Copies the part's bytes from `offset_in_part` into `out`, which they must cover.
    pub fn copy_to(&self, out: &mut [u8], offset_in_part: u64) -> FsResult<()> {
        match self {
            PartBytes::Cached(part) => Ok(part.read_exact_at(out, offset_in_part)?),
            PartBytes::Spooled(spool) => Ok(spool.read_exact_at(out, offset_in_part)?),
            PartBytes::InMemory { offset, bytes } => {
                let start = (offset_in_part - offset) as usize;
                out.copy_from_slice(&bytes[start..start + out.len()]);
                Ok(())
            }
        }
    }
}

/// Whether bytes `within` of a part of `part_len` bytes are few enough for a request of
/// their own: at most [`DIRECT_READ_MAX`], and less than half the part.
fn few_enough_to_ask_alone(within: &Range<u64>, part_len: u64) -> bool {
    let len = within.end - within.start;
    len <= DIRECT_READ_MAX && 2 * len < part_len
}

/// An object as the cache's adoption of an earlier mount's parts must know it.
pub fn listed_object(object: &ObjectInfo) -> ListedObject {
    ListedObject {
        id: object.id,
        key: object.key.to_string(),
        etag: object.etag.clone(),
        size: object.size,
        group: object.group,
    }
}

/// An edge being fetched: which bytes of its part, and whether its request is on the
/// wire (`true`), a watch whose sender is dropped when the edge ends.
struct EdgeInFlight {
    within: Range<u64>,
    on_the_wire: tokio::sync::watch::Receiver<bool>,
}

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

/// A download's end: its bytes are then all in its [`Arriving`].
type SharedDownload = Shared<BoxFuture<'static, FsResult<()>>>;

struct InFlight {
    download: SharedDownload,
    urgency: Arc<Urgency>,
    arriving: Arc<Arriving>,
}

pub struct Fetcher {
    store: Arc<dyn ObjectStore>,
    cache: Arc<DiskCache>,
    part_size: u64,
    max_concurrent_requests: usize,
    read_timeout: Duration,
    permits: Arc<Permits>,
    /// Parts the prefetcher brought in that no reader has asked for yet.
    prefetched: Mutex<HashSet<PartKey>>,
    /// The last parts the cache had no room for, kept in memory so that the reads
    /// that follow do not download them again (bounded: one per download slot, and
    /// only while the memory budget has room for another download).
    uncached: Mutex<lru::LruCache<PartKey, Bytes>>,
    /// Small ranges of parts fetched on their own ([`Fetcher::prefetch_edge`]), by part:
    /// the bytes from the offset in the part on. Bounded in count ([`EDGES_KEPT`]), and
    /// each held against the memory budget.
    edges: Mutex<lru::LruCache<PartKey, (u64, Bytes)>>,
    /// The parts whose edge is being fetched.
    edges_in_flight: Mutex<HashMap<PartKey, EdgeInFlight>>,
    memory: MemoryBudget,
    in_flight: Mutex<HashMap<PartKey, InFlight>>,
    /// Readers' requests for their own bytes ([`DIRECT_READ_LEAD`]), at most one per
    /// download slot; none when all are taken.
    direct_reads: tokio::sync::Semaphore,
    metrics: Arc<Metrics>,
    /// Rung after every download's end, once the part is cached and out of the
    /// in-flight map: the prefetcher waits on it for room and for newly local bytes.
    planner_wake: PlannerWake,
    /// Downloads are started from FUSE threads, outside the runtime.
    runtime: tokio::runtime::Handle,
}

/// How the fetcher is bounded.
#[derive(Clone, Copy, Debug)]
pub struct FetchLimits {
    /// The bytes of one download (the last part of an object may be shorter).
    pub part_size: u64,
    /// Downloads in flight at once.
    pub max_concurrent_requests: usize,
    /// How long a reader waits for its bytes, retries included.
    pub read_timeout: Duration,
    /// Bytes of bodies held in memory at once.
    pub memory_cap: u64,
}

impl Fetcher {
    /// Must be called within the runtime that will run the downloads.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        cache: Arc<DiskCache>,
        limits: FetchLimits,
        metrics: Arc<Metrics>,
        planner_wake: PlannerWake,
    ) -> Arc<Fetcher> {
        let FetchLimits {
            part_size,
            max_concurrent_requests,
            read_timeout,
            memory_cap,
        } = limits;
        let part_size = part_size.max(1);
        Arc::new(Fetcher {
            store,
            cache,
            part_size,
            max_concurrent_requests,
            read_timeout,
            memory: MemoryBudget::new(memory_cap.max(part_size), metrics.clone()),
            permits: Permits::new(max_concurrent_requests),
            prefetched: Mutex::new(HashSet::new()),
            uncached: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(max_concurrent_requests.max(1)).unwrap(),
            )),
            edges: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(EDGES_KEPT).unwrap(),
            )),
            edges_in_flight: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            direct_reads: tokio::sync::Semaphore::new(max_concurrent_requests.max(1)),
            metrics,
            planner_wake,
            runtime: tokio::runtime::Handle::current(),
        })
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

    /// A plan starts: prefetches are held back while its reader's first reads go over
    /// the link ([`permits`]).
    pub fn begin_opening(&self) {
        let until = std::time::Instant::now() + OPENING_LIMIT;
        self.permits.open(OPENING_READS, until);
        let permits = self.permits.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            permits.dispatch_now();
        });
    }

    /// A reader's read that waited for the network has its bytes.
    pub fn note_read_answered(&self) {
        self.permits.read_answered();
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

    /// The part, waiting (at most `read_timeout`) for a download if it is not cached.
    pub async fn part(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
    ) -> FsResult<PartBytes> {
        let range = self.part_range(object, index);
        self.bytes(object, index, 0..range.end - range.start).await
    }

    /// Bytes `within` of the part (offsets in the part), waiting at most `read_timeout`:
    /// from the cache, or as soon as they have arrived.
    pub async fn bytes(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        within: Range<u64>,
    ) -> FsResult<PartBytes> {
        tokio::time::timeout(self.read_timeout, self.wait_for(object, index, within))
            .await
            .unwrap_or_else(|_| {
                Err(FsError::TimedOut {
                    key: object.key.to_string(),
                    after: self.read_timeout,
                })
            })
    }

    async fn wait_for(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        within: Range<u64>,
    ) -> FsResult<PartBytes> {
        let key = Self::key(object, index);
        loop {
            if let Some(part) = self.cache.get(key, Recency::Use) {
                return Ok(PartBytes::Cached(part));
            }
            if let Some(held) = self.in_memory(key, &within) {
                return Ok(held);
            }
            if let Some(mut edge) = self.edge_on_the_wire(key, &within) {
                while edge.changed().await.is_ok() {}
                // Now in memory, or failed (and no longer in flight): look again.
                continue;
            }
            let part = self.part_range(object, index);
            let own = part.start + within.start..part.start + within.end;
            if self.is_stray(key, &within, part.end - part.start)
                && self.waits_for_room(object, index)
            {
                // Bytes of a chunk the plans read later (the kernel's read-around across
                // a chunk's edge, into a neighbour of another window): its whole part
                // would evict a chunk they need sooner, for a few KiB. A failed or refused
                // read leaves the reader to the download, as for any reader.
                if let Some(Ok(bytes)) = self.direct_read(object, own.clone()).await {
                    Metrics::add(&self.metrics.stray_reads, 1);
                    return Ok(PartBytes::InMemory {
                        offset: within.start,
                        bytes,
                    });
                }
            }
            // None: it landed in the cache meanwhile (or was evicted again: retry).
            let Some((download, arriving)) = self.start(object, index, Urgency::demand()) else {
                continue;
            };
            let streamed = async {
                tokio::select! {
                    biased;
                    ended = download => match ended {
                        Ok(()) => arriving.read(within.clone()).await,
                        Err(error) => Err(error),
                    },
                    read = arriving.read(within.clone()) => read,
                }
            };
            if !self.worth_a_direct_read(&arriving, &within, part.end - part.start) {
                return streamed.await;
            }
            tokio::select! {
                read = streamed => return read,
                // A failed or refused direct read leaves the reader to the download.
                Some(Ok(bytes)) = self.direct_read(object, own) => {
                    return Ok(PartBytes::InMemory { offset: within.start, bytes });
                }
            }
        }
    }

    /// Bytes `within` of the part, if memory holds them: the whole part (one the cache
    /// had no room for), or an edge covering them.
    pub fn in_memory(&self, key: PartKey, within: &Range<u64>) -> Option<PartBytes> {
        if let Some(bytes) = self.uncached.lock().get(&key) {
            return Some(PartBytes::whole(bytes.clone()));
        }
        let mut edges = self.edges.lock();
        let (offset, bytes) = edges.get(&key)?;
        let covers = *offset <= within.start && within.end <= offset + bytes.len() as u64;
        covers.then(|| PartBytes::InMemory {
            offset: *offset,
            bytes: bytes.clone(),
        })
    }

    /// Fetches bytes `range` of the object (within one part) on their own, at prefetch
    /// priority, and keeps them in memory for reads: the few bytes of a neighbouring
    /// chunk that the kernel reads around a window's chunk edges, which would otherwise
    /// cost their whole part, long before (or instead of) that chunk's own window. Not
    /// if the part is cached or on its way, its edge is held or coming, or the memory
    /// budget has no room now.
    pub fn prefetch_edge(self: &Arc<Self>, object: &Arc<ObjectInfo>, range: Range<u64>) {
        self.fetch_edge(object, range, Urgency::prefetch());
    }

    /// Fetches bytes `range` of the object (within one part) that a reader will ask for
    /// at once, as [`Fetcher::prefetch_edge`] does but at demand priority: a prefetch
    /// would queue behind a plan's.
    pub fn edge_for_next_read(self: &Arc<Self>, object: &Arc<ObjectInfo>, range: Range<u64>) {
        self.fetch_edge(object, range, Urgency::demand());
    }

    /// Starts downloading a part a reader will ask for at once, at demand priority,
    /// unless it is cached (one on its way is raised to demand).
    pub fn part_for_next_read(self: &Arc<Self>, object: &Arc<ObjectInfo>, index: u64) {
        self.start(object, index, Urgency::demand());
    }

    fn fetch_edge(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        range: Range<u64>,
        urgency: Arc<Urgency>,
    ) {
        let index = range.start / self.part_size;
        let key = Self::key(object, index);
        let part_start = index * self.part_size;
        let within = range.start - part_start..range.end - part_start;
        debug_assert!(
            range.end <= part_start + self.part_size,
            "an edge within one part"
        );
        if self.cache.contains(key) || self.in_memory(key, &within).is_some() {
            return;
        }
        // A reader's next read of a part on its way waits for the download's body,
        // unless its bytes are far from it: then, as that read would, it asks for them
        // on its own (taking the download's one direct read).
        let downloading = self.in_flight.lock().get(&key).map(|d| d.arriving.clone());
        if downloading.is_some() && !urgency.is_demand() {
            return;
        }
        let Some(memory) = self.memory.try_reserve(range.end - range.start) else {
            return;
        };
        let (on_the_wire, watched) = tokio::sync::watch::channel(false);
        match self.edges_in_flight.lock().entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => return,
            std::collections::hash_map::Entry::Vacant(entry) => {
                let part_len = self.part_range(object, index).end - part_start;
                if let Some(arriving) = downloading {
                    if !self.worth_a_direct_read(&arriving, &within, part_len) {
                        return;
                    }
                }
                entry.insert(EdgeInFlight {
                    within: within.clone(),
                    on_the_wire: watched,
                });
            }
        }
        let slot = self.permits.request(urgency);
        let (this, object) = (self.clone(), object.clone());
        // Built here, not in the task: a task dropped before its first poll leaves too.
        let leave = LeaveEdgesInFlight {
            fetcher: self.clone(),
            key,
            on_the_wire,
        };
        self.runtime.spawn(async move {
            let _permit = slot.granted().await;
            leave.on_the_wire.send_replace(true);
            let len = range.end - range.start;
            // Counted as sent, so that the store's count of requests can be accounted.
            Metrics::add(&this.metrics.edges_fetched, 1);
            let read = tokio::time::timeout(this.read_timeout, async {
                let result = pinned_get(this.store.as_ref(), &object, Some(range)).await?;
                result
                    .bytes()
                    .await
                    .map_err(|e| FsError::store(object.key.as_ref(), &e))
            })
            .await;
            match read {
                Ok(Ok(bytes)) if bytes.len() as u64 == len => {
                    Metrics::add(&this.metrics.bytes_fetched, len);
                    let bytes = memory.hold(bytes);
                    this.edges.lock().put(key, (within.start, bytes));
                }
                // An edge is advice: a reader that needs the bytes fetches their part.
                Ok(Ok(_)) | Ok(Err(_)) | Err(_) => {
                    tracing::debug!(object = %object.key, "an edge's prefetch failed");
                }
            }
            drop(leave);
        });
    }

    /// The end of the edge whose request is on the wire and covers bytes `within` of
    /// the part, if there is one: its bytes come no later than a reader's own request
    /// for them would.
    fn edge_on_the_wire(
        &self,
        key: PartKey,
        within: &Range<u64>,
    ) -> Option<tokio::sync::watch::Receiver<bool>> {
        let edges = self.edges_in_flight.lock();
        let edge = edges.get(&key)?;
        let covers = edge.within.start <= within.start && within.end <= edge.within.end;
        // A closed watch: the fetch is over, whatever its entry says; waiting on it
        // would end at once, again and again.
        let fetching = edge.on_the_wire.has_changed().is_ok();
        (covers && fetching && *edge.on_the_wire.borrow()).then(|| edge.on_the_wire.clone())
    }

    /// Whether a reader of `within` should ask for its own bytes beside the download:
    /// they are few, less than half their part (more would repeat the download), the
    /// download waits for a slot or its body is far short of them, and no reader asked
    /// beside this download before. One direct read per download gets the first
    /// reader its bytes at once; more would let a reader that reads a part in small
    /// pieces faster than slots free up fetch all of it again beside its download.
    fn worth_a_direct_read(&self, arriving: &Arriving, within: &Range<u64>, part_len: u64) -> bool {
        few_enough_to_ask_alone(within, part_len)
            && (!arriving.is_sent() || within.end > arriving.received() + DIRECT_READ_LEAD)
            && arriving.claim_direct_read()
    }

    /// Whether a reader's bytes of a part nobody is downloading are few enough to ask
    /// for alone rather than with their part.
    fn is_stray(&self, key: PartKey, within: &Range<u64>, part_len: u64) -> bool {
        few_enough_to_ask_alone(within, part_len) && !self.is_in_flight(key)
    }

    /// Bytes `range` of the object in one request of their own, if a direct-read slot
    /// and the memory are free now (`None` otherwise).
    async fn direct_read(&self, object: &ObjectInfo, range: Range<u64>) -> Option<FsResult<Bytes>> {
        let _slot = self.direct_reads.try_acquire().ok()?;
        let len = range.end - range.start;
        let memory = self.memory.try_reserve(len)?;
        // Counted as sent: a reader answered by the download first drops this request.
        Metrics::add(&self.metrics.direct_reads, 1);
        let read = tokio::time::timeout(self.read_timeout, async {
            let result = pinned_get(self.store.as_ref(), object, Some(range)).await?;
            result
                .bytes()
                .await
                .map_err(|e| FsError::store(object.key.as_ref(), &e))
        })
        .await
        .unwrap_or_else(|_| {
            Err(FsError::TimedOut {
                key: object.key.to_string(),
                after: self.read_timeout,
            })
        });
        Some(match read {
            Ok(bytes) if bytes.len() as u64 == len => {
                Metrics::add(&self.metrics.bytes_fetched, len);
                Ok(memory.hold(bytes))
            }
            Ok(bytes) => Err(FsError::ShortRead {
                key: object.key.to_string(),
                expected: len,
                got: bytes.len() as u64,
            }),
            Err(error) => {
                tracing::debug!(object = %object.key, %error, "a direct read failed; waiting for the part");
                Err(error)
            }
        })
    }

    /// Starts downloading the part in the background unless it is cached or on its way,
    /// or the cache could take it only by evicting what a plan needs sooner than it
    /// ([`Admission::Prefetch`]). Returns whether a new download was started.
    pub fn prefetch(self: &Arc<Self>, object: &Arc<ObjectInfo>, index: u64) -> bool {
        let key = Self::key(object, index);
        if self.cache.contains(key) || self.is_in_flight(key) || self.waits_for_room(object, index)
        {
            return false;
        }
        let started = self.start(object, index, Urgency::prefetch()).is_some();
        if started {
            Metrics::add(&self.metrics.prefetch_requests, 1);
        }
        started
    }

    /// Whether a prefetch of the part should wait for room
    /// ([`DiskCache::prefetch_waits_for_room`]), which the steps being read free.
    fn waits_for_room(&self, object: &ObjectInfo, index: u64) -> bool {
        let range = self.part_range(object, index);
        self.cache.prefetch_waits_for_room(
            Self::key(object, index),
            object.group,
            origin_of(object, range.start),
            range.end - range.start,
        )
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
    fn start(
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
        let mut slot = self.permits.request(urgency.clone());
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

    /// Downloads the part on the slot `permit`, its body into `arriving` as it comes:
    /// into the part's cache file if the cache has room for it, otherwise into memory,
    /// then cached if room appeared meanwhile or kept in memory for the next reads. A
    /// cache file that fails while it is written turns caching off
    /// ([`DiskCache::spool`]) and the download starts over into memory.
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
                match self.receive(object, range.clone(), arriving).await {
                    Err(FsError::CacheIo(error)) => {
                        tracing::warn!(object = %object.key, part = index, %error, "writing the part's cache file failed; downloading it again into memory");
                    }
                    received => return received.map(|()| Some(Received::Spooled(spool))),
                }
            }
            let memory = self.reserve_memory(len).await;
            arriving.keep_in_memory(len as usize);
            self.receive(object, range.clone(), arriving).await?;
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
        Metrics::add(&self.metrics.bytes_fetched, len);
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
    async fn reserve_memory(&self, len: u64) -> memory::Reservation {
        loop {
            if let Some(reservation) = self.memory.try_reserve(len) {
                return reservation;
            }
            if self.uncached.lock().pop_lru().is_none() && self.edges.lock().pop_lru().is_none() {
                return self.memory.reserve(len).await;
            }
        }
    }

    fn failed(&self, object: &ObjectInfo, index: u64, error: FsError) -> FsError {
        Metrics::add(&self.metrics.fetch_errors, 1);
        tracing::error!(object = %object.key, part = index, %error, "download failed; readers get EIO");
        error
    }

    /// Receives bytes `range` of the object into `arriving`, piece by piece as the body
    /// comes (a local file in one read), exactly `range`'s length or an error.
    async fn receive(
        &self,
        object: &ObjectInfo,
        range: Range<u64>,
        arriving: &Arriving,
    ) -> FsResult<()> {
        let key = object.key.as_ref();
        let expected = range.end - range.start;
        let result = pinned_get(self.store.as_ref(), object, Some(range)).await?;
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
                if received + piece.len() as u64 > expected {
                    received += piece.len() as u64;
                    break;
                }
                received = arriving.push(piece).await?;
            }
        }
        if received != expected {
            return Err(FsError::ShortRead {
                key: key.to_owned(),
                expected,
                got: received,
            });
        }
        arriving.end().await?;
        Ok(())
    }
}

/// An edge's fetch, which leaves the set of edges in flight however it ends (a panic,
/// or its task dropped, included), then closes its watch: readers waiting for the
/// edge then find it in memory, or fetch its part.
struct LeaveEdgesInFlight {
    fetcher: Arc<Fetcher>,
    key: PartKey,
    /// Whether the edge's request is on the wire; dropped after the entry is gone.
    on_the_wire: tokio::sync::watch::Sender<bool>,
}

impl Drop for LeaveEdgesInFlight {
    fn drop(&mut self) {
        self.fetcher.edges_in_flight.lock().remove(&self.key);
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

#[cfg(test)]
mod in_process_tests;
