//! Prometheus metrics for `scdlfs mount --metrics-addr ADDR`: `GET /metrics` answers
//! the mount's [`Status`] in the Prometheus text exposition format.
//!
//! hyper serves the HTTP on the mount's own runtime, one request per connection, only
//! `GET /metrics`, with no TLS and no authentication. That is why it is off by default
//! and meant for a loopback address; binding another address is allowed (a scraper may
//! live elsewhere) but logged as a warning, since anyone who can connect reads the
//! counters and the source.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::metrics::{HistogramSnapshot, Kind};
use crate::status::{Observer, Status};

/// The longest request head read (hyper's smallest buffer); scrapers send a few
/// hundred bytes.
const MAX_REQUEST_HEAD: usize = 8192;

/// A client that has not sent its request by then is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The media type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds `address` now, so that a taken port fails the mount before it is made.
pub fn bind(address: std::net::SocketAddr) -> io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    if !address.ip().is_loopback() {
        tracing::warn!(%address, "metrics are served beyond loopback, without authentication");
    }
    Ok(listener)
}

/// Answers scrapes on `listener` from tasks on `runtime` until the runtime shuts down.
pub fn serve(
    listener: std::net::TcpListener,
    observer: Observer,
    runtime: &tokio::runtime::Handle,
) -> io::Result<()> {
    let _entered = runtime.enter();
    let listener = TcpListener::from_std(listener)?;
    runtime.spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(answer(stream, observer.clone()));
                }
                Err(error) => {
                    // Out of descriptors, most likely: wait instead of spinning.
                    tracing::warn!(%error, "cannot accept a metrics connection");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(())
}

async fn answer(stream: TcpStream, observer: Observer) {
    let service = hyper::service::service_fn(move |request: Request<_>| {
        let response = respond(&request, &observer);
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD)
        .keep_alive(false)
        // `Content-Type`, as before hyper: names are case-insensitive, but people grep.
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(error) = connection.await {
        tracing::debug!(%error, "metrics request failed");
    }
}

fn respond<B>(request: &Request<B>, observer: &Observer) -> Response<Full<Bytes>> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            render(&observer.status()) + &render_process(),
        ),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "only /metrics is served\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let content_type = HeaderValue::from_static(PROMETHEUS_TEXT);
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}

/// A counter's or gauge's name with its unit last, as Prometheus names end in their
/// unit: the field `bytes_fetched` is `fetched_bytes`, `edge_bytes_reused` is
/// `edge_reused_bytes`.
fn unit_last(field: &str) -> String {
    let mut words: Vec<&str> = field.split('_').collect();
    if let Some(at) = words.iter().position(|w| matches!(*w, "bytes" | "seconds")) {
        let unit = words.remove(at);
        words.push(unit);
    }
    words.join("_")
}

/// The standard `process_*` metrics of Prometheus' client libraries, read from `/proc`
/// at each scrape: CPU seconds, resident and virtual memory, start time, descriptors.
fn render_process() -> String {
    let mut out = String::new();
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return out;
    };
    // The fields after the command name, which may hold spaces and parentheses itself;
    // `fields[0]` is the state (field 3 of proc(5)).
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default();
    let field = |number: usize| fields.get(number - 3).copied().unwrap_or(0) as f64;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let boot_time = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|stat| {
            stat.lines()
                .find_map(|line| line.strip_prefix("btime ")?.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count());
    let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let metrics = [
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent in seconds.",
            (field(14) + field(15)) / ticks,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            field(24) * rustix::param::page_size() as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            field(23),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            boot_time + field(22) / ticks,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            open_fds as f64,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            max_fds as f64,
        ),
    ];
    for (name, kind, help, value) in metrics {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        );
    }
    out
}

/// How one of [`STATUS_FIGURES`] is read from a status.
type ReadFigure = fn(&Status) -> f64;

/// The figures of a status beside its counter table (the cache's books, the downloads,
/// the plans, the daemon's memory), all gauges, as Prometheus names them: name, type,
/// help, and how each is read.
const STATUS_FIGURES: &[(&str, &str, &str, ReadFigure)] = &[
    (
        "scdlfs_cache_budget_bytes",
        "gauge",
        "The disk cache's byte budget.",
        |status| status.cache.budget_bytes as f64,
    ),
    (
        "scdlfs_cache_bytes",
        "gauge",
        "Bytes of parts in the disk cache.",
        |status| status.cache.cached_bytes as f64,
    ),
    (
        "scdlfs_cache_reserved_bytes",
        "gauge",
        "Bytes reserved in the disk cache for downloads under way.",
        |status| status.cache.reserved_bytes as f64,
    ),
    (
        "scdlfs_cache_disk_unusable",
        "gauge",
        "1 while the cache directory cannot be written and parts are served uncached.",
        |status| f64::from(u8::from(status.cache.disk_unusable.is_some())),
    ),
    (
        "scdlfs_cache_parts",
        "gauge",
        "Parts in the disk cache.",
        |status| status.cache.cached_parts as f64,
    ),
    (
        "scdlfs_cache_chunks",
        "gauge",
        "SCDL chunks with parts in the disk cache.",
        |status| status.cache.cached_groups as f64,
    ),
    (
        "scdlfs_downloads_in_flight",
        "gauge",
        "Part downloads under way or queued.",
        |status| status.downloads_in_flight as f64,
    ),
    (
        "scdlfs_prefetch_plans_active",
        "gauge",
        "Announced prefetch plans being followed.",
        |status| status.active_plans.len() as f64,
    ),
    (
        "scdlfs_uptime_seconds",
        "gauge",
        "Seconds since the mount started.",
        |status| status.uptime_seconds,
    ),
    (
        "scdlfs_resident_bytes",
        "gauge",
        "The daemon's resident set size.",
        |status| status.memory.resident_bytes as f64,
    ),
    (
        "scdlfs_heap_in_use_bytes",
        "gauge",
        "Heap bytes in live allocations (glibc).",
        |status| status.memory.heap_in_use_bytes as f64,
    ),
    (
        "scdlfs_heap_free_kept_bytes",
        "gauge",
        "Heap bytes freed but kept by the allocator (glibc).",
        |status| status.memory.heap_free_kept_bytes as f64,
    ),
];

/// The status in the Prometheus text format: every counter as `scdlfs_<name>_total`,
/// every gauge (the cache, the downloads, high-water marks) as `scdlfs_<name>`, the
/// durations as histograms in seconds, and `scdlfs_info` for the source.
pub fn render(status: &Status) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        );
    };
    for (name, kind, help, value) in status.counters.described() {
        match kind {
            Kind::Counter => metric(
                &format!("scdlfs_{}_total", unit_last(name)),
                "counter",
                help,
                value as f64,
            ),
            Kind::Gauge => metric(
                &format!("scdlfs_{}", unit_last(name)),
                "gauge",
                help,
                value as f64,
            ),
        }
    }
    for (name, kind, help, read) in STATUS_FIGURES {
        metric(name, kind, help, read(status));
    }
    for (name, help, histogram) in status.counters.described_histograms() {
        write_histogram(&mut out, &format!("scdlfs_{name}"), help, histogram);
    }
    let _ = write!(
        out,
        "# HELP scdlfs_info The mount's source and scdlfs version.\n\
         # TYPE scdlfs_info gauge\n\
         scdlfs_info{{source=\"{}\",version=\"{}\"}} 1\n",
        escape_label_value(&status.source),
        env!("CARGO_PKG_VERSION"),
    );
    out
}

/// A histogram as Prometheus lays it out: cumulative `_bucket`s up to `+Inf` (which is
/// the count), then `_sum` and `_count`.
fn write_histogram(out: &mut String, name: &str, help: &str, histogram: &HistogramSnapshot) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, count) in &histogram.buckets {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
    }
    let HistogramSnapshot { count, sum, .. } = histogram;
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
}

/// Label values escape backslash, double quote and newline.
fn escape_label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheStats;
    use crate::metrics::{Histogram, MetricsSnapshot};

    fn status() -> Status {
        Status {
            source: "s3://bucket/\"odd\"\\prefix".into(),
            uptime_seconds: 12.5,
            counters: MetricsSnapshot {
                bytes_fetched: 4096,
                reads: 3,
                fetch_memory_peak_bytes: 1 << 16,
                cache_evicted_parts: 5,
                demand_wait_seconds: waits(&[3, 3, 40]),
                ..MetricsSnapshot::default()
            },
            cache: CacheStats {
                budget_bytes: 1 << 20,
                cached_bytes: 8192,
                reserved_bytes: 0,
                cached_parts: 2,
                cached_groups: 1,
                evicted_parts: 5,
                parts_not_cached_for_lack_of_room: 0,
                corrupt_parts_dropped: 0,
                disk_unusable: None,
                parts_not_cached_for_disk_errors: 0,
                ..CacheStats::default()
            },
            active_plans: Vec::new(),
            downloads_in_flight: 1,
            rates: Default::default(),
            memory: Default::default(),
            hint_refusals: Vec::new(),
        }
    }

    /// A histogram of waits of these many milliseconds.
    fn waits(millis: &[u64]) -> HistogramSnapshot {
        let histogram = Histogram::default();
        for &m in millis {
            histogram.record(Duration::from_millis(m));
        }
        histogram.snapshot()
    }

    #[test]
    fn every_counter_is_a_described_prometheus_counter() {
        let text = render(&status());
        let counters = status().counters.described();
        let counters = counters
            .iter()
            .filter(|(_, kind, _, _)| *kind == Kind::Counter);
        for (name, _, _, _) in counters {
            let metric = format!("scdlfs_{}_total", unit_last(name));
            assert!(text.contains(&format!("# HELP {metric} ")), "{metric}");
            assert!(
                text.contains(&format!("# TYPE {metric} counter\n")),
                "{metric}"
            );
        }
        assert!(text.contains("\nscdlfs_fetched_bytes_total 4096\n"));
        assert!(text.contains("\nscdlfs_reads_total 3\n"));
        assert!(text.contains("\nscdlfs_cache_evicted_parts_total 5\n"));
    }

    #[test]
    fn the_cache_and_downloads_are_gauges() {
        let text = render(&status());
        assert!(text.contains("# TYPE scdlfs_cache_bytes gauge\nscdlfs_cache_bytes 8192\n"));
        assert!(text.contains("\nscdlfs_downloads_in_flight 1\n"));
        assert!(text.contains("\nscdlfs_uptime_seconds 12.5\n"));
    }

    #[test]
    fn a_high_water_mark_is_a_gauge_not_a_counter() {
        let text = render(&status());
        assert!(text.contains(
            "# TYPE scdlfs_fetch_memory_peak_bytes gauge\nscdlfs_fetch_memory_peak_bytes 65536\n"
        ));
        assert!(!text.contains("scdlfs_fetch_memory_peak_bytes_total"));
    }

    #[test]
    fn durations_are_histograms_in_seconds_with_cumulative_buckets() {
        let text = render(&status());
        assert!(text.contains("# TYPE scdlfs_demand_wait_seconds histogram\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_bucket{le=\"0.0025\"} 0\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_bucket{le=\"0.05\"} 3\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_bucket{le=\"60\"} 3\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_sum 0.046\n"));
        assert!(text.contains("\nscdlfs_demand_wait_seconds_count 3\n"));
        assert!(text.contains("# TYPE scdlfs_store_get_seconds histogram\n"));
        assert!(text.contains("\nscdlfs_store_get_seconds_count 0\n"));
    }

    #[test]
    fn no_name_carries_a_unit_other_than_a_base_unit() {
        let text = render(&status());
        for name in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            for word in ["micros", "millis", "nanos", "ms", "us", "kib", "mib"] {
                assert!(!name.split(['_', ' ']).any(|w| w == word), "{name}");
            }
        }
    }

    #[test]
    fn every_name_ends_in_its_unit() {
        let text = render(&status()) + &render_process();
        for name in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let (name, kind) = name.split_once(' ').unwrap();
            let name = name.strip_suffix("_total").unwrap_or(name);
            for unit in ["bytes", "seconds"] {
                if name.split('_').any(|w| w == unit) {
                    assert!(name.ends_with(unit), "{name} ({kind})");
                }
            }
        }
    }

    #[test]
    fn the_process_metrics_are_the_standard_ones() {
        let text = render_process();
        for name in [
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_open_fds",
            "process_max_fds",
        ] {
            let value = text
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {text}"));
            assert!(value.parse::<f64>().unwrap() > 0.0, "{name} {value}");
        }
    }

    #[test]
    fn every_sample_line_is_a_name_and_a_number() {
        for line in render(&status()).lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').expect(line);
            assert!(name.starts_with("scdlfs_"), "{line}");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn the_source_label_is_escaped() {
        assert!(render(&status()).contains(r#"source="s3://bucket/\"odd\"\\prefix""#));
    }
}
