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
//! for a part, then gets EIO ([`FsError::TimedOut`](crate::error::FsError::TimedOut)) while the download may go on for
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
//! download holds about a megabyte of it in memory (a batch of blocks gathered for one
//! write, [`arriving::WRITE_BATCH`]); only a part the cache cannot take
//! (no room, a failed disk) is received into memory whole. Memory is capped
//! ([`memory`]): every byte the fetcher holds (a body's unwritten blocks, a body
//! received whole, a part kept in memory because the cache had no room, an edge, a
//! plan's exact ranges ([`planned`]), a reader's own range) counts against one budget, reserved before the request is sent
//! and released when the last copy of the bytes is dropped.

pub mod arriving;
mod direct;
mod download;
mod edges;
pub mod memory;
pub mod permits;
mod planned;
mod waits;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use object_store::{ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;

use crate::cache::adopt::ListedObject;
use crate::cache::spool::Spool;
use crate::cache::{DiskCache, PinnedPart};
use crate::error::FsResult;
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::parts::{span, spans_touched, GroupId, PartKey};
use crate::planner_wake::PlannerWake;
use arriving::Arriving;
use direct::DirectReads;
use edges::Edges;
use memory::MemoryBudget;
use permits::{Permits, Urgency};
pub use planned::Planned;
use planned::PlannedFetches;

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
/// Connections opened ahead of a starting plan's first row
/// ([`Fetcher::open_connections_for`]): its offsets, then its values and column ids.
const CONNECTIONS_PER_PLAN_START: usize = 3;
/// The longest an opening holds prefetches, for a plan whose readers start late (a
/// DataLoader's workers) or read only what is cached.
const OPENING_LIMIT: Duration = Duration::from_millis(250);
/// Edges kept in memory at most: the read-around margins of the window being read and
/// of the windows a plan prefetches ahead of it (each window of four chunks has up to
/// sixteen; the default `--prefetch-lookahead` is four steps). An edge is of use while
/// its window is read, and to its part's download if that comes soon after (more kept
/// did not raise the bytes reused: 256 reused as much as 96); kept longer, it only held
/// memory: with 256 kept and never given back, the fetcher's peak grew with the number
/// of chunks of an epoch (8.7 MiB on a 1.46 GB dataset, 20 MiB on 4.4 GB).
const EDGES_KEPT: usize = 96;
/// Memory a download into the part's cache file holds: two buffers of a batch of whole
/// blocks ([`arriving::WRITE_BATCH`]) and the piece that completes it, one filling
/// while the other is written.
const SPOOL_BUFFER: u64 =
    2 * (arriving::WRITE_BATCH as u64 + crate::cache::part_file::BLOCK_LEN as u64);

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
    /// Small ranges of parts fetched on their own ([`Fetcher::prefetch_edge`]), held
    /// or being fetched ([`edges`]).
    edges: Edges,
    /// The exact bytes of planned rows ([`Fetcher::prefetch_planned`], [`planned`]).
    planned: PlannedFetches,
    memory: MemoryBudget,
    in_flight: Mutex<HashMap<PartKey, InFlight>>,
    /// Readers' requests for their own bytes ([`DIRECT_READ_LEAD`]), and every ranged
    /// GET of bytes held in memory ([`direct`]).
    direct: DirectReads,
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
            store: store.clone(),
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
            edges: Edges::new(),
            planned: PlannedFetches::new(),
            in_flight: Mutex::new(HashMap::new()),
            direct: DirectReads::new(
                max_concurrent_requests.max(1),
                store.clone(),
                read_timeout,
                metrics.clone(),
            ),
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

    /// The part that bytes `range` of the object lie in, and where they are in it: the
    /// range is within one part (a range fetched on its own is a part's or less).
    fn part_holding(&self, object: &ObjectInfo, range: &Range<u64>) -> (PartKey, Range<u64>) {
        let index = range.start / self.part_size;
        let part_start = index * self.part_size;
        debug_assert!(
            range.end <= part_start + self.part_size,
            "a range within one part"
        );
        let within = range.start - part_start..range.end - part_start;
        (Fetcher::key(object, index), within)
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

    /// A plan starts while another's opening is under way: its reader's first reads join
    /// that opening ([`permits::Permits::join`]). `false` if none is under way.
    pub fn join_opening(&self) -> bool {
        self.permits.join(OPENING_READS)
    }

    /// Opens connections to the store for a starting plan's first reads before they are
    /// made: HEADs of `object`, whose answers are dropped and whose connections stay in
    /// the client's pool. A reader's first row makes up to three requests at once.
    pub fn open_connections_for(&self, object: &Arc<ObjectInfo>) {
        for _ in 0..CONNECTIONS_PER_PLAN_START {
            let (store, key, deadline) =
                (self.store.clone(), object.key.clone(), self.read_timeout);
            self.runtime.spawn(async move {
                let _ = tokio::time::timeout(deadline, store.head(&key)).await;
            });
        }
    }

    /// A reader's read that waited for the network has its bytes.
    pub fn note_read_answered(&self) {
        self.permits.read_answered();
    }

    /// Downloads and edges under way or queued: what bounds the prefetches a top-up
    /// may leave queued.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.lock().len() + self.edges.in_flight_count()
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
    pub(crate) fn is_in_flight(&self, key: PartKey) -> bool {
        self.in_flight.lock().contains_key(&key)
    }

    /// Fetches bytes `range` of the object (within one part) on their own, at prefetch
    /// priority, and keeps them in memory for reads: the few bytes of a neighbouring
    /// chunk that the kernel reads around a window's chunk edges, which would otherwise
    /// cost their whole part, long before (or instead of) that chunk's own window. Not
    /// if the part is cached or on its way, its edge is held or coming, or the memory
    /// budget has no room now.
    pub fn prefetch_edge(self: &Arc<Self>, object: &Arc<ObjectInfo>, range: Range<u64>) {
        self.edges.fetch(self, object, range, Urgency::prefetch());
    }

    /// Fetches bytes `range` of the object (within one part) that a reader will ask for
    /// at once, as [`Fetcher::prefetch_edge`] does but at demand priority: a prefetch
    /// would queue behind a plan's.
    pub fn edge_for_next_read(self: &Arc<Self>, object: &Arc<ObjectInfo>, range: Range<u64>) {
        self.edges.fetch(self, object, range, Urgency::demand());
    }

    /// Starts downloading a part a reader will ask for at once, at demand priority,
    /// unless it is cached (one on its way is raised to demand).
    pub fn part_for_next_read(self: &Arc<Self>, object: &Arc<ObjectInfo>, index: u64) {
        self.start(object, index, Urgency::demand());
    }

    /// Fetches bytes `range` of the object (within one part) on their own, at prefetch
    /// priority, and holds them for reads until [`Fetcher::release_planned`]; `done`
    /// runs once they are held (only if the request was [`Planned::Started`]). Not if
    /// the part is cached or downloading, the bytes are held or coming already, or the
    /// memory budget has no room now.
    pub fn prefetch_planned(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        range: Range<u64>,
        done: impl FnOnce() + Send + 'static,
    ) -> Planned {
        self.planned.prefetch(self, object, range, done)
    }

    /// Gives up the planned bytes held of the part within `within`: they are in the
    /// page cache now. Wakes the prefetcher if a range waits for that room.
    pub fn release_planned(&self, key: PartKey, within: &Range<u64>) {
        if self.planned.release(key, within) {
            self.planner_wake.ring();
        }
    }

    /// Whether `len` more planned bytes may be asked for now: a range is asked for
    /// whole or not at all, so that no piece of it is held waiting for another that
    /// found no room.
    pub fn has_planned_room_for(&self, len: u64) -> bool {
        self.planned.has_room_for(len)
    }

    /// The plans fetch the rows of chunk `group` exactly: a reader's few bytes of its
    /// parts (a row the plan does not name, the kernel's read-around of one it does)
    /// are asked for alone, as its whole part would be evicted before the plans come
    /// back to it.
    pub fn read_exactly(&self, group: GroupId) {
        self.planned.read_exactly(group);
    }

    /// Planned bytes held in memory now.
    pub fn planned_bytes_held(&self) -> u64 {
        self.planned.held_bytes()
    }
}

#[cfg(test)]
mod in_process_tests;
