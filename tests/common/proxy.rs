//! A fault-injecting HTTP proxy on 127.0.0.1, placed between a mount's object client
//! and moto_server, so that object_store's own retries and timeouts are part of what
//! the fault tests exercise. Raw TCP, one request per connection (it answers with
//! `Connection: close`): for each request a rule the test supplies picks a [`Fault`]
//! or lets it through.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Answers with this status and an empty body instead of asking the server.
    Status(u16),
    /// Sends the headers and half the body, then resets the connection.
    ResetMidBody,
    /// Sends the headers (full Content-Length) and half the body, then closes.
    TruncateBody,
    /// A 206 for the first half of the range asked, with headers that agree with it.
    ShortPartial,
    /// Sends the headers, then nothing, ever.
    StallAfterHeaders,
    /// Sends the headers, then the body a byte at a time, a byte every 300 ms: never
    /// silent for long, never done in time.
    Trickle,
    /// Reads the request and never answers.
    StallNoHeaders,
    /// Closes the connection without answering (an outage).
    Refuse,
    /// Answers a listing with an empty page that says more pages follow, whatever
    /// page was asked for: a listing that never ends.
    EndlessListing,
    /// Answers a listing with a page of this many made-up subdirectories of the prefix
    /// asked for, that says more pages follow: a listing without end that holds more
    /// with every page.
    FullListingPages(usize),
    /// Answers with the server's listing, every object's `<Size>` replaced by this: a
    /// store that lies about sizes.
    ListedSizes(u64),
    /// Asks the server for a listing page of at most `keys` entries and answers it
    /// `delay` late: a dataset of a few hundred objects lists in as many pages, each
    /// as slow, as an atlas of 10^5 objects from a real store.
    SlowPages {
        keys: u32,
        delay: std::time::Duration,
    },
}

/// One request as a rule sees it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// How many requests with this method and path came before this one.
    pub repeat: u64,
    /// Every header, as sent.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The access key ID an AWS SigV4 `Authorization` header names, if signed.
    pub fn access_key_id(&self) -> Option<&str> {
        let credential = self.header("authorization")?.split("Credential=").nth(1)?;
        credential.split('/').next()
    }
}

type Rule = dyn Fn(&Request) -> Option<Fault> + Send + Sync;

struct State {
    upstream: SocketAddr,
    rule: Mutex<Arc<Rule>>,
    seen: Mutex<HashMap<(String, String), u64>>,
    ranges: Mutex<HashMap<(String, Option<String>), u64>>,
    requests: AtomicU64,
    injected: Mutex<HashMap<Fault, u64>>,
    log: Mutex<Vec<Request>>,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl FaultProxy {
    /// A proxy to `upstream` (`http://127.0.0.1:PORT`) that lets everything through.
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .expect("upstream address");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            rule: Mutex::new(Arc::new(|_: &Request| None)),
            seen: Mutex::new(HashMap::new()),
            ranges: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            injected: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
        });
        runtime.spawn({
            let state = state.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(serve(state.clone(), client));
                }
            }
        });
        FaultProxy {
            addr,
            state,
            _runtime: runtime,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the rule for the requests that follow.
    pub fn set_rule(&self, rule: impl Fn(&Request) -> Option<Fault> + Send + Sync + 'static) {
        *self.state.rule.lock() = Arc::new(rule);
    }

    /// Requests seen so far.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// The most requests any one ranged GET (same object, same range) was sent.
    pub fn most_tries_of_a_range(&self) -> u64 {
        self.state
            .ranges
            .lock()
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Every request seen so far, in order of arrival.
    pub fn seen(&self) -> Vec<Request> {
        self.state.log.lock().clone()
    }

    /// Faults injected so far, by kind.
    pub fn injected(&self) -> HashMap<Fault, u64> {
        self.state.injected.lock().clone()
    }
}

async fn serve(state: Arc<State>, mut client: TcpStream) {
    let Some(request) = read_head(&mut client).await else {
        return;
    };
    // A PUT's body, passed on as it came.
    let mut sent =
        vec![0u8; header(&request, "content-length").map_or(0, |n| n.parse().unwrap_or(0))];
    if client.read_exact(&mut sent).await.is_err() {
        return;
    }
    let info = parse_request(&request);
    let info = {
        let mut seen = state.seen.lock();
        let repeat = seen
            .entry((info.method.clone(), info.path.clone()))
            .or_default();
        let info = Request {
            repeat: *repeat,
            ..info
        };
        *repeat += 1;
        info
    };
    state.requests.fetch_add(1, Ordering::Relaxed);
    state.log.lock().push(info.clone());
    if info.method == "GET" && info.range.is_some() {
        *state
            .ranges
            .lock()
            .entry((info.path.clone(), info.range.clone()))
            .or_default() += 1;
    }
    let rule = state.rule.lock().clone();
    let fault = rule(&info);
    if let Some(fault) = fault {
        *state.injected.lock().entry(fault).or_default() += 1;
    }
    match fault {
        Some(Fault::Refuse) => return,
        Some(Fault::StallNoHeaders) => return stall(client).await,
        Some(Fault::EndlessListing) => {
            let page = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><IsTruncated>true</IsTruncated><KeyCount>0</KeyCount><NextContinuationToken>page-{}</NextContinuationToken></ListBucketResult>",
                info.repeat + 1
            );
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
            return;
        }
        Some(Fault::FullListingPages(entries)) => {
            let prefix = info
                .path
                .split(['?', '&'])
                .find_map(|p| p.strip_prefix("prefix="))
                .unwrap_or_default()
                .replace("%2F", "/");
            let page = state.requests.load(Ordering::Relaxed);
            let mut body = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><IsTruncated>true</IsTruncated>");
            for n in 0..entries {
                body.push_str(&format!(
                    "<CommonPrefixes><Prefix>{prefix}p{page}-{n}/</Prefix></CommonPrefixes>"
                ));
            }
            body.push_str(&format!("<KeyCount>{entries}</KeyCount><NextContinuationToken>page-{page}</NextContinuationToken></ListBucketResult>"));
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
            return;
        }
        Some(Fault::Status(status)) => {
            let answer = format!(
                "HTTP/1.1 {status} Injected\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = client.write_all(answer.as_bytes()).await;
            return;
        }
        _ => {}
    }
    let request = match fault {
        Some(Fault::SlowPages { keys, delay }) => {
            tokio::time::sleep(delay).await;
            with_max_keys(&request, keys)
        }
        _ => request,
    };
    let Some((head, body)) = forward(&state, &request, &sent, &info).await else {
        return;
    };
    let head = with_connection_close(&head);
    let half = body.len() / 2;
    match fault {
        None | Some(Fault::SlowPages { .. }) => {
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(&body).await;
        }
        Some(Fault::ResetMidBody) => {
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(&body[..half]).await;
            let _ = client.set_zero_linger();
        }
        Some(Fault::TruncateBody) => {
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(&body[..half]).await;
        }
        Some(Fault::ListedSizes(size)) => {
            let body = with_listed_sizes(&body, size);
            let head = with_content_length(&head, body.len() as u64);
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(&body).await;
        }
        Some(Fault::ShortPartial) => {
            let head = shorten_partial(&head, half as u64);
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(&body[..half]).await;
        }
        Some(Fault::StallAfterHeaders) => {
            let _ = client.write_all(head.as_bytes()).await;
            return stall(client).await;
        }
        Some(Fault::Trickle) => {
            let _ = client.write_all(head.as_bytes()).await;
            for byte in body.chunks(1) {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                if client.write_all(byte).await.is_err() {
                    return;
                }
            }
        }
        Some(
            Fault::Status(_)
            | Fault::Refuse
            | Fault::StallNoHeaders
            | Fault::EndlessListing
            | Fault::FullListingPages(_),
        ) => {
            unreachable!()
        }
    }
    let _ = client.shutdown().await;
}

/// Holds the connection open, silent, until the client gives up on it.
async fn stall(mut client: TcpStream) {
    let mut sink = [0u8; 1024];
    while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// The request line and headers.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).ok()
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn parse_request(head: &str) -> Request {
    let mut words = head.split_whitespace();
    Request {
        method: words.next().unwrap_or_default().to_owned(),
        path: words.next().unwrap_or_default().to_owned(),
        range: header(head, "range").map(str::to_owned),
        repeat: 0,
        headers: head
            .lines()
            .skip(1)
            .filter_map(|line| {
                let (key, value) = line.split_once(':')?;
                Some((key.trim().to_owned(), value.trim().to_owned()))
            })
            .collect(),
    }
}

/// Connections to the server at once, over every proxy of the test binary: moto's
/// listen backlog is small, and resets connections beyond it.
static UPSTREAM_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// Asks the server, over a connection of its own, and reads the whole answer.
async fn forward(
    state: &State,
    request: &str,
    sent: &[u8],
    info: &Request,
) -> Option<(String, Vec<u8>)> {
    let _slot = UPSTREAM_SLOTS.acquire().await.ok()?;
    let mut upstream = TcpStream::connect(state.upstream).await.ok()?;
    upstream
        .write_all(with_connection_close(request).as_bytes())
        .await
        .ok()?;
    upstream.write_all(sent).await.ok()?;
    let head = read_head(&mut upstream).await?;
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let body_len = match header(&head, "content-length") {
        _ if info.method == "HEAD" || status == 204 || status == 304 => Some(0),
        Some(len) => Some(len.parse::<usize>().ok()?),
        None => None,
    };
    let mut body = Vec::new();
    match body_len {
        Some(len) => {
            body.resize(len, 0);
            upstream.read_exact(&mut body).await.ok()?;
        }
        None => {
            upstream.read_to_end(&mut body).await.ok()?;
        }
    }
    Some((head, body))
}

/// The same request asking for pages of at most `keys` entries (`max-keys`; the test
/// server checks no signature, so the query may change after signing).
fn with_max_keys(head: &str, keys: u32) -> String {
    let (line, rest) = head.split_once("\r\n").unwrap_or((head, ""));
    let mut words: Vec<String> = line.split(' ').map(str::to_owned).collect();
    if let Some(target) = words.get_mut(1) {
        let (path, query) = target.split_once('?').unwrap_or((target.as_str(), ""));
        let mut pairs: Vec<&str> = query
            .split('&')
            .filter(|pair| !pair.is_empty() && !pair.starts_with("max-keys="))
            .collect();
        let max_keys = format!("max-keys={keys}");
        pairs.push(&max_keys);
        *target = format!("{path}?{}", pairs.join("&"));
    }
    format!("{}\r\n{rest}", words.join(" "))
}

/// The same head with `Connection: close` in place of any connection header.
fn with_connection_close(head: &str) -> String {
    let mut lines: Vec<&str> = head
        .trim_end_matches("\r\n")
        .split("\r\n")
        .filter(|line| {
            !line
                .split_once(':')
                .is_some_and(|(key, _)| key.trim().eq_ignore_ascii_case("connection"))
        })
        .collect();
    lines.push("Connection: close");
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

/// A listing's XML with every `<Size>` element saying `size`.
fn with_listed_sizes(body: &[u8], size: u64) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_ref();
    while let Some(open) = rest.find("<Size>") {
        let value = open + "<Size>".len();
        let Some(close) = rest[value..].find("</Size>") else {
            break;
        };
        out.push_str(&rest[..value]);
        out.push_str(&size.to_string());
        rest = &rest[value + close..];
    }
    out.push_str(rest);
    out.into_bytes()
}

/// The same head announcing a body of `len` bytes.
fn with_content_length(head: &str, len: u64) -> String {
    let lines: Vec<String> = head
        .trim_end_matches("\r\n")
        .split("\r\n")
        .map(|line| match line.split_once(':') {
            Some((key, _)) if key.trim().eq_ignore_ascii_case("content-length") => {
                format!("Content-Length: {len}")
            }
            _ => line.to_owned(),
        })
        .collect();
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

/// A 206 head rewritten to announce only the first `len` bytes of its range.
fn shorten_partial(head: &str, len: u64) -> String {
    let lines: Vec<String> = head
        .trim_end_matches("\r\n")
        .split("\r\n")
        .map(|line| match line.split_once(':') {
            Some((key, _)) if key.trim().eq_ignore_ascii_case("content-length") => {
                format!("Content-Length: {len}")
            }
            Some((key, value)) if key.trim().eq_ignore_ascii_case("content-range") => {
                let value = value.trim().trim_start_matches("bytes ");
                let (range, total) = value.split_once('/').unwrap_or((value, "*"));
                let start: u64 = range
                    .split_once('-')
                    .and_then(|(s, _)| s.parse().ok())
                    .unwrap_or(0);
                let end = start + len.max(1) - 1;
                format!("Content-Range: bytes {start}-{end}/{total}")
            }
            _ => line.to_owned(),
        })
        .collect();
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

/// Counts of read outcomes under a fault.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub ok: u64,
    pub eio: u64,
    pub wrong: u64,
    /// Reads that took longer than the bound under test.
    pub late: u64,
    /// The longest read, in milliseconds.
    pub slowest_ms: u64,
}

impl Outcomes {
    pub fn add(&mut self, other: Outcomes) {
        self.ok += other.ok;
        self.eio += other.eio;
        self.wrong += other.wrong;
        self.late += other.late;
        self.slowest_ms = self.slowest_ms.max(other.slowest_ms);
    }
}

impl std::fmt::Display for Outcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok {} / EIO {} / wrong {} / late {} (slowest {} ms)",
            self.ok, self.eio, self.wrong, self.late, self.slowest_ms
        )
    }
}
