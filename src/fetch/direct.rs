//! Direct and stray reads: a reader's own bytes asked for alone, when its part's
//! download is queued or far short of them, when nobody downloads the part and the
//! cache could take it only by evicting what the plans need sooner, or when the part
//! file the download writes failed to give back what was written.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, TryStreamExt};
use object_store::ObjectStore;

use super::arriving::Arriving;
use super::memory::{MemoryBudget, MemoryReservation};
use super::{DIRECT_READ_LEAD, DIRECT_READ_MAX};
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::{pinned_get, ObjectInfo};

/// Whether bytes `within` of a part of `part_len` bytes are few enough for a request of
/// their own: at most [`DIRECT_READ_MAX`], and less than half the part.
fn few_enough_to_ask_alone(within: &Range<u64>, part_len: u64) -> bool {
    let len = within.end - within.start;
    len <= DIRECT_READ_MAX && 2 * len < part_len
}

/// Whether a reader of `within` should ask for its own bytes beside the download:
/// they are few, less than half their part (more would repeat the download), the
/// download waits for a slot or its body is far short of them, and no reader asked
/// beside this download before. One direct read per download gets the first
/// reader its bytes at once; more would let a reader that reads a part in small
/// pieces faster than slots free up fetch all of it again beside its download.
pub(super) fn worth_a_direct_read(arriving: &Arriving, within: &Range<u64>, part_len: u64) -> bool {
    few_enough_to_ask_alone(within, part_len)
        && (!arriving.is_sent() || within.end > arriving.received() + DIRECT_READ_LEAD)
        && arriving.claim_direct_read()
}

/// Whether a reader's bytes of a part nobody is downloading (`downloading`: whether
/// anyone is) are few enough to ask for alone rather than with their part.
pub(super) fn is_stray(within: &Range<u64>, part_len: u64, downloading: bool) -> bool {
    few_enough_to_ask_alone(within, part_len) && !downloading
}

/// Readers' requests for their own bytes ([`DIRECT_READ_LEAD`]), at most one per
/// download slot (none when all are taken), and every ranged GET of bytes the fetcher
/// holds in memory: the store, the deadline and the counters they take.
pub(super) struct DirectReads {
    slots: tokio::sync::Semaphore,
    store: Arc<dyn ObjectStore>,
    read_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl DirectReads {
    pub(super) fn new(
        slots: usize,
        store: Arc<dyn ObjectStore>,
        read_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> DirectReads {
        DirectReads {
            slots: tokio::sync::Semaphore::new(slots),
            store,
            read_timeout,
            metrics,
        }
    }

    /// Bytes `range` of the object in one request of their own, if a direct-read slot
    /// and the memory (of `budget`) are free now (`None` otherwise).
    pub(super) async fn direct_read(
        &self,
        budget: &MemoryBudget,
        object: &ObjectInfo,
        range: Range<u64>,
    ) -> Option<FsResult<Bytes>> {
        let _slot = self.slots.try_acquire().ok()?;
        let memory = budget.try_reserve(range.end - range.start)?;
        // Counted as sent: a reader answered by the download first drops this request.
        Metrics::add(&self.metrics.direct_reads, 1);
        Some(self.get_range(object, range, memory).await)
    }

    /// Bytes `range` of the object in one request of their own, waiting for a
    /// direct-read slot and the memory of `budget` (within the caller's deadline): for a reader
    /// whose bytes nothing else can give.
    pub(super) async fn read_from_store(
        &self,
        budget: &MemoryBudget,
        object: &ObjectInfo,
        range: Range<u64>,
    ) -> FsResult<Bytes> {
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the direct-read slots are never closed");
        let memory = budget.reserve(range.end - range.start).await;
        self.get_range(object, range, memory).await
    }

    /// One ranged GET of the pinned object, within `read_timeout`, its bytes held
    /// against `memory`.
    pub(super) async fn get_range(
        &self,
        object: &ObjectInfo,
        range: Range<u64>,
        memory: MemoryReservation,
    ) -> FsResult<Bytes> {
        let len = range.end - range.start;
        let read = tokio::time::timeout(self.read_timeout, async {
            let result = pinned_get(self.store.as_ref(), object, Some(range)).await?;
            gather_exactly(object, result.into_stream(), len).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(FsError::TimedOut {
                key: object.key.to_string(),
                after: self.read_timeout,
            })
        });
        match read {
            Ok(bytes) => {
                Metrics::add(&self.metrics.bytes_fetched, len);
                Ok(memory.hold(bytes))
            }
            Err(error) => {
                tracing::debug!(object = %object.key, %error, "a direct read failed");
                Err(error)
            }
        }
    }
}

/// The body of an answer of `len` bytes, copied into a buffer of exactly that length,
/// or an error if it is longer or shorter. A body that arrives as one piece is a slice
/// of the HTTP connection's read buffer, which grows to hundreds of KiB on part
/// downloads: held as it came, a few KiB of a planned range would keep all of it.
async fn gather_exactly(
    object: &ObjectInfo,
    mut body: impl Stream<Item = object_store::Result<Bytes>> + Unpin,
    len: u64,
) -> FsResult<Bytes> {
    let mut gathered = BytesMut::with_capacity(len as usize);
    let mut received = 0u64;
    while let Some(piece) = body
        .try_next()
        .await
        .map_err(|e| FsError::store(object.key.as_ref(), &e))?
    {
        received += piece.len() as u64;
        if received > len {
            break;
        }
        gathered.extend_from_slice(&piece);
    }
    if received != len {
        return Err(FsError::ShortRead {
            key: object.key.to_string(),
            expected: len,
            got: received,
        });
    }
    Ok(gathered.freeze())
}
