//! How long the network may take: one set of limits that shapes both the object
//! client (object_store's retry layer, the only one: stalls, timeouts, backoff with
//! jitter, which errors are retried) and the fetcher's hard deadline per part.
//!
//! A FUSE read request waits at most [`NetworkBounds::read_timeout`] for the parts it
//! needs, then fails with EIO. The kernel sends a failed read-ahead page again, once,
//! as a request of its own, so a read(2) that fails waits at most twice that: 30 s
//! with the default 15 s. Inside that bound one HTTP attempt gets
//! [`NetworkBounds::request_timeout`], a connection that delivers no byte for
//! [`NetworkBounds::stall_timeout`] (no headers, or a body gone silent) is abandoned,
//! and object_store retries 5xx, 429, timeouts and broken bodies, never 4xx (403, 404,
//! 412, 416 cannot heal), up to [`NetworkBounds::max_attempts`] tries, with backoff
//! (100 ms doubling to at most 2 s, with jitter) and no new attempt once the read
//! timeout has passed.

use std::time::Duration;

use object_store::{BackoffConfig, ClientOptions, RetryConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkBounds {
    /// One HTTP attempt, headers and body.
    pub request_timeout: Duration,
    /// An attempt that receives no byte for this long is abandoned (and retried).
    pub stall_timeout: Duration,
    /// Tries per request, the first included.
    pub max_attempts: u32,
    /// The longest a read waits for a part, and the longest a part's download runs.
    pub read_timeout: Duration,
}

impl Default for NetworkBounds {
    fn default() -> Self {
        NetworkBounds {
            request_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(5),
            max_attempts: 4,
            read_timeout: Duration::from_secs(15),
        }
    }
}

impl NetworkBounds {
    /// object_store's retry policy for these bounds.
    pub fn retry_config(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: self.max_attempts.saturating_sub(1) as usize,
            retry_timeout: self.read_timeout,
        }
    }

    /// The HTTP client's timeouts for these bounds.
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions::new()
            .with_connect_timeout(self.stall_timeout)
            .with_read_timeout(self.stall_timeout)
            .with_timeout(self.request_timeout)
    }
}
