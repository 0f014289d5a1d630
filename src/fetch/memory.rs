//! The cap on the bytes the fetcher holds. A download reserves, before its request
//! goes out, what it will hold: two batches of blocks when its body goes into its
//! cache file as it comes, its part's length when the body must be held whole (the cache
//! cannot take it). Bytes held whole then carry the reservation
//! ([`MemoryReservation::hold`]), which returns to the budget when the last copy of those
//! bytes is dropped: after the readers' copies, or when a part kept in memory is let
//! go. So unwritten blocks, bodies held whole, parts kept because the cache had no
//! room, edges and readers' own ranges are all under one cap.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

pub struct MemoryBudget {
    cap: u64,
    free: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

/// Bytes of the budget, held until dropped.
pub struct MemoryReservation {
    _permit: OwnedSemaphorePermit,
}

/// Bytes with the reservation they count against.
struct Held {
    bytes: Bytes,
    _reservation: MemoryReservation,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl MemoryBudget {
    /// A budget of `cap` bytes; one reservation never exceeds it.
    pub fn new(cap: u64, metrics: Arc<Metrics>) -> MemoryBudget {
        let cap = cap.min(Semaphore::MAX_PERMITS as u64);
        MemoryBudget {
            cap,
            free: Arc::new(Semaphore::new(cap as usize)),
            metrics,
        }
    }

    /// Reserves `len` bytes (at most the whole cap), waiting for room.
    pub async fn reserve(&self, len: u64) -> MemoryReservation {
        let permit = self
            .free
            .clone()
            .acquire_many_owned(self.permits_for(len))
            .await
            .expect("the budget's semaphore is never closed");
        self.note_held();
        MemoryReservation { _permit: permit }
    }

    /// Reserves `len` bytes if there is room now.
    pub fn try_reserve(&self, len: u64) -> Option<MemoryReservation> {
        let permit = self
            .free
            .clone()
            .try_acquire_many_owned(self.permits_for(len))
            .ok()?;
        self.note_held();
        Some(MemoryReservation { _permit: permit })
    }

    /// Whether `len` more bytes could be reserved now without waiting.
    pub fn has_room_for(&self, len: u64) -> bool {
        self.free.available_permits() as u64 >= len.min(self.cap)
    }

    /// Bytes reserved now.
    pub fn held(&self) -> u64 {
        self.cap - self.free.available_permits() as u64
    }

    fn permits_for(&self, len: u64) -> u32 {
        len.min(self.cap).min(u32::MAX as u64) as u32
    }

    fn note_held(&self) {
        self.metrics
            .fetch_memory_peak_bytes
            .fetch_max(self.held(), std::sync::atomic::Ordering::Relaxed);
    }
}

impl MemoryReservation {
    /// `bytes`, counted against this reservation until their last copy is dropped.
    pub fn hold(self, bytes: Bytes) -> Bytes {
        Bytes::from_owner(Held {
            bytes,
            _reservation: self,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_return_to_the_budget_when_their_last_copy_drops() {
        let budget = MemoryBudget::new(100, Arc::new(Metrics::default()));
        let first = budget
            .try_reserve(60)
            .unwrap()
            .hold(Bytes::from(vec![1u8; 60]));
        assert!(budget.try_reserve(60).is_none());
        let copy = first.clone();
        drop(first);
        assert_eq!(budget.held(), 60, "a copy still holds the bytes");
        assert_eq!(&copy[..3], &[1, 1, 1]);
        drop(copy);
        assert_eq!(budget.held(), 0);
        assert!(budget.try_reserve(60).is_some());
    }

    #[tokio::test]
    async fn a_reservation_larger_than_the_cap_takes_the_whole_cap() {
        let budget = MemoryBudget::new(100, Arc::new(Metrics::default()));
        let all = budget.reserve(1_000).await;
        assert_eq!(budget.held(), 100);
        drop(all);
        assert_eq!(budget.held(), 0);
    }
}
