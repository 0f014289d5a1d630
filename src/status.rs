//! What a running mount reports about itself: the counters, the cache, the plans.
//! `scdlfs status` reads it from the mountpoint's `user.scdlfs.status` extended
//! attribute, as JSON, so reporting needs no socket and adds no entry to the tree.
//!
//! Besides the raw counters it derives throughput and hit ratios. The counters are
//! summed over every dataset of the mount, so these figures are per mount, not per
//! dataset.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::cache::{CacheStats, DiskCache};
use crate::fetch::Fetcher;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::prefetch::budget::HintRefusals;
use crate::prefetch::{PlanStatus, Prefetcher, Viewer};
use crate::process_memory::ProcessMemory;

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
    /// Absent from the JSON of daemons older than this field.
    #[serde(default)]
    pub rates: Rates,
    /// Absent from the JSON of daemons older than this field.
    #[serde(default)]
    pub memory: ProcessMemory,
    /// Refused hint writes (and hint opens), by user: as [`Status::active_plans`], a
    /// user other than root and the mounting user sees only their own. Absent from the
    /// JSON of daemons older than this field.
    #[serde(default)]
    pub hint_refusals: Vec<HintRefusals>,
}

/// Throughput and hit ratios derived from the counters, over the whole mount.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Bytes received from the object store per second, since the mount started.
    pub fetched_bytes_per_second: f64,
    /// Bytes returned to readers per second, since the mount started.
    pub read_bytes_per_second: f64,
    /// Bytes received from the object store per second over the last `recent_seconds`.
    pub recent_fetched_bytes_per_second: f64,
    /// Bytes returned to readers per second over the last `recent_seconds`.
    pub recent_read_bytes_per_second: f64,
    /// The span the recent rates cover: about [`RECENT_WINDOW`] when the status is
    /// asked for regularly (`--watch`, a scraper), otherwise the time since it was last
    /// asked for (or since the start).
    pub recent_seconds: f64,
    /// Share of reads answered from the disk cache without waiting for the network.
    pub cache_hit_ratio: f64,
    /// Share of the parts the prefetcher downloaded that a reader then needed.
    pub prefetch_use_ratio: f64,
}

/// How far back the recent rates look.
pub const RECENT_WINDOW: Duration = Duration::from_secs(10);

/// Samples are kept at most this often, which bounds their number whatever the polling.
const SAMPLE_SPACING: Duration = Duration::from_secs(1);

/// Byte counters at one moment, the baselines of the recent rates.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    bytes_fetched: u64,
    bytes_read: u64,
}

/// Recent samples, oldest first: the first is the newest one at least
/// [`RECENT_WINDOW`] old, or the oldest one if none is that old yet.
#[derive(Debug)]
struct RecentSamples(VecDeque<Sample>);

impl RecentSamples {
    fn starting_at(started: Instant) -> RecentSamples {
        RecentSamples(VecDeque::from([Sample {
            at: started,
            bytes_fetched: 0,
            bytes_read: 0,
        }]))
    }

    /// Records `now` and returns the rates since the baseline, in bytes per second,
    /// with the span they cover: (fetched, read, seconds).
    fn rates_until(&mut self, now: Sample) -> (f64, f64, f64) {
        while self
            .0
            .get(1)
            .is_some_and(|second| now.at.duration_since(second.at) >= RECENT_WINDOW)
        {
            self.0.pop_front();
        }
        let baseline = self.0[0];
        let seconds = now.at.duration_since(baseline.at).as_secs_f64();
        let per_second = |now: u64, then: u64| {
            if seconds > 0.0 {
                now.saturating_sub(then) as f64 / seconds
            } else {
                0.0
            }
        };
        let rates = (
            per_second(now.bytes_fetched, baseline.bytes_fetched),
            per_second(now.bytes_read, baseline.bytes_read),
            seconds,
        );
        let newest = self.0.back().expect("the baseline is never removed");
        if now.at.duration_since(newest.at) >= SAMPLE_SPACING {
            self.0.push_back(now);
        }
        rates
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).min(1.0)
    }
}

/// The parts of a running mount that report on it.
#[derive(Clone)]
pub struct Observer {
    fs_name: String,
    started: Instant,
    metrics: Arc<Metrics>,
    fetcher: Arc<Fetcher>,
    cache: Arc<DiskCache>,
    prefetcher: Arc<Prefetcher>,
    recent: Arc<Mutex<RecentSamples>>,
}

impl Observer {
    /// The whole status, as root sees it.
    pub fn status(&self) -> Status {
        self.status_seen_by(Viewer::All)
    }

    /// The status as `viewer` may see it: other users' plans and refusals left out.
    pub fn status_seen_by(&self, viewer: Viewer) -> Status {
        let now = Instant::now();
        let counters = self.metrics.snapshot();
        let uptime_seconds = now.duration_since(self.started).as_secs_f64();
        let (recent_fetched, recent_read, recent_seconds) =
            self.recent.lock().rates_until(Sample {
                at: now,
                bytes_fetched: counters.bytes_fetched,
                bytes_read: counters.bytes_read,
            });
        let since_start = |bytes: u64| {
            if uptime_seconds > 0.0 {
                bytes as f64 / uptime_seconds
            } else {
                0.0
            }
        };
        let rates = Rates {
            fetched_bytes_per_second: since_start(counters.bytes_fetched),
            read_bytes_per_second: since_start(counters.bytes_read),
            recent_fetched_bytes_per_second: recent_fetched,
            recent_read_bytes_per_second: recent_read,
            recent_seconds,
            cache_hit_ratio: ratio(counters.reads_from_cache, counters.reads),
            prefetch_use_ratio: ratio(counters.prefetch_hits, counters.prefetch_requests),
        };
        Status {
            source: self.fs_name.clone(),
            uptime_seconds,
            counters,
            cache: self.cache.stats(),
            active_plans: self.prefetcher.plan_status(viewer),
            hint_refusals: self
                .prefetcher
                .budget()
                .refusals()
                .into_iter()
                .filter(|r| viewer == Viewer::All || viewer == Viewer::User(r.uid))
                .collect(),
            downloads_in_flight: self.fetcher.in_flight_count(),
            rates,
            memory: ProcessMemory::now(),
        }
    }

    pub fn new(
        fs_name: String,
        metrics: Arc<Metrics>,
        fetcher: Arc<Fetcher>,
        cache: Arc<DiskCache>,
        prefetcher: Arc<Prefetcher>,
    ) -> Observer {
        let started = Instant::now();
        Observer {
            fs_name,
            started,
            metrics,
            fetcher,
            cache,
            prefetcher,
            recent: Arc::new(Mutex::new(RecentSamples::starting_at(started))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(started: Instant, seconds: u64, bytes_fetched: u64) -> Sample {
        Sample {
            at: started + Duration::from_secs(seconds),
            bytes_fetched,
            bytes_read: 2 * bytes_fetched,
        }
    }

    #[test]
    fn the_first_recent_rate_covers_the_time_since_the_start() {
        let started = Instant::now();
        let mut samples = RecentSamples::starting_at(started);
        assert_eq!(
            samples.rates_until(sample(started, 4, 400)),
            (100.0, 200.0, 4.0)
        );
    }

    #[test]
    fn recent_rates_forget_traffic_older_than_the_window_when_polled_regularly() {
        let started = Instant::now();
        let mut samples = RecentSamples::starting_at(started);
        // A burst of 1000 bytes in the first second, then nothing, polled every second.
        samples.rates_until(sample(started, 1, 1000));
        for second in 2..=30 {
            samples.rates_until(sample(started, second, 1000));
        }
        let (fetched, _, seconds) = samples.rates_until(sample(started, 31, 1000));
        assert_eq!(fetched, 0.0);
        assert_eq!(seconds, RECENT_WINDOW.as_secs_f64());
    }

    #[test]
    fn recent_rates_after_a_long_silence_cover_the_time_since_the_last_poll() {
        let started = Instant::now();
        let mut samples = RecentSamples::starting_at(started);
        samples.rates_until(sample(started, 1, 100));
        let (fetched, _, seconds) = samples.rates_until(sample(started, 101, 1100));
        assert_eq!((fetched, seconds), (10.0, 100.0));
    }

    #[test]
    fn samples_stay_few_however_often_the_status_is_asked_for() {
        let started = Instant::now();
        let mut samples = RecentSamples::starting_at(started);
        for millis in 0..60_000 {
            samples.rates_until(Sample {
                at: started + Duration::from_millis(millis),
                bytes_fetched: millis,
                bytes_read: millis,
            });
        }
        assert!(samples.0.len() <= 12, "{} samples kept", samples.0.len());
    }

    #[test]
    fn ratios_of_nothing_are_zero_and_never_exceed_one() {
        assert_eq!(ratio(0, 0), 0.0);
        assert_eq!(ratio(3, 4), 0.75);
        assert_eq!(ratio(5, 4), 1.0);
    }
}
