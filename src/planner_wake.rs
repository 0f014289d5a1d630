//! The prefetcher's wake-up call.
//!
//! The prefetcher plans around facts that change below it: a download ends (room in
//! the cache, bytes newly local), a chunk's row offsets pass their check (the values
//! they bound can be located). The layers where those happen ring this bell instead of
//! knowing the prefetcher; `mount::assemble` hands the same bell to each of them and to
//! the prefetcher, which waits on it. Part of the bottom layer: it imports nothing of
//! the crate.

use std::sync::Arc;

use tokio::sync::Notify;

/// A bell the prefetcher waits on; cheap to clone, every clone rings the same one.
#[derive(Clone, Default)]
pub struct PlannerWake(Arc<Notify>);

impl PlannerWake {
    /// Wakes the prefetcher, now or at its next wait: rings that come while it is busy
    /// collapse into one.
    pub fn ring(&self) {
        self.0.notify_one();
    }

    /// Waits for the next ring (or returns at once for one that came meanwhile).
    pub async fn rung(&self) {
        self.0.notified().await;
    }
}
