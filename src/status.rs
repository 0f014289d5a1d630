//! What a running mount reports about itself: the counters, the cache, the plans.
//! `scdlfs status` reads it from the mountpoint's `user.scdlfs.status` extended
//! attribute, as JSON, so reporting needs no socket and adds no entry to the tree.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cache::CacheStats;
use crate::fetch::Fetcher;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::prefetch::{PlanStatus, Prefetcher};

/// The extended attribute of the mount's root that holds the status.
pub const STATUS_XATTR: &str = "user.scdlfs.status";

/// The daemon's figures, as `scdlfs status` prints them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub source: String,
    pub uptime_seconds: f64,
    pub counters: MetricsSnapshot,
    pub cache: CacheStats,
    pub active_plans: Vec<PlanStatus>,
    pub downloads_in_flight: usize,
}

/// The parts of a running mount that report on it.
#[derive(Clone)]
pub struct Observer {
    fs_name: String,
    started: Instant,
    metrics: Arc<Metrics>,
    fetcher: Arc<Fetcher>,
    prefetcher: Arc<Prefetcher>,
}

impl Observer {
    pub fn status(&self) -> Status {
        Status {
            source: self.fs_name.clone(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            counters: self.metrics.snapshot(),
            cache: self.fetcher.cache().stats(),
            active_plans: self.prefetcher.plan_status(),
            downloads_in_flight: self.fetcher.in_flight_count(),
        }
    }

    pub fn new(
        fs_name: String,
        metrics: Arc<Metrics>,
        fetcher: Arc<Fetcher>,
        prefetcher: Arc<Prefetcher>,
    ) -> Observer {
        Observer {
            fs_name,
            started: Instant::now(),
            metrics,
            fetcher,
            prefetcher,
        }
    }
}
