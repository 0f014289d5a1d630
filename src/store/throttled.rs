//! A test double that behaves like a distant link: every response waits a fixed latency,
//! and all bodies together share one bandwidth cap, so concurrent downloads slow each
//! other down as they would on a real network. A body streams in pieces, each released
//! when the link has carried it, so a reader sees the first bytes of a part long before
//! its last, as over a real connection.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use object_store::{GetResult, GetResultPayload, Result};
use parking_lot::Mutex;

use super::wrapper::{buffer_body, GetRequest, StoreHook};

/// The size of the pieces a body is released in: several per part of the tests' 64 KiB
/// parts, so a part arrives partway as it would over the network.
const PIECE: usize = 16 << 10;

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
    /// the link starts carrying this body.
    fn book(&self, len: usize) -> Instant {
        let mut free_at = self.link_free_at.lock();
        let start = (*free_at).max(Instant::now());
        *free_at = start + self.transfer_time(len);
        start
    }

    fn transfer_time(&self, len: usize) -> Duration {
        Duration::from_secs_f64(len as f64 / self.bytes_per_second)
    }
}

#[async_trait]
impl StoreHook for Throttle {
    async fn get(&self, request: GetRequest<'_>) -> Result<GetResult> {
        tokio::time::sleep(self.latency).await;
        let (body, head) = buffer_body(request.send().await?).await?;
        let start = self.book(body.len());
        // Each piece is due when the link has carried it and everything before it.
        let pieces: Vec<(Instant, Bytes)> = (0..body.len())
            .step_by(PIECE)
            .map(|offset| {
                let end = (offset + PIECE).min(body.len());
                (start + self.transfer_time(end), body.slice(offset..end))
            })
            .collect();
        let stream = futures::stream::iter(pieces).then(|(due, piece)| async move {
            tokio::time::sleep_until(due.into()).await;
            Ok(piece)
        });
        Ok(GetResult {
            payload: GetResultPayload::Stream(Box::pin(stream)),
            ..head
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{GetResultPayload, ObjectStoreExt};

    use super::*;
    use crate::store::wrapper::HookedStore;

    #[tokio::test]
    async fn a_body_arrives_in_pieces_at_the_links_rate() {
        let inner = Arc::new(InMemory::new());
        let path = Path::from("object");
        let body = vec![7u8; 256 << 10];
        inner.put(&path, body.clone().into()).await.unwrap();
        // 256 KiB at 1 MB/s: 262 ms on the link, the first piece after 16 ms.
        let link = HookedStore::new(inner, Throttle::new(Duration::ZERO, 1_000_000));
        let asked = Instant::now();
        let GetResultPayload::Stream(mut stream) = link.get(&path).await.unwrap().payload else {
            panic!("a stream");
        };
        let mut arrivals = Vec::new();
        let mut received = Vec::new();
        while let Some(piece) = stream.next().await {
            arrivals.push(asked.elapsed());
            received.extend_from_slice(&piece.unwrap());
        }
        assert!(received == body, "the bytes changed on the way");
        assert_eq!(arrivals.len(), body.len() / PIECE, "{arrivals:?}");
        let whole = Duration::from_millis(262);
        assert!(
            arrivals[0] < whole / 2,
            "the first piece waited for the whole body: {arrivals:?}"
        );
        assert!(
            *arrivals.last().unwrap() >= whole - Duration::from_millis(5),
            "faster than the link: {arrivals:?}"
        );
    }
}
