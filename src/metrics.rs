//! The daemon's figures of its own work: atomics bumped where the work happens (the
//! read path, the fetcher, the disk cache, the store's answers), read by `scdlfs
//! status` and the Prometheus endpoint (`metrics_http.rs`).
//!
//! Three kinds, as Prometheus has them: counters only grow; gauges are levels (a
//! high-water mark is one: it is the highest level so far, not a count of anything);
//! histograms count durations into fixed buckets. Recording is lock-free everywhere:
//! a histogram is one atomic per bucket plus one for the sum, so timing every GET and
//! every waiting read costs two relaxed atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The kinds of figures, as exporters name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

macro_rules! metrics {
    (
        counters { $(#[doc = $counter_doc:literal] $counter:ident,)* }
        gauges { $(#[doc = $gauge_doc:literal] $gauge:ident,)* }
        histograms { $(#[doc = $histogram_doc:literal] $histogram:ident,)* }
    ) => {
        /// The figures of one mount.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $counter_doc] pub $counter: AtomicU64,)*
            $(#[doc = $gauge_doc] pub $gauge: AtomicU64,)*
            $(#[doc = $histogram_doc] pub $histogram: Histogram,)*
        }

        /// A copy of the figures at one moment. Fields a daemon older than this one did
        /// not have read as zero.
        #[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
        #[serde(default)]
        pub struct MetricsSnapshot {
            $(#[doc = $counter_doc] pub $counter: u64,)*
            $(#[doc = $gauge_doc] pub $gauge: u64,)*
            $(#[doc = $histogram_doc] pub $histogram: HistogramSnapshot,)*
        }

        impl MetricsSnapshot {
            /// Every counter and gauge as (name, kind, description, value), in
            /// declaration order, for exporters that list them all (the Prometheus
            /// endpoint).
            pub fn described(&self) -> Vec<(&'static str, Kind, &'static str, u64)> {
                vec![
                    $((stringify!($counter), Kind::Counter, $counter_doc.trim(), self.$counter),)*
                    $((stringify!($gauge), Kind::Gauge, $gauge_doc.trim(), self.$gauge),)*
                ]
            }

            /// Every histogram as (name, description, snapshot), in declaration order.
            pub fn described_histograms(&self) -> Vec<(&'static str, &'static str, &HistogramSnapshot)> {
                vec![$((stringify!($histogram), $histogram_doc.trim(), &self.$histogram),)*]
            }
        }

        impl Metrics {
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot {
                    $($counter: self.$counter.load(Ordering::Relaxed),)*
                    $($gauge: self.$gauge.load(Ordering::Relaxed),)*
                    $($histogram: self.$histogram.snapshot(),)*
                }
            }
        }
    };
}

metrics! {
    counters {
        /// Passes of the prefetcher that panicked (each logged; prefetch goes on).
        prefetcher_panics,
        /// Bytes received from the object store.
        bytes_fetched,
        /// Part downloads completed.
        parts_fetched,
        /// Requests a reader sent for its own bytes because its part's download was far from them (queued, or its body far short).
        direct_reads,
        /// Of the direct reads, those sent instead of a download: bytes of a part that the cache could take only by evicting a chunk the plans need sooner (the kernel's read-around into a chunk read many steps later).
        stray_reads,
        /// Requests sent for small ranges on their own, for the kernel's read-around across a window's chunk edges, instead of their whole parts.
        edges_fetched,
        /// Bytes of parts taken from edges held in memory when their part was downloaded, instead of asked for again.
        edge_bytes_reused,
        /// Requests sent for the exact bytes a plan's rows need, instead of their whole parts (a dataset larger than the disk cache).
        planned_requests,
        /// Bytes received for those requests.
        planned_bytes,
        /// Bytes of those requests stored into the kernel's page cache for the readers' memory maps.
        planned_bytes_pushed,
        /// Bytes of row-offset objects (`row_ptr.npy`) in the store's answers to GETs, whatever asked for them (a part, an edge, a plan's exact rows, a chunk's check): the range each answer says it sends, counted as it begins. Over an epoch, set against the dataset's row offsets, it shows how often they were fetched again.
        row_offset_bytes_fetched,
        /// Requests a reader sent for its own bytes because the part file its part's download writes could not give them back (our disk failed).
        spool_failure_reads,
        /// Part downloads that failed after retries.
        fetch_errors,
        /// Announcements of the chunks cached made for hint handles' reads: at most one per dataset and change of the cache, however many handles read them.
        announcements_made,
        /// Reads answered by the FUSE layer.
        reads,
        /// Bytes returned to readers.
        bytes_read,
        /// Reads answered from the disk cache without waiting.
        reads_from_cache,
        /// Bytes around reads the disk cache served, stored into the kernel's page cache from local parts (`--cache-read-around`).
        read_around_bytes,
        /// Windows of `--cache-read-around` stored into the kernel's page cache.
        read_around_windows,
        /// Part downloads a reader started: parts neither cached nor on their way when needed, which no prefetch foresaw.
        demand_downloads,
        /// Reads that found a part already fetched by the prefetcher.
        prefetch_hits,
        /// Parts the prefetcher asked for.
        prefetch_requests,
        /// Flat chunks fetched whole because a reader without hints touched them at scattered places.
        chunks_fetched_whole,
        /// Reads that failed with an error.
        read_errors,
        /// Writes to hint files the daemon accepted (each a FUSE round trip of its writer).
        hint_writes,
        /// Refused hint writes and opens answered late, their writer held in its write(2) or open(2) up to 10 ms, because its user was refused often lately.
        hint_refusals_answered_late,
        /// Directory listings made again because `--metadata-ttl` had passed.
        listings_refreshed,
        /// Objects listed again in another version than the mount knew (`--metadata-ttl`): files opened since read the new one.
        objects_replaced,
        /// Datasets found changed in the store and discovered again (`--metadata-ttl`): files opened since see the new one.
        datasets_rediscovered,
        /// Parts evicted from the disk cache.
        cache_evicted_parts,
        /// Downloaded parts served without being cached because the budget was full.
        cache_parts_not_cached_for_lack_of_room,
        /// Downloaded parts served without being cached because the cache directory could not be written.
        cache_parts_not_cached_for_disk_errors,
        /// Cached parts that failed their checksum on a read, dropped and fetched again.
        cache_corrupt_parts_dropped,
        /// Cached parts whose file could not be read (I/O error; truncated, removed or replaced), dropped and fetched again.
        cache_unreadable_parts_dropped,
        /// Part files of an earlier mount taken over by this one.
        cache_adopted_parts,
        /// Bytes of the part files of an earlier mount taken over by this one.
        cache_adopted_bytes,
        /// Part files of an earlier mount taken over by a read before the background had read their header.
        cache_adopted_by_reads,
        /// Part files of an earlier mount removed: changed objects, another part size, bad headers, torn writes, or beyond a smaller budget.
        cache_stale_parts_removed,
    }
    gauges {
        /// The most bytes the fetcher held at once (in flight, waiting for the disk, kept in memory, being copied): a high-water mark.
        fetch_memory_peak_bytes,
    }
    histograms {
        /// How long reads that found a part they needed not yet on local disk waited for the network, in seconds.
        demand_wait_seconds,
        /// How long the object store took to answer a GET (its status and headers, after any retries; the body's transfer is not counted), in seconds.
        store_get_seconds,
    }
}

impl Metrics {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

/// The upper bounds of the duration buckets: from a page-cache-fast local answer to
/// beyond the default `--read-timeout`, dense where a store's answers and a training
/// step's waits fall.
pub const DURATION_BOUNDS: [Duration; 16] = [
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
];

/// Durations counted into the buckets of [`DURATION_BOUNDS`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket, not cumulative (one add per observation), and last
    /// those longer than every bound.
    counts: [AtomicU64; DURATION_BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn record(&self, duration: Duration) {
        let bucket = DURATION_BOUNDS.partition_point(|bound| *bound < duration);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The buckets made cumulative. Taken while observations are recorded, the sum may
    /// lack the durations of the last few counted (Prometheus tolerates that); the
    /// buckets and the count always agree, since the count is their total.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let sum = Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)).as_secs_f64();
        let mut cumulative = 0;
        let buckets = DURATION_BOUNDS
            .iter()
            .zip(&self.counts)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (bound.as_secs_f64(), cumulative)
            })
            .collect();
        let beyond_every_bound = self.counts[DURATION_BOUNDS.len()].load(Ordering::Relaxed);
        HistogramSnapshot {
            count: cumulative + beyond_every_bound,
            sum,
            buckets,
        }
    }
}

/// A histogram at one moment, cumulative as Prometheus writes it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct HistogramSnapshot {
    /// Observations.
    pub count: u64,
    /// Their total, in seconds.
    pub sum: f64,
    /// (upper bound in seconds, observations at most that long), bounds ascending.
    /// Observations longer than the last bound are in `count` only.
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramSnapshot {
    /// The mean observation in seconds, 0 without any.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_duration_equal_to_a_bound_falls_in_that_bound_s_bucket() {
        let histogram = Histogram::default();
        histogram.record(Duration::from_millis(10));
        let snapshot = histogram.snapshot();
        let at = |bound: f64| {
            snapshot
                .buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .unwrap()
                .1
        };
        assert_eq!(at(0.005), 0);
        assert_eq!(at(0.01), 1);
        assert_eq!(snapshot.count, 1);
        assert_eq!(snapshot.sum, 0.01);
    }

    #[test]
    fn a_duration_beyond_every_bound_is_counted_but_in_no_bucket() {
        let histogram = Histogram::default();
        histogram.record(Duration::from_secs(61));
        let snapshot = histogram.snapshot();
        assert!(snapshot.buckets.iter().all(|&(_, count)| count == 0));
        assert_eq!(snapshot.count, 1);
        assert_eq!(snapshot.sum, 61.0);
        assert_eq!(snapshot.mean(), 61.0);
    }

    #[test]
    fn an_empty_histogram_has_every_bucket_at_zero_and_a_mean_of_zero() {
        let snapshot = Histogram::default().snapshot();
        assert_eq!(snapshot.buckets.len(), DURATION_BOUNDS.len());
        assert_eq!(
            (snapshot.count, snapshot.sum, snapshot.mean()),
            (0, 0.0, 0.0)
        );
    }

    proptest! {
        #[test]
        fn each_bucket_counts_the_observations_at_most_its_bound(
            micros in prop::collection::vec(0u64..90_000_000, 0..50)
        ) {
            let histogram = Histogram::default();
            for &m in &micros {
                histogram.record(Duration::from_micros(m));
            }
            let snapshot = histogram.snapshot();
            prop_assert_eq!(snapshot.count, micros.len() as u64);
            for (bound, (le, cumulative)) in DURATION_BOUNDS.iter().zip(&snapshot.buckets) {
                prop_assert_eq!(*le, bound.as_secs_f64());
                let at_most = micros.iter().filter(|&&m| Duration::from_micros(m) <= *bound).count();
                prop_assert_eq!(*cumulative, at_most as u64);
            }
            let total: u64 = micros.iter().sum();
            prop_assert!((snapshot.sum - total as f64 / 1e6).abs() < 1e-6);
        }
    }
}
