//! Edges: the few bytes of a part beyond a chunk's end that the kernel's read-around
//! asks for, fetched on their own and kept in memory (at most [`EDGES_KEPT`]) instead
//! of downloading their whole part. An edge takes a download slot, then its memory if
//! the budget has room now (else it is dropped: it is advice), the order a download
//! takes them in; and it counts as a download in flight.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::direct::worth_a_direct_read;
use super::permits::Urgency;
use super::{Fetcher, PartBytes, EDGES_KEPT};
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::{pinned_by_etag, pinned_get, ObjectInfo};
use crate::parts::PartKey;

/// An edge held in memory: the bytes from `offset` in its part on, and whether its
/// answer was pinned by its ETag (only such an edge is joined with another answer into
/// its part: [`crate::object::pinned_by_etag`]).
pub(super) struct HeldEdge {
    pub(super) offset: u64,
    pub(super) bytes: Bytes,
    pub(super) joinable: bool,
}

/// An edge being fetched: which bytes of its part, and whether its request is on the
/// wire (`true`), a watch whose sender is dropped when the edge ends.
pub(super) struct EdgeInFlight {
    pub(super) within: Range<u64>,
    pub(super) on_the_wire: tokio::sync::watch::Receiver<bool>,
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
        self.fetcher.edges.in_flight.lock().remove(&self.key);
    }
}

/// The edges: those held in memory, and those being fetched.
pub(super) struct Edges {
    /// Small ranges of parts fetched on their own ([`Fetcher::prefetch_edge`]), by part:
    /// the bytes from the offset in the part on. Bounded in count ([`EDGES_KEPT`]), and
    /// each held against the memory budget.
    pub(super) held: Mutex<lru::LruCache<PartKey, HeldEdge>>,
    /// The parts whose edge is being fetched.
    pub(super) in_flight: Mutex<HashMap<PartKey, EdgeInFlight>>,
}

impl Edges {
    pub(super) fn new() -> Edges {
        Edges {
            held: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(EDGES_KEPT).unwrap(),
            )),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Fetches bytes `range` of the object (within one part) on their own, at
    /// `urgency`, and keeps them in memory for reads (see [`Fetcher::prefetch_edge`]).
    /// It takes the whole fetcher, not its parts: an edge looks in the cache, the memory
    /// and the downloads, then takes a slot, memory, the store and the runtime, in a
    /// task that outlives the call.
    pub(super) fn fetch(
        &self,
        fetcher: &Arc<Fetcher>,
        object: &Arc<ObjectInfo>,
        range: Range<u64>,
        urgency: Arc<Urgency>,
    ) {
        let (key, within) = fetcher.part_holding(object, &range);
        if fetcher.cache.contains(key) || fetcher.in_memory(key, &within).is_some() {
            return;
        }
        // A reader's next read of a part on its way waits for the download's body,
        // unless its bytes are far from it: then, as that read would, it asks for them
        // on its own (taking the download's one direct read).
        let downloading = fetcher
            .in_flight
            .lock()
            .get(&key)
            .map(|d| d.arriving.clone());
        if downloading.is_some() && !urgency.is_demand() {
            return;
        }
        let (on_the_wire, watched) = tokio::sync::watch::channel(false);
        match self.in_flight.lock().entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => return,
            std::collections::hash_map::Entry::Vacant(entry) => {
                let part = fetcher.part_range(object, key.index);
                let part_len = part.end - part.start;
                if let Some(arriving) = downloading {
                    if !worth_a_direct_read(&arriving, &within, part_len) {
                        return;
                    }
                }
                entry.insert(EdgeInFlight {
                    within: within.clone(),
                    on_the_wire: watched,
                });
            }
        }
        let slot = fetcher.slot_request(range.clone(), urgency);
        let (this, object) = (fetcher.clone(), object.clone());
        // Built here, not in the task: a task dropped before its first poll leaves too.
        let leave = LeaveEdgesInFlight {
            fetcher: fetcher.clone(),
            key,
            on_the_wire,
        };
        fetcher.runtime.spawn(async move {
            let _permit = slot.granted().await;
            let len = range.end - range.start;
            // Memory after the slot, as a download takes them: an edge that held memory
            // while it queued for a slot could starve the downloads that held the slots
            // and waited for memory, and with them every reader, until its deadline.
            let Some(memory) = this.memory.try_reserve(len) else {
                return;
            };
            leave.on_the_wire.send_replace(true);
            // Counted as sent, so that the store's count of requests can be accounted.
            Metrics::add(&this.metrics.edges_fetched, 1);
            let read = tokio::time::timeout(this.read_timeout, async {
                let result = pinned_get(this.store.as_ref(), &object, Some(range)).await?;
                let joinable = pinned_by_etag(&object, &result.meta);
                let bytes = result
                    .bytes()
                    .await
                    .map_err(|e| FsError::store(object.key.as_ref(), &e))?;
                FsResult::Ok((bytes, joinable))
            })
            .await;
            match read {
                Ok(Ok((bytes, joinable))) if bytes.len() as u64 == len => {
                    Metrics::add(&this.metrics.bytes_fetched, len);
                    let edge = HeldEdge {
                        offset: within.start,
                        bytes: memory.hold(bytes),
                        joinable,
                    };
                    this.edges.held.lock().put(key, edge);
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
    pub(super) fn on_the_wire(
        &self,
        key: PartKey,
        within: &Range<u64>,
    ) -> Option<tokio::sync::watch::Receiver<bool>> {
        let edges = self.in_flight.lock();
        let edge = edges.get(&key)?;
        let covers = edge.within.start <= within.start && within.end <= edge.within.end;
        // A closed watch: the fetch is over, whatever its entry says; waiting on it
        // would end at once, again and again.
        let fetching = edge.on_the_wire.has_changed().is_ok();
        (covers && fetching && *edge.on_the_wire.borrow()).then(|| edge.on_the_wire.clone())
    }

    /// The held edge that covers bytes `within` of the part, if there is one.
    pub(super) fn covering(&self, key: PartKey, within: &Range<u64>) -> Option<PartBytes> {
        let mut edges = self.held.lock();
        let edge = edges.get(&key)?;
        let covers =
            edge.offset <= within.start && within.end <= edge.offset + edge.bytes.len() as u64;
        covers.then(|| PartBytes::InMemory {
            offset: edge.offset,
            bytes: edge.bytes.clone(),
        })
    }

    /// The edge of the part held in memory ([`Fetcher::prefetch_edge`]), as its offset
    /// in the part and its bytes, if it is the part's first or last bytes: its part's
    /// download then asks the store for the rest only, or for nothing when the edge is
    /// the whole part (a small object's, which the read-around covers end to end). The
    /// kernel's read-around across a window's chunk edges fetched those bytes of a
    /// neighbour chunk; when that chunk's own window comes, they would otherwise cross
    /// the link a second time.
    ///
    /// Only an edge pinned by its ETag, unless it is the whole part: a joined
    /// download's own answer must be pinned too ([`Fetcher::receive_from_store`]), or two
    /// versions of a rewritten object that share a modification time could make one
    /// part. A whole part is one answer, as its download's would be.
    pub(super) fn held_edge(&self, key: PartKey, part_len: u64) -> Option<(u64, Bytes)> {
        let edges = self.held.lock();
        let edge = edges.peek(&key)?;
        let len = edge.bytes.len() as u64;
        let whole = edge.offset == 0 && len == part_len;
        let at_an_end = edge.offset == 0 || edge.offset + len == part_len;
        let joins = edge.joinable && at_an_end && len > 0 && len < part_len;
        (whole || joins).then(|| (edge.offset, edge.bytes.clone()))
    }

    /// Drops the part's held edge: its part serves its bytes now.
    pub(super) fn forget(&self, key: PartKey) {
        self.held.lock().pop(&key);
    }

    /// Drops the edge held longest; `false` if none is held.
    pub(super) fn drop_oldest(&self) -> bool {
        self.held.lock().pop_lru().is_some()
    }

    /// Edges being fetched or queued.
    pub(super) fn in_flight_count(&self) -> usize {
        self.in_flight.lock().len()
    }
}
