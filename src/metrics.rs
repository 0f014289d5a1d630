//! The daemon's counters: plain atomics bumped on the read path, read by `scdlfs status`.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($(#[doc = $doc:literal] $name:ident),* $(,)?) => {
        /// Monotonic counters of one mount.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $doc] pub $name: AtomicU64,)*
        }

        /// A copy of the counters at one moment.
        #[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $(#[doc = $doc] pub $name: u64,)*
        }

        impl MetricsSnapshot {
            /// Every counter as (name, description, value), in declaration order, for
            /// exporters that list them all (the Prometheus endpoint).
            pub fn described(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($name), $doc.trim(), self.$name),)*]
            }
        }

        impl Metrics {
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

counters! {
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
    /// Part downloads that failed after retries.
    fetch_errors,
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
    /// Reads that found a part they needed not yet on local disk, so waited on the network.
    demand_reads_waited,
    /// Total time those reads waited, in microseconds.
    demand_wait_micros,
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
    /// Directory listings made again because `--metadata-ttl` had passed.
    listings_refreshed,
    /// Objects listed again in another version than the mount knew (`--metadata-ttl`): files opened since read the new one.
    objects_replaced,
    /// Datasets found changed in the store and discovered again (`--metadata-ttl`): files opened since see the new one.
    datasets_rediscovered,
    /// The most bytes the fetcher held at once (in flight, waiting for the disk, kept in memory, being copied): a high-water mark.
    fetch_memory_peak_bytes,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}
