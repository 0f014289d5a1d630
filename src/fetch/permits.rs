//! Download slots with two priorities: demand reads (a reader is waiting) always go
//! before prefetches, and prefetches never take the last quarter of the slots (at least
//! one), so demand reads never queue behind read-ahead. A reserve of one slot was not
//! enough: a reader's first fault in a flat row-offset array reads around it across
//! several chunks' offset objects, one part each, which then went over the wire one
//! after another while a plan's prefetches held every other slot. A queued prefetch
//! becomes a demand request when a reader starts waiting for the same part
//! ([`Permits::raise`]), and takes a slot kept for demand at once if one is free. A
//! reader's request for a few bytes (a small object's part, an edge) does not wait for
//! a slot at all: it runs beside them ([`Permits::request_small`]).
//!
//! Priority at the slots does not reach the wire: once bodies stream, a link shared by
//! every connection gives a reader's request the same share as each prefetch. A reader
//! starting an epoch makes a few reads one after another (a row's offsets, then its
//! values and column ids), and with twelve prefetches streaming each took one and a
//! half round trips instead of one. So a plan's start opens an *opening*
//! ([`Permits::open`]): until its reader's first reads that waited for the network are
//! answered, or a deadline passes, at most [`OPENING_PREFETCHES`] prefetches run. Two
//! streams still fill a link whose bottleneck is shared; the cap lifts before the
//! reader waits for the bulk of the plan.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Whether a reader waits for this download; can be raised while the request queues.
#[derive(Debug, Default)]
pub struct Urgency(AtomicBool);

impl Urgency {
    pub fn demand() -> Arc<Urgency> {
        Arc::new(Urgency(AtomicBool::new(true)))
    }

    pub fn prefetch() -> Arc<Urgency> {
        Arc::new(Urgency(AtomicBool::new(false)))
    }

    pub fn is_demand(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

struct Waiter {
    urgency: Arc<Urgency>,
    /// A request for a few bytes ([`Permits::request_small`]).
    small: bool,
    grant: oneshot::Sender<Slot>,
}

/// Which kind of slot a request was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Demand,
    Prefetch,
    /// Beside the download slots: a reader's request for a few bytes.
    Small,
}

/// The most bytes of a request that runs beside the download slots while a reader
/// waits for it ([`Permits::request_small`]; the fetcher also holds it to a quarter of
/// a part): a part of a small object (a chunk's row offsets), or an edge. It costs a
/// round trip, not a share of the link, and queued behind the downloads of whole parts
/// it waited for one of them to end: with eight ranks starting together, a rank's
/// first row waited up to a second for the 16 KiB of its chunk's row offsets.
pub const SMALL_REQUEST_BYTES: u64 = 1 << 20;

/// Prefetches that may run during an opening.
pub const OPENING_PREFETCHES: usize = 2;

/// A plan's start: prefetches are held to [`OPENING_PREFETCHES`] until `reads_left`
/// reads that waited for the network have been answered, or until `until`.
struct Opening {
    reads_left: usize,
    until: Instant,
}

struct State {
    free: usize,
    prefetch_running: usize,
    small_running: usize,
    waiters: VecDeque<Waiter>,
    opening: Option<Opening>,
}

impl State {
    /// Prefetches that may run now, of at most `max_prefetch`.
    fn prefetch_cap(&mut self, max_prefetch: usize) -> usize {
        if let Some(opening) = &self.opening {
            if opening.reads_left > 0 && Instant::now() < opening.until {
                return OPENING_PREFETCHES.min(max_prefetch);
            }
            self.opening = None;
        }
        max_prefetch
    }
}

pub struct Permits {
    state: Mutex<State>,
    max_prefetch: usize,
    /// Small requests a reader waits for that may run beside the download slots.
    max_small: usize,
}

/// A queued request for a slot; dropping it gives up its place, or the slot if it was
/// granted meanwhile.
pub struct Request {
    permits: Arc<Permits>,
    granted: Option<oneshot::Receiver<Slot>>,
}

impl Request {
    /// The slot, if it was granted already.
    pub fn now(&mut self) -> Option<Permit> {
        let slot = self.granted.as_mut()?.try_recv().ok()?;
        self.granted = None;
        Some(self.permit(slot))
    }

    pub async fn granted(mut self) -> Permit {
        let granted = self.granted.as_mut().expect("a request is granted once");
        let slot = granted.await.expect("permits outlive their waiters");
        self.granted = None;
        self.permit(slot)
    }

    fn permit(&self, slot: Slot) -> Permit {
        Permit {
            permits: self.permits.clone(),
            slot,
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(mut granted) = self.granted.take() {
            granted.close();
            if let Ok(slot) = granted.try_recv() {
                drop(self.permit(slot));
            }
        }
    }
}

/// A held slot; released on drop.
pub struct Permit {
    permits: Arc<Permits>,
    slot: Slot,
}

impl Permits {
    /// `slots` downloads at once, of which at most `slots - slots / 4` prefetches, and
    /// at most `slots - 1` (with a single slot, prefetches share it).
    pub fn new(slots: usize) -> Arc<Permits> {
        let slots = slots.max(1);
        let demand_reserve = (slots / 4).max(1);
        Arc::new(Permits {
            state: Mutex::new(State {
                free: slots,
                prefetch_running: 0,
                small_running: 0,
                waiters: VecDeque::new(),
                opening: None,
            }),
            max_prefetch: slots.saturating_sub(demand_reserve).max(1),
            max_small: slots,
        })
    }

    /// Queues a request for a slot; it may be granted at once ([`Request::now`]).
    pub fn request(self: &Arc<Self>, urgency: Arc<Urgency>) -> Request {
        self.enqueue(urgency, false)
    }

    /// Queues a request for a few bytes (at most [`SMALL_REQUEST_BYTES`]): while a
    /// reader waits for it, it runs beside the download slots, up to as many again,
    /// rather than after a download of a part ends.
    pub fn request_small(self: &Arc<Self>, urgency: Arc<Urgency>) -> Request {
        self.enqueue(urgency, true)
    }

    fn enqueue(self: &Arc<Self>, urgency: Arc<Urgency>, small: bool) -> Request {
        let (grant, granted) = oneshot::channel();
        let mut state = self.state.lock();
        state.waiters.push_back(Waiter {
            urgency,
            small,
            grant,
        });
        self.dispatch(&mut state);
        Request {
            permits: self.clone(),
            granted: Some(granted),
        }
    }

    /// Makes a request demand: from now on it goes before every queued prefetch, and
    /// if it queued only because prefetches were at their cap, it takes a free slot
    /// now rather than when the next download ends (a reader waiting on a part
    /// queued behind a plan's prefetches would otherwise wait for one of them).
    pub fn raise(&self, urgency: &Urgency) {
        let mut state = self.state.lock();
        urgency.0.store(true, Ordering::Relaxed);
        self.dispatch(&mut state);
    }

    /// Holds prefetches to [`OPENING_PREFETCHES`] until `reads` reads that waited for
    /// the network have been answered ([`Permits::read_answered`]) or until `until`,
    /// whichever comes first; running prefetches go on. A later opening replaces it.
    /// Nothing wakes the queue at `until`: the caller calls [`Permits::dispatch_now`].
    pub fn open(&self, reads: usize, until: Instant) {
        self.state.lock().opening = Some(Opening {
            reads_left: reads,
            until,
        });
    }

    /// Adds `reads` to the opening under way, if one is: a plan that starts during
    /// another's opening (ranks started together) has its reader's first reads answered
    /// before the prefetches are let go, as the first plan's are. The deadline stays
    /// the first plan's, so plans started one after another hold the prefetches no
    /// longer than one opening does. `false`: no opening is under way.
    pub fn join(&self, reads: usize) -> bool {
        let mut state = self.state.lock();
        match &mut state.opening {
            Some(opening) if opening.reads_left > 0 && Instant::now() < opening.until => {
                opening.reads_left += reads;
                true
            }
            _ => false,
        }
    }

    /// A reader's read that waited for the network was answered.
    pub fn read_answered(&self) {
        let mut state = self.state.lock();
        if let Some(opening) = &mut state.opening {
            opening.reads_left = opening.reads_left.saturating_sub(1);
            self.dispatch(&mut state);
        }
    }

    /// Hands out the slots an ended opening frees for prefetches.
    pub fn dispatch_now(&self) {
        self.dispatch(&mut self.state.lock());
    }

    /// Hands free slots to waiters: small requests a reader waits for at once, beside
    /// the slots; then demand, in arrival order; then prefetches while they are under
    /// their cap.
    fn dispatch(&self, state: &mut State) {
        while state.small_running < self.max_small {
            let Some(next) = (state.waiters.iter()).position(|w| w.small && w.urgency.is_demand())
            else {
                break;
            };
            let waiter = state.waiters.remove(next).unwrap();
            if waiter.grant.send(Slot::Small).is_ok() {
                state.small_running += 1;
            }
        }
        while state.free > 0 {
            let demand = state.waiters.iter().position(|w| w.urgency.is_demand());
            let next = match demand {
                Some(i) => i,
                None if !state.waiters.is_empty()
                    && state.prefetch_running < state.prefetch_cap(self.max_prefetch) =>
                {
                    0
                }
                None => return,
            };
            let waiter = state.waiters.remove(next).unwrap();
            let slot = if waiter.urgency.is_demand() {
                Slot::Demand
            } else {
                Slot::Prefetch
            };
            if waiter.grant.send(slot).is_ok() {
                state.free -= 1;
                if slot == Slot::Prefetch {
                    state.prefetch_running += 1;
                }
            }
        }
    }

    #[cfg(test)]
    fn free(&self) -> usize {
        self.state.lock().free
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.permits.state.lock();
        match self.slot {
            Slot::Small => state.small_running -= 1,
            Slot::Demand => state.free += 1,
            Slot::Prefetch => {
                state.free += 1;
                state.prefetch_running -= 1;
            }
        }
        self.permits.dispatch(&mut state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A slot, once granted.
    async fn acquire(permits: &Arc<Permits>, urgency: Arc<Urgency>) -> Permit {
        permits.request(urgency).granted().await
    }

    #[tokio::test]
    async fn prefetches_leave_a_slot_for_demand() {
        let permits = Permits::new(2);
        let _p1 = acquire(&permits, Urgency::prefetch()).await;
        let second = tokio::time::timeout(
            Duration::from_millis(50),
            acquire(&permits, Urgency::prefetch()),
        )
        .await;
        assert!(
            second.is_err(),
            "a second prefetch must not take the last slot"
        );
        let demand = tokio::time::timeout(
            Duration::from_millis(50),
            acquire(&permits, Urgency::demand()),
        )
        .await;
        assert!(demand.is_ok());
    }

    /// Sixteen slots: twelve prefetches run, and four demand reads beside them.
    #[tokio::test]
    async fn a_quarter_of_the_slots_is_kept_for_demand() {
        let permits = Permits::new(16);
        let mut held = Vec::new();
        let mut queued = Vec::new();
        for _ in 0..16 {
            let mut request = permits.request(Urgency::prefetch());
            match request.now() {
                Some(permit) => held.push(permit),
                None => queued.push(request),
            }
        }
        assert_eq!((held.len(), queued.len()), (12, 4));
        for _ in 0..4 {
            let mut demand = permits.request(Urgency::demand());
            held.push(
                demand
                    .now()
                    .expect("a demand read runs beside the prefetches"),
            );
        }
        let mut fifth = permits.request(Urgency::demand());
        assert!(fifth.now().is_none(), "every slot is taken");
        drop(held.pop());
        assert!(
            fifth.now().is_some(),
            "demand goes before the queued prefetches"
        );
    }

    /// Four slots: three prefetches run, a fourth queues at their cap; a reader starts
    /// waiting for its part, and it takes the slot kept for demand at once.
    #[tokio::test]
    async fn a_raised_prefetch_takes_a_free_demand_slot_at_once() {
        let permits = Permits::new(4);
        let running: Vec<_> = (0..3)
            .map(|_| {
                permits
                    .request(Urgency::prefetch())
                    .now()
                    .expect("under the cap")
            })
            .collect();
        let urgency = Urgency::prefetch();
        let mut queued = permits.request(urgency.clone());
        assert!(queued.now().is_none(), "prefetches are at their cap");
        permits.raise(&urgency);
        let raised = queued.now();
        assert!(
            raised.is_some(),
            "raised while a slot is free, granted without waiting for a prefetch to end"
        );
        assert_eq!(permits.free(), 0);
        drop((running, raised));
        assert_eq!(permits.free(), 4);
    }

    /// Every slot holds a part's download: a reader's request for a few bytes runs
    /// beside them at once, up to as many again; a small prefetch queues as any
    /// prefetch, and runs at once when a reader starts waiting for it.
    #[tokio::test]
    async fn a_readers_small_request_runs_beside_the_busy_slots() {
        let permits = Permits::new(4);
        let downloads: Vec<_> = (0..4)
            .map(|_| {
                permits
                    .request(Urgency::demand())
                    .now()
                    .expect("a free slot")
            })
            .collect();
        assert!(permits.request(Urgency::demand()).now().is_none());
        let mut beside: Vec<_> = (0..3)
            .map(|_| {
                permits
                    .request_small(Urgency::demand())
                    .now()
                    .expect("a reader's few bytes do not wait for a download to end")
            })
            .collect();
        let urgency = Urgency::prefetch();
        let mut small_prefetch = permits.request_small(urgency.clone());
        assert!(
            small_prefetch.now().is_none(),
            "a prefetch waits for a slot"
        );
        permits.raise(&urgency);
        beside.push(
            small_prefetch
                .now()
                .expect("raised: it runs beside the slots"),
        );
        let mut over = permits.request_small(Urgency::demand());
        assert!(over.now().is_none(), "at most as many again as the slots");
        drop(beside.pop());
        assert!(over.now().is_some());
        assert_eq!(permits.free(), 0, "the slots are the downloads'");
        drop(downloads);
        assert_eq!(permits.free(), 4);
    }

    /// Queues `n` prefetch requests; returns the granted permits and the queued requests.
    fn prefetches(permits: &Arc<Permits>, n: usize) -> (Vec<Permit>, Vec<Request>) {
        let (mut running, mut queued) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let mut request = permits.request(Urgency::prefetch());
            match request.now() {
                Some(permit) => running.push(permit),
                None => queued.push(request),
            }
        }
        (running, queued)
    }

    /// A plan starts: two prefetches run while its reader's first three reads wait for
    /// the network, demand reads are not held, and the third answer lets the queued
    /// prefetches run up to their usual cap.
    #[tokio::test]
    async fn an_opening_holds_prefetches_to_two_until_its_reads_are_answered() {
        let permits = Permits::new(16);
        permits.open(3, Instant::now() + Duration::from_secs(60));
        let (mut running, mut queued) = prefetches(&permits, 14);
        assert_eq!((running.len(), queued.len()), (OPENING_PREFETCHES, 12));
        let demand = permits.request(Urgency::demand()).now();
        assert!(demand.is_some(), "an opening holds prefetches only");
        permits.read_answered();
        permits.read_answered();
        assert!(queued.iter_mut().all(|q| q.now().is_none()));
        permits.read_answered();
        running.extend(queued.iter_mut().filter_map(|q| q.now()));
        assert_eq!(
            running.len(),
            12,
            "the usual cap: a quarter of the slots kept for demand"
        );
    }

    /// Ranks started together: a plan that starts during another's opening joins it, and
    /// the prefetches wait for both readers' first reads, but no longer than the first
    /// plan's deadline; once the opening is over, nothing is joined.
    #[tokio::test]
    async fn a_plan_started_during_an_opening_joins_it_until_its_deadline() {
        let permits = Permits::new(16);
        let until = Instant::now() + Duration::from_millis(200);
        permits.open(2, until);
        assert!(permits.join(2), "the first plan's opening is under way");
        let (running, mut queued) = prefetches(&permits, 6);
        assert_eq!(running.len(), OPENING_PREFETCHES);
        for _ in 0..3 {
            permits.read_answered();
        }
        assert!(
            queued.iter_mut().all(|q| q.now().is_none()),
            "the second reader's last read is not answered yet"
        );
        tokio::time::sleep_until(until.into()).await;
        permits.dispatch_now();
        assert!(queued.iter_mut().all(|q| q.now().is_some()), "the deadline");
        assert!(!permits.join(2), "no opening is under way");
    }

    /// A plan whose reader never reads from the network holds prefetches only until
    /// the opening's deadline.
    #[tokio::test]
    async fn an_opening_ends_at_its_deadline() {
        let permits = Permits::new(8);
        let until = Instant::now() + Duration::from_millis(30);
        permits.open(3, until);
        let (running, mut queued) = prefetches(&permits, 4);
        assert_eq!(running.len(), OPENING_PREFETCHES);
        tokio::time::sleep_until(until.into()).await;
        permits.dispatch_now();
        assert!(queued.iter_mut().all(|q| q.now().is_some()));
    }

    #[tokio::test]
    async fn demand_overtakes_queued_prefetches_and_raising_counts() {
        let permits = Permits::new(1);
        let held = acquire(&permits, Urgency::demand()).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let raised = Urgency::prefetch();
        for (name, urgency) in [
            ("prefetch", Urgency::prefetch()),
            ("raised", raised.clone()),
            ("demand", Urgency::demand()),
        ] {
            let (permits, order) = (permits.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _p = acquire(&permits, urgency).await;
                order.lock().push(name);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        permits.raise(&raised);
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), vec!["raised", "demand", "prefetch"]);
        assert_eq!(permits.free(), 1);
    }
}
