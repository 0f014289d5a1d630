//! Prometheus metrics for `scdlfs mount --metrics-addr ADDR`: `GET /metrics` answers
//! the mount's [`Status`] in the Prometheus text exposition format.
//!
//! The responder is a few lines on the mount's own runtime rather than an HTTP server
//! crate: it answers one request per connection, only `GET /metrics`, with no TLS and
//! no authentication. That is why it is off by default and meant for a loopback
//! address; binding another address is allowed (a scraper may live elsewhere) but
//! logged as a warning, since anyone who can connect reads the counters and the source.

use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::status::{Observer, Status};

/// The longest request head read; scrapers send a few hundred bytes.
const MAX_REQUEST_HEAD: usize = 8192;

/// A client that has not sent its request by then is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The media type of the Prometheus text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
                    let observer = observer.clone();
                    tokio::spawn(async move {
                        if let Err(error) = answer(stream, &observer).await {
                            tracing::debug!(%error, "metrics request failed");
                        }
                    });
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

async fn answer(mut stream: TcpStream, observer: &Observer) -> io::Result<()> {
    let head = tokio::time::timeout(REQUEST_TIMEOUT, read_request_head(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request in time"))??;
    let request_line = head.lines().next().unwrap_or_default();
    let mut words = request_line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status_line, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", render(&observer.status())),
        ("GET", _) => ("404 Not Found", "only /metrics is served\n".to_owned()),
        _ => ("405 Method Not Allowed", "only GET is served\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status_line}\r\nContent-Type: {CONTENT_TYPE}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads up to the blank line that ends the request head; the head is all we need.
async fn read_request_head(stream: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= MAX_REQUEST_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
        let read = stream.read(&mut buf).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buf[..read]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The status in the Prometheus text format: every counter as `scdlfs_<name>_total`,
/// the cache and the downloads as gauges, and `scdlfs_info` for the source.
pub fn render(status: &Status) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        );
    };
    for (name, help, value) in status.counters.described() {
        metric(
            &format!("scdlfs_{name}_total"),
            "counter",
            help,
            value as f64,
        );
    }
    let cache = &status.cache;
    metric(
        "scdlfs_cache_evicted_parts_total",
        "counter",
        "Parts evicted from the disk cache.",
        cache.evicted_parts as f64,
    );
    metric(
        "scdlfs_cache_parts_not_cached_for_lack_of_room_total",
        "counter",
        "Downloaded parts served without being cached because the budget was full.",
        cache.parts_not_cached_for_lack_of_room as f64,
    );
    metric(
        "scdlfs_cache_parts_not_cached_for_disk_errors_total",
        "counter",
        "Downloaded parts served without being cached because the cache directory could not be written.",
        cache.parts_not_cached_for_disk_errors as f64,
    );
    metric(
        "scdlfs_cache_corrupt_parts_dropped_total",
        "counter",
        "Cached parts that failed their checksum on a read, dropped and fetched again.",
        cache.corrupt_parts_dropped as f64,
    );
    let gauges = [
        (
            "scdlfs_cache_budget_bytes",
            "The disk cache's byte budget.",
            cache.budget_bytes as f64,
        ),
        (
            "scdlfs_cache_bytes",
            "Bytes of parts in the disk cache.",
            cache.cached_bytes as f64,
        ),
        (
            "scdlfs_cache_reserved_bytes",
            "Bytes reserved in the disk cache for downloads under way.",
            cache.reserved_bytes as f64,
        ),
        (
            "scdlfs_cache_disk_unusable",
            "1 while the cache directory cannot be written and parts are served uncached.",
            f64::from(u8::from(cache.disk_unusable.is_some())),
        ),
        (
            "scdlfs_cache_parts",
            "Parts in the disk cache.",
            cache.cached_parts as f64,
        ),
        (
            "scdlfs_cache_chunks",
            "SCDL chunks with parts in the disk cache.",
            cache.cached_groups as f64,
        ),
        (
            "scdlfs_downloads_in_flight",
            "Part downloads under way or queued.",
            status.downloads_in_flight as f64,
        ),
        (
            "scdlfs_prefetch_plans_active",
            "Announced prefetch plans being followed.",
            status.active_plans.len() as f64,
        ),
        (
            "scdlfs_uptime_seconds",
            "Seconds since the mount started.",
            status.uptime_seconds,
        ),
    ];
    for (name, help, value) in gauges {
        metric(name, "gauge", help, value);
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
    use crate::metrics::MetricsSnapshot;

    fn status() -> Status {
        Status {
            source: "s3://bucket/\"odd\"\\prefix".into(),
            uptime_seconds: 12.5,
            counters: MetricsSnapshot {
                bytes_fetched: 4096,
                reads: 3,
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
            },
            active_plans: Vec::new(),
            downloads_in_flight: 1,
            rates: Default::default(),
        }
    }

    #[test]
    fn every_counter_is_a_described_prometheus_counter() {
        let text = render(&status());
        for (name, _, _) in status().counters.described() {
            let metric = format!("scdlfs_{name}_total");
            assert!(text.contains(&format!("# HELP {metric} ")), "{metric}");
            assert!(
                text.contains(&format!("# TYPE {metric} counter\n")),
                "{metric}"
            );
        }
        assert!(text.contains("\nscdlfs_bytes_fetched_total 4096\n"));
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
