//! A test double that behaves like a distant link: every response waits a fixed latency,
//! and all bodies together share one bandwidth cap, so concurrent downloads slow each
//! other down as they would on a real network.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ObjectStore, Result};
use parking_lot::Mutex;

use super::wrapper::{buffer_body, with_body, GetHook};

#[derive(Debug)]
pub struct Throttle {
    latency: Duration,
    bytes_per_second: f64,
    /// When the shared link has finished carrying every body admitted so far.
    link_free_at: Mutex<Instant>,
}

impl Throttle {
    pub fn new(latency: Duration, bytes_per_second: u64) -> Throttle {
        Throttle {
            latency,
            bytes_per_second: bytes_per_second.max(1) as f64,
            link_free_at: Mutex::new(Instant::now()),
        }
    }

    /// Books the link for `len` bytes after everything booked before, returning when
    /// this body has fully arrived.
    fn book(&self, len: usize) -> Instant {
        let mut free_at = self.link_free_at.lock();
        let start = (*free_at).max(Instant::now());
        *free_at = start + Duration::from_secs_f64(len as f64 / self.bytes_per_second);
        *free_at
    }
}

#[async_trait]
impl GetHook for Throttle {
    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        tokio::time::sleep(self.latency).await;
        let (body, head) = buffer_body(inner.get_opts(location, options).await?).await?;
        tokio::time::sleep_until(self.book(body.len()).into()).await;
        Ok(with_body(head, body))
    }
}
