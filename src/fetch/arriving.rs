//! A part's bytes while its download is under way. Readers that need only some of a
//! part are answered as soon as the body has passed their bytes, not when the whole
//! part has arrived: a reader at the start of an 8 MiB part that shares the link with
//! fifteen others waits for a few pieces of its body, not for all of it.
//!
//! The download appends what it receives ([`Arriving::push`]) and finally swaps the
//! buffer for the whole part ([`Arriving::finish`]); readers wait on the count of bytes
//! received ([`Arriving::wait_for`]) and copy their range out ([`Arriving::slice`]).
//! Whether the request is on the wire yet (it holds a download slot) tells a reader
//! whether waiting can pay at all.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::watch;

pub struct Arriving {
    /// How many bytes of the part have been received, from its start.
    received: watch::Sender<u64>,
    body: Mutex<Body>,
    sent: AtomicBool,
}

enum Body {
    Partial(BytesMut),
    Whole(Bytes),
}

impl Default for Arriving {
    fn default() -> Self {
        Arriving {
            received: watch::Sender::new(0),
            body: Mutex::new(Body::Partial(BytesMut::new())),
            sent: AtomicBool::new(false),
        }
    }
}

impl Arriving {
    /// The request holds a download slot: its bytes are coming.
    pub fn mark_sent(&self) {
        self.sent.store(true, Ordering::Relaxed);
    }

    pub fn is_sent(&self) -> bool {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn received(&self) -> u64 {
        *self.received.borrow()
    }

    /// Makes room for a body of `len` bytes, so that appending never moves it.
    pub fn expect(&self, len: usize) {
        if let Body::Partial(buffer) = &mut *self.body.lock() {
            buffer.reserve(len);
        }
    }

    /// Appends the next bytes of the body; returns how many have been received.
    pub fn push(&self, piece: &[u8]) -> u64 {
        let received = match &mut *self.body.lock() {
            Body::Partial(buffer) => {
                buffer.extend_from_slice(piece);
                buffer.len() as u64
            }
            Body::Whole(bytes) => bytes.len() as u64,
        };
        self.received.send_replace(received);
        received
    }

    /// The body received so far as one buffer, handed to `keep` (which may wrap it, e.g.
    /// to count it against a budget); what `keep` returns is what readers slice from now.
    pub fn finish(&self, keep: impl FnOnce(Bytes) -> Bytes) -> Bytes {
        let mut body = self.body.lock();
        let whole = match std::mem::replace(&mut *body, Body::Whole(Bytes::new())) {
            Body::Partial(buffer) => keep(buffer.freeze()),
            Body::Whole(bytes) => bytes,
        };
        *body = Body::Whole(whole.clone());
        whole
    }

    /// Waits until the first `end` bytes have been received. Never returns if the
    /// download fails first: wait for the download's end beside it.
    pub async fn wait_for(&self, end: u64) {
        let mut received = self.received.subscribe();
        // The sender lives as long as `self`, so the wait ends only by its condition.
        let _ = received.wait_for(|&n| n >= end).await;
    }

    /// A copy of bytes `range` of the part, which must have been received.
    pub fn slice(&self, range: Range<u64>) -> Bytes {
        let range = range.start as usize..range.end as usize;
        match &*self.body.lock() {
            Body::Partial(buffer) => Bytes::copy_from_slice(&buffer[range]),
            Body::Whole(bytes) => bytes.slice(range),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_reader_is_answered_once_its_bytes_have_arrived() {
        let arriving = Arc::new(Arriving::default());
        arriving.expect(10);
        let reader = tokio::spawn({
            let arriving = arriving.clone();
            async move {
                arriving.wait_for(6).await;
                arriving.slice(2..6)
            }
        });
        arriving.push(&[0, 1, 2]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!reader.is_finished(), "answered before its bytes arrived");
        assert_eq!(arriving.push(&[3, 4, 5, 6]), 7);
        assert_eq!(&reader.await.unwrap()[..], &[2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn after_the_finish_readers_slice_the_kept_whole() {
        let arriving = Arriving::default();
        arriving.push(&[9, 8, 7]);
        let whole = arriving.finish(|bytes| {
            assert_eq!(&bytes[..], &[9, 8, 7]);
            Bytes::from_static(&[1, 2, 3])
        });
        assert_eq!(&whole[..], &[1, 2, 3]);
        assert_eq!(&arriving.slice(1..3)[..], &[2, 3]);
        arriving.wait_for(3).await;
    }
}
