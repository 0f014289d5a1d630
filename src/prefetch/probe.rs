//! What the tests see and drive of a prefetcher: its passes run on demand and counted,
//! its plans' datasets, the downloads it started, the ranks it gave, and a hook where
//! a prefetch is issued. Built with the test-support feature only, never into the
//! daemon: the counters cost the top-up's hot loop an atomic add per item.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::Prefetcher;
use crate::cache::{EvictionAdvisor, NextUse, Unit};
use crate::catalog::Dataset;
use crate::fetch::Fetcher;
use crate::metrics::MetricsSnapshot;
use crate::object::ObjectInfo;

/// Called as the top-up issues each prefetch.
pub type IssueHook = Arc<dyn Fn() + Send + Sync>;

/// What a prefetcher counts and calls for its tests.
#[derive(Default)]
pub struct PassCounters {
    /// Top-up passes run.
    pub top_up_passes: AtomicU64,
    /// Items of steps the passes walked.
    pub items_walked: AtomicU64,
    /// Plans' horizons ranked.
    pub horizons_ranked: AtomicU64,
    /// Called as the top-up issues each prefetch: a test holds it there.
    pub(super) issue_hook: Mutex<Option<IssueHook>>,
}

impl PassCounters {
    /// Runs the hook, if a test set one, as a prefetch is issued.
    pub(super) fn before_issuing(&self) {
        let hook = self.issue_hook.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// A prefetcher as its tests see it.
pub struct Probe<'a>(pub(super) &'a Prefetcher);

impl Probe<'_> {
    /// Runs a top-up pass now, in this thread.
    pub fn top_up(&self) {
        self.0.top_up();
    }

    /// Ranks the plans now, in this thread.
    pub fn rank_plans(&self) {
        self.0.rank_plans();
    }

    pub fn counters(&self) -> &PassCounters {
        &self.0.counters
    }

    /// Sets the hook called as each prefetch is issued.
    pub fn on_issue(&self, hook: IssueHook) {
        *self.0.counters.issue_hook.lock() = Some(hook);
    }

    /// Holds off every top-up pass while the guard lives.
    pub fn hold_passes(&self) -> MutexGuard<'_, ()> {
        self.0.top_up_pass.lock()
    }

    /// The dataset of the plan of hint handle `handle`.
    pub fn dataset_of(&self, handle: u64) -> Dataset {
        self.0.plans.lock()[&handle].dataset.clone()
    }

    /// Whether part `index` of `object` is downloading.
    pub fn is_in_flight(&self, object: &ObjectInfo, index: u64) -> bool {
        self.0.fetcher.is_in_flight(Fetcher::key(object, index))
    }

    pub fn in_flight_count(&self) -> usize {
        self.0.fetcher.in_flight_count()
    }

    pub fn max_concurrent_requests(&self) -> usize {
        self.0.fetcher.max_concurrent_requests()
    }

    /// The rank the plans give `unit` for eviction.
    pub fn next_use(&self, unit: Unit) -> Option<NextUse> {
        EvictionAdvisor::next_use(self.0.advice.as_ref(), unit)
    }

    /// The one object of `unit` the plans read from the cache, if they read no other.
    pub fn reads_only(&self, unit: Unit) -> Option<crate::parts::ObjectId> {
        EvictionAdvisor::reads_only(self.0.advice.as_ref(), unit)
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.0.metrics.snapshot()
    }
}
