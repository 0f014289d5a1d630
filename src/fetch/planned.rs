//! Planned ranges: the exact bytes a plan's rows need, fetched on their own instead of
//! with their whole parts, and held in memory until they are in the kernel's page
//! cache.
//!
//! A `rows` step of scDataset's block order reads about 300 KB of each of a few dozen
//! parts of 8 MiB. When the dataset is many times the disk cache, each such part is
//! evicted long before the plan comes back to its other blocks, and fetched again for
//! each: a cache of a tenth of the dataset fetched it five times over. The plan names
//! every row, so the prefetcher asks for the bytes of those rows alone
//! ([`Fetcher::prefetch_planned`]); they are pinned to the object's version like any
//! GET ([`crate::object::pinned_get`]), never written to the disk cache, held here
//! under the fetcher's memory budget and a cap of their own ([`PLANNED_BYTES_HELD`]),
//! served to reads like any bytes the fetcher holds, and given up once the read-around
//! has stored them in the page cache ([`Fetcher::release_planned`]), where the reader's
//! memory map finds them without a FUSE read.
//!
//! Small ranges need many requests in flight to fill a link (at 20 ms a response,
//! 50 of 200 KB for 500 MB/s), so they are bounded by the bytes on the wire
//! ([`PLANNED_BYTES_IN_FLIGHT`], each request weighing at least
//! [`PLANNED_REQUEST_WEIGHT`]), beside the download slots that whole parts take.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify, Semaphore};

use super::Fetcher;
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::parts::{GroupId, PartKey};

/// Planned bytes held in memory or asked for at most, not yet stored in the page
/// cache: no more is asked for beyond, and past it the ones held longest are dropped (a
/// reader of them fetches them again).
pub const PLANNED_BYTES_HELD: u64 = 32 << 20;

/// Planned bytes on the wire at most: a link of 800 MB/s at 20 ms a response.
pub const PLANNED_BYTES_IN_FLIGHT: u64 = 16 << 20;

/// What a request counts against [`PLANNED_BYTES_IN_FLIGHT`] at least, so that at most
/// 256 are on the wire: with 8,000 single rows of 6 KB in flight, the daemon's
/// connections and tasks held 300 MiB.
pub(super) const PLANNED_REQUEST_WEIGHT: u64 = 64 << 10;

/// Ranges remembered as stored into the page cache, at most: a top-up that walks their
/// step again (its plan moved) does not fetch them again. About 14 MiB of entries, each
/// in a part of its own ([`PlannedRanges::ranges`]).
pub const PLANNED_STORED_KEPT: usize = 1 << 16;

/// One planned range: its bytes once they have arrived, its fetch while it is on its
/// way, or the note that the page cache has it.
enum Entry {
    Held { bytes: Bytes, since: u64 },
    Coming(Coming),
    Stored { since: u64 },
}

/// A planned range on its way.
#[derive(Clone)]
pub(super) struct Coming {
    /// Closed by its fetch when it ends, whatever the outcome.
    pub(super) done: watch::Receiver<()>,
    /// Told by a reader that waits for the range.
    awaited: Arc<Notify>,
}

impl Coming {
    pub(super) fn new(done: watch::Receiver<()>) -> Coming {
        Coming {
            done,
            awaited: Arc::new(Notify::new()),
        }
    }

    /// A reader waits for these bytes: if the request still queues for its place on the
    /// wire, it goes now. The bound on the wire keeps read-ahead from crowding it, not
    /// a reader from its row: a step's ranges are asked for in the order of its rows'
    /// offsets, which a reader of shuffled minibatches does not follow, and a row at
    /// the end of that queue waited for the whole step (moto behind the bench's link:
    /// 49 rows/s, hinted, against 6,301 without hints).
    pub(super) fn awaited(&self) {
        self.awaited.notify_one();
    }
}

/// The planned ranges of every part, by their first byte in the part.
#[derive(Default)]
pub(super) struct PlannedRanges {
    /// Each range's end and entry, by its part and its first byte in the part. One map
    /// for all parts: a plan of random rows leaves one range or two in each of tens of
    /// thousands of parts, and a map of its own per part took a node of eleven entries
    /// for each: the stored ranges kept, one a part, held 50 MiB that way, 14 MiB here.
    ranges: BTreeMap<(PartKey, u64), (u64, Entry)>,
    /// Bytes held (arrived, not yet released).
    held: u64,
    /// Bytes asked for and not arrived yet.
    coming: u64,
    /// Orders the held ranges by arrival, for dropping the oldest past the cap.
    arrivals: BTreeMap<u64, (PartKey, u64)>,
    /// Orders the stored ranges likewise, for forgetting the oldest past their bound.
    stored: BTreeMap<u64, (PartKey, u64)>,
    next_arrival: u64,
    /// A range was refused for lack of room since bytes were last given back: the
    /// prefetcher is woken when some are, to ask again.
    refused: bool,
}

/// What a planned range covering some bytes holds now.
pub(super) enum Covered {
    Held {
        offset: u64,
        bytes: Bytes,
    },
    Coming(Coming),
    /// In the page cache: a read of it found the kernel had dropped it.
    Stored,
}

impl PlannedRanges {
    /// The range of the part that covers `within`, if one is held or coming.
    pub(super) fn covering(&self, key: PartKey, within: &Range<u64>) -> Option<Covered> {
        // Ranges of one part may overlap (two plans, or a range asked again after it
        // was dropped): look back from the last one starting at or before `within`.
        self.ranges
            .range((key, 0)..=(key, within.start))
            .rev()
            .find(|(_, (end, _))| *end >= within.end)
            .map(|(&(_, start), (_, entry))| match entry {
                Entry::Held { bytes, .. } => Covered::Held {
                    offset: start,
                    bytes: bytes.clone(),
                },
                Entry::Coming(coming) => Covered::Coming(coming.clone()),
                Entry::Stored { .. } => Covered::Stored,
            })
    }

    /// Records that bytes `within` of the part are coming; `false` if another range
    /// starting there is still coming (its fetch will record it).
    fn insert_coming(&mut self, key: PartKey, within: Range<u64>, coming: Coming) -> bool {
        match self.ranges.get(&(key, within.start)) {
            Some((_, Entry::Coming(_))) => return false,
            Some(_) => self.remove(key, within.start),
            None => {}
        }
        self.coming += within.end - within.start;
        self.ranges
            .insert((key, within.start), (within.end, Entry::Coming(coming)));
        true
    }

    /// Whether `len` more bytes may be asked for: held and coming stay within
    /// [`PLANNED_BYTES_HELD`]. A refusal is remembered ([`PlannedRanges::release`]).
    fn has_room_for(&mut self, len: u64) -> bool {
        let room = self.held + self.coming + len <= PLANNED_BYTES_HELD;
        self.refused |= !room;
        room
    }

    /// Records the range's bytes (or its failure: `None`) and drops the oldest held
    /// ranges beyond [`PLANNED_BYTES_HELD`].
    fn arrived(&mut self, key: PartKey, start: u64, len: u64, bytes: Option<Bytes>) {
        self.coming -= len;
        match bytes {
            Some(bytes) => {
                // Only into the entry this fetch was asked for (same start and length).
                if let Some((end, entry)) = self.ranges.get_mut(&(key, start)) {
                    if *end - start == bytes.len() as u64 {
                        let since = self.next_arrival;
                        self.next_arrival += 1;
                        self.held += bytes.len() as u64;
                        self.arrivals.insert(since, (key, start));
                        *entry = Entry::Held { bytes, since };
                    }
                }
            }
            None => {
                if matches!(self.ranges.get(&(key, start)), Some((_, Entry::Coming(_)))) {
                    self.ranges.remove(&(key, start));
                }
            }
        }
        while self.held > PLANNED_BYTES_HELD {
            let Some((_, (key, start))) = self.arrivals.pop_first() else {
                break;
            };
            self.remove(key, start);
        }
    }

    /// Forgets the held or stored range of the part that starts at `start` (a range
    /// still coming is left to its fetch).
    fn remove(&mut self, key: PartKey, start: u64) {
        match self.ranges.get(&(key, start)) {
            Some((_, Entry::Held { bytes, since })) => {
                self.held -= bytes.len() as u64;
                self.arrivals.remove(since);
                self.ranges.remove(&(key, start));
            }
            Some((_, Entry::Stored { since })) => {
                self.stored.remove(since);
                self.ranges.remove(&(key, start));
            }
            Some((_, Entry::Coming(_))) | None => {}
        }
    }

    /// Gives up the bytes of the held ranges of the part that lie within `within`,
    /// remembering them as stored (the oldest forgotten past [`PLANNED_STORED_KEPT`]).
    /// Returns whether a range was refused for lack of room since, and half the room is
    /// free again: the prefetcher then asks for a batch, where waking it at every
    /// release walked its plans once per range.
    fn release(&mut self, key: PartKey, within: &Range<u64>) -> bool {
        self.release_ranges(key, within);
        let wake = self.refused && 2 * (self.held + self.coming) <= PLANNED_BYTES_HELD;
        self.refused &= !wake;
        wake
    }

    fn release_ranges(&mut self, key: PartKey, within: &Range<u64>) {
        for (&(_, start), (end, entry)) in self
            .ranges
            .range_mut((key, within.start)..(key, within.end))
        {
            if *end > within.end {
                continue;
            }
            if let Entry::Held { bytes, since } = entry {
                self.held -= bytes.len() as u64;
                self.arrivals.remove(since);
                let since = self.next_arrival;
                self.next_arrival += 1;
                self.stored.insert(since, (key, start));
                *entry = Entry::Stored { since };
            }
        }
        while self.stored.len() > PLANNED_STORED_KEPT {
            let Some((_, (key, start))) = self.stored.pop_first() else {
                break;
            };
            self.remove(key, start);
        }
    }

    pub(super) fn held_bytes(&self) -> u64 {
        self.held
    }

    /// Bytes asked for and not arrived yet.
    #[cfg(test)]
    pub(super) fn coming_bytes(&self) -> u64 {
        self.coming
    }
}

/// What [`Fetcher::prefetch_planned`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planned {
    /// Asked for: its `done` runs once the bytes are held.
    Started,
    /// Cached, or held in memory.
    Local,
    /// On its way: its part's download, or another planned range covering it.
    Coming,
    /// Not asked for: the memory budget has no room now.
    Refused,
}

/// A plan's exact ranges: those held or coming, the bound on their bytes on the wire,
/// and the chunks whose rows the plans fetch exactly.
pub(super) struct PlannedFetches {
    /// The exact bytes of planned rows, held until they are in the page cache
    /// ([`Fetcher::prefetch_planned`]).
    pub(super) ranges: Mutex<PlannedRanges>,
    /// The bound on planned bytes on the wire.
    on_the_wire: Arc<Semaphore>,
    /// The chunks whose rows the plans fetch exactly: a reader's few bytes of them are
    /// asked for alone, not with their part ([`Fetcher::read_exactly`]).
    exact_groups: Mutex<HashSet<GroupId>>,
}

impl PlannedFetches {
    pub(super) fn new() -> PlannedFetches {
        PlannedFetches {
            ranges: Mutex::new(PlannedRanges::default()),
            on_the_wire: Arc::new(Semaphore::new(PLANNED_BYTES_IN_FLIGHT as usize)),
            exact_groups: Mutex::new(HashSet::new()),
        }
    }

    /// Fetches bytes `range` of the object (within one part) on their own, as
    /// [`Fetcher::prefetch_planned`] says. It takes the whole fetcher, not its parts: a
    /// range looks in the cache and the downloads, then takes memory, the direct reads
    /// and the runtime, in a task that outlives the call.
    pub(super) fn prefetch(
        &self,
        fetcher: &Arc<Fetcher>,
        object: &Arc<ObjectInfo>,
        range: Range<u64>,
        done: impl FnOnce() + Send + 'static,
    ) -> Planned {
        let (key, within) = fetcher.part_holding(object, &range);
        if fetcher.cache.contains(key) {
            return Planned::Local;
        }
        if fetcher.is_in_flight(key) {
            return Planned::Coming;
        }
        let len = range.end - range.start;
        let memory = {
            let mut planned = self.ranges.lock();
            match planned.covering(key, &within) {
                Some(Covered::Held { .. } | Covered::Stored) => return Planned::Local,
                Some(Covered::Coming(_)) => return Planned::Coming,
                None => {}
            }
            if !planned.has_room_for(len) {
                return Planned::Refused;
            }
            let Some(memory) = fetcher.memory.try_reserve(len) else {
                return Planned::Refused;
            };
            let (sender, done) = watch::channel(());
            let coming = Coming::new(done);
            let awaited = coming.awaited.clone();
            if !planned.insert_coming(key, within.clone(), coming) {
                return Planned::Coming;
            }
            // Dropped when the fetch ends, however: readers waiting on it look again.
            (memory, sender, awaited)
        };
        let (this, object) = (fetcher.clone(), object.clone());
        let on_the_wire = self.on_the_wire.clone();
        fetcher.runtime.spawn(async move {
            let (memory, _closes_on_end, awaited) = memory;
            let weight = len.clamp(PLANNED_REQUEST_WEIGHT, PLANNED_BYTES_IN_FLIGHT);
            let _wire = tokio::select! {
                wire = on_the_wire.acquire_many_owned(weight as u32) => match wire {
                    Ok(permit) => Some(permit),
                    Err(_) => return,
                },
                // Beside the bound ([`Coming::awaited`]).
                () = awaited.notified() => None,
            };
            Metrics::add(&this.metrics.planned_requests, 1);
            let fetched = this.direct.get_range(&object, range, memory).await.ok();
            let arrived = fetched.is_some();
            this.planned
                .ranges
                .lock()
                .arrived(key, within.start, len, fetched);
            if arrived {
                Metrics::add(&this.metrics.planned_bytes, len);
                done();
            }
        });
        Planned::Started
    }

    /// Gives up the planned bytes held of the part within `within`; whether a range
    /// waits for that room ([`PlannedRanges::release`]).
    pub(super) fn release(&self, key: PartKey, within: &Range<u64>) -> bool {
        self.ranges.lock().release(key, within)
    }

    /// Whether `len` more planned bytes may be asked for now.
    pub(super) fn has_room_for(&self, len: u64) -> bool {
        self.ranges.lock().has_room_for(len)
    }

    /// The range of the part that covers `within`, if one is held or coming.
    pub(super) fn covering(&self, key: PartKey, within: &Range<u64>) -> Option<Covered> {
        self.ranges.lock().covering(key, within)
    }

    /// The plans fetch the rows of chunk `group` exactly.
    pub(super) fn read_exactly(&self, group: GroupId) {
        self.exact_groups.lock().insert(group);
    }

    /// Whether a reader's few bytes of the object are asked for alone.
    pub(super) fn is_read_exactly(&self, object: &ObjectInfo) -> bool {
        object
            .group
            .is_some_and(|group| self.exact_groups.lock().contains(&group))
    }

    /// Planned bytes held in memory now.
    pub(super) fn held_bytes(&self) -> u64 {
        self.ranges.lock().held_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::ObjectId;

    fn key(index: u64) -> PartKey {
        PartKey {
            object: ObjectId(1),
            index,
        }
    }

    fn held(ranges: &PlannedRanges, part: u64, within: Range<u64>) -> Option<(u64, usize)> {
        match ranges.covering(key(part), &within)? {
            Covered::Held { offset, bytes } => Some((offset, bytes.len())),
            Covered::Coming(_) | Covered::Stored => None,
        }
    }

    fn arrive(ranges: &mut PlannedRanges, part: u64, within: Range<u64>) {
        let (_sender, done) = watch::channel(());
        ranges.insert_coming(key(part), within.clone(), Coming::new(done));
        let len = within.end - within.start;
        let bytes = Bytes::from(vec![7u8; len as usize]);
        ranges.arrived(key(part), within.start, len, Some(bytes));
    }

    #[test]
    fn a_read_is_served_by_the_range_that_covers_it_whole() {
        let mut ranges = PlannedRanges::default();
        arrive(&mut ranges, 0, 4096..8192);
        arrive(&mut ranges, 0, 0..16384);
        assert_eq!(held(&ranges, 0, 5000..6000), Some((4096, 4096)));
        assert_eq!(held(&ranges, 0, 5000..9000), Some((0, 16384)));
        assert_eq!(held(&ranges, 0, 16000..17000), None);
        assert_eq!(held(&ranges, 1, 0..10), None, "another part");
    }

    #[test]
    fn a_failed_range_leaves_nothing_behind() {
        let mut ranges = PlannedRanges::default();
        let (_sender, done) = watch::channel(());
        ranges.insert_coming(key(0), 0..100, Coming::new(done));
        assert!(matches!(
            ranges.covering(key(0), &(10..20)),
            Some(Covered::Coming(_))
        ));
        ranges.arrived(key(0), 0, 100, None);
        assert!(ranges.covering(key(0), &(10..20)).is_none());
        assert!(ranges.ranges.is_empty());
    }

    #[test]
    fn held_bytes_past_the_cap_drop_the_oldest_ranges_first() {
        let mut ranges = PlannedRanges::default();
        let third = PLANNED_BYTES_HELD / 3;
        for part in 0..4 {
            arrive(&mut ranges, part, 0..third);
        }
        assert!(ranges.held_bytes() <= PLANNED_BYTES_HELD);
        assert_eq!(held(&ranges, 0, 0..1), None, "the oldest went");
        assert!(held(&ranges, 3, 0..1).is_some());
    }

    #[test]
    fn released_ranges_give_their_bytes_back_and_are_remembered_as_stored() {
        let mut ranges = PlannedRanges::default();
        arrive(&mut ranges, 0, 0..4096);
        arrive(&mut ranges, 0, 8192..12288);
        assert!(!ranges.release(key(0), &(0..8192)), "nothing was refused");
        assert_eq!(ranges.held_bytes(), 4096);
        assert_eq!(held(&ranges, 0, 0..10), None);
        assert!(matches!(
            ranges.covering(key(0), &(0..10)),
            Some(Covered::Stored)
        ));
        assert!(held(&ranges, 0, 9000..9010).is_some());
    }

    #[test]
    fn the_ranges_of_one_part_are_never_those_of_another() {
        let mut ranges = PlannedRanges::default();
        arrive(&mut ranges, 0, 0..8192);
        arrive(&mut ranges, 2, 0..4096);
        assert_eq!(held(&ranges, 1, 0..10), None, "part 0 holds those bytes");
        ranges.release(key(1), &(0..u64::MAX));
        assert!(held(&ranges, 0, 0..10).is_some(), "released with part 1's");
        assert!(held(&ranges, 2, 0..10).is_some(), "released with part 1's");
    }

    #[test]
    fn stored_ranges_past_their_bound_are_forgotten_oldest_first() {
        let mut ranges = PlannedRanges::default();
        for part in 0..PLANNED_STORED_KEPT as u64 + 3 {
            arrive(&mut ranges, part, 0..1);
            ranges.release(key(part), &(0..1));
        }
        assert_eq!(ranges.stored.len(), PLANNED_STORED_KEPT);
        assert!(ranges.covering(key(0), &(0..1)).is_none());
        let last = PLANNED_STORED_KEPT as u64 + 2;
        assert!(ranges.covering(key(last), &(0..1)).is_some());
    }

    #[test]
    fn asking_stops_at_the_cap_and_wakes_the_prefetcher_once_half_is_free() {
        let mut ranges = PlannedRanges::default();
        let (_sender, done) = watch::channel(());
        let coming = PLANNED_BYTES_HELD / 4 * 3;
        assert!(ranges.insert_coming(key(0), 0..coming, Coming::new(done)));
        arrive(&mut ranges, 1, 0..PLANNED_BYTES_HELD / 8);
        assert!(ranges.has_room_for(PLANNED_BYTES_HELD / 8));
        assert!(!ranges.has_room_for(PLANNED_BYTES_HELD / 8 + 1));
        assert!(
            !ranges.release(key(1), &(0..PLANNED_BYTES_HELD)),
            "three quarters still coming: not yet"
        );
        ranges.arrived(key(0), 0, coming, None);
        assert!(ranges.release(key(1), &(0..1)), "the room is free");
        assert!(!ranges.release(key(1), &(0..1)), "told once");
    }
}
