//! The emulated cloud link: a TCP proxy on loopback between every client and the S3
//! server. Each response starts no earlier than `latency` after its request began (a
//! round trip added per request, as to a cloud region), and the bytes of all
//! responses together pass a token bucket of `rate` bytes per second (one shared
//! link, not a cap per connection). HTTP/1.1 without pipelining is assumed, which is
//! what every client here speaks: a response is whatever the server sends after the
//! client last sent something.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[derive(Args)]
pub struct ProxyArgs {
    /// Address to listen on (loopback).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The S3 server.
    #[arg(long)]
    upstream: SocketAddr,
    /// Aggregate bandwidth of responses, MB/s (10^6 bytes); 0 for no cap.
    #[arg(long, default_value_t = 200.0)]
    rate_mbps: f64,
    /// Added latency per response, milliseconds.
    #[arg(long, default_value_t = 20.0)]
    latency_ms: f64,
    /// Serve the counters as JSON at this address (any request).
    #[arg(long, default_value = "127.0.0.1:0")]
    stats: SocketAddr,
    /// Print to stderr, each with its Unix time and its connection's number, every
    /// request's first line and Range header, its response's first byte through the
    /// link, and its end with its length: which requests a reader waits for, one after
    /// another, and how long each took to come through.
    #[arg(long)]
    log_requests: bool,
}

#[derive(Default)]
struct Counters {
    bytes_down: AtomicU64,
    bytes_up: AtomicU64,
    requests: AtomicU64,
    connections: AtomicU64,
}

struct Link {
    upstream: SocketAddr,
    latency: Duration,
    /// Bytes per second; 0 for no cap.
    rate: f64,
    /// The virtual time at which the link has sent everything granted so far.
    next_free: Mutex<Instant>,
    counters: Counters,
    /// Whether requests and responses are logged (`--log-requests`).
    log_requests: bool,
}

/// Credit the link may build up while idle: a short burst, as a real link's queue.
const BURST: Duration = Duration::from_millis(5);
const PIECE: usize = 64 << 10;

impl Link {
    /// Waits until `n` more bytes fit through the shared link.
    async fn pass(&self, n: usize) {
        if self.rate <= 0.0 {
            return;
        }
        let done = {
            let mut next_free = self.next_free.lock().unwrap();
            let now = Instant::now();
            let start = (*next_free).max(now.checked_sub(BURST).unwrap_or(now));
            *next_free = start + Duration::from_secs_f64(n as f64 / self.rate);
            *next_free
        };
        tokio::time::sleep_until(done).await;
    }
}

pub fn run(args: ProxyArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(serve(args))
}

async fn serve(args: ProxyArgs) -> Result<(), String> {
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| e.to_string())?;
    let stats = TcpListener::bind(args.stats)
        .await
        .map_err(|e| e.to_string())?;
    let link = Arc::new(Link {
        upstream: args.upstream,
        latency: Duration::from_secs_f64(args.latency_ms / 1000.0),
        rate: args.rate_mbps * 1e6,
        next_free: Mutex::new(Instant::now()),
        counters: Counters::default(),
        log_requests: args.log_requests,
    });
    // The driver reads the two ports from this line.
    println!(
        "{{\"listen\": \"{}\", \"stats\": \"{}\"}}",
        listener.local_addr().unwrap(),
        stats.local_addr().unwrap()
    );
    let stats_link = link.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = stats.accept().await {
            let c = &stats_link.counters;
            let body = format!(
                "{{\"bytes_down\": {}, \"bytes_up\": {}, \"requests\": {}, \"connections\": {}}}",
                c.bytes_down.load(Ordering::Relaxed),
                c.bytes_up.load(Ordering::Relaxed),
                c.requests.load(Ordering::Relaxed),
                c.connections.load(Ordering::Relaxed)
            );
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
            let _ = conn
                .write_all(
                    format!(
                        "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    loop {
        let (client, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let link = link.clone();
        tokio::spawn(async move {
            if let Err(e) = forward(client, &link).await {
                eprintln!("proxy: connection ended with {e}");
            }
        });
    }
}

/// The request line and Range header of a request's first bytes.
fn log_request(conn: u64, head: &[u8]) {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let range = lines
        .find(|l| l.to_ascii_lowercase().starts_with("range:"))
        .unwrap_or_default();
    eprintln!("{:.4} req {conn} {first} {range}", unix_now());
}

fn unix_now() -> f64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since_epoch.map_or(0.0, |d| d.as_secs_f64())
}

async fn forward(client: TcpStream, link: &Arc<Link>) -> std::io::Result<()> {
    let server = TcpStream::connect(link.upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let conn = link.counters.connections.fetch_add(1, Ordering::Relaxed);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // When the request now waiting for its response began.
    let pending: Arc<Mutex<Option<Instant>>> = Arc::default();
    let up = {
        let (pending, link) = (pending.clone(), link.clone());
        async move {
            let mut buf = vec![0u8; PIECE];
            loop {
                let n = client_read.read(&mut buf).await?;
                if n == 0 {
                    server_write.shutdown().await?;
                    return Ok::<_, std::io::Error>(());
                }
                {
                    let mut p = pending.lock().unwrap();
                    if p.is_none() {
                        *p = Some(Instant::now());
                        link.counters.requests.fetch_add(1, Ordering::Relaxed);
                        if link.log_requests {
                            log_request(conn, &buf[..n]);
                        }
                    }
                }
                link.counters
                    .bytes_up
                    .fetch_add(n as u64, Ordering::Relaxed);
                server_write.write_all(&buf[..n]).await?;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; PIECE];
        let (mut response_bytes, mut last_piece_at) = (0usize, 0f64);
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                if link.log_requests && response_bytes > 0 {
                    eprintln!("{last_piece_at:.4} end {conn} {response_bytes}");
                }
                client_write.shutdown().await?;
                return Ok::<_, std::io::Error>(());
            }
            let began = pending.lock().unwrap().take();
            if let Some(began) = began {
                if link.log_requests && response_bytes > 0 {
                    eprintln!("{last_piece_at:.4} end {conn} {response_bytes}");
                }
                response_bytes = 0;
                tokio::time::sleep_until(began + link.latency).await;
            }
            link.pass(n).await;
            if link.log_requests {
                if response_bytes == 0 {
                    eprintln!("{:.4} first {conn}", unix_now());
                }
                response_bytes += n;
                last_piece_at = unix_now();
            }
            link.counters
                .bytes_down
                .fetch_add(n as u64, Ordering::Relaxed);
            client_write.write_all(&buf[..n]).await?;
        }
    };
    let (a, b) = tokio::join!(up, down);
    a.and(b)
}
