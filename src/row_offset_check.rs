//! The check of each flat chunk's row offsets, once per mount.
//!
//! A chunk's `row_ptr.npy` is shifted into the flat `row_ptr.npy` and bounds the values
//! the prefetcher locates, so wrong numbers there would be served or followed. Before
//! either, its bytes are checked against the format's rules
//! ([`FlatDataset::verify_row_ptr`]: from 0, never decreasing, ending at the chunk's
//! value count). The verdict is a domain fact kept with the dataset
//! ([`RowOffsetsVerdict`]); the read path turns a rejection into an error for its
//! reader, and the prefetcher only asks whether a chunk has passed.
//!
//! This module sits below both of them: it asks the fetcher for the array's parts and
//! rings the [`PlannerWake`] when a verdict is new.
//!
//! A check holds its chunk's row offsets whole in memory, up to
//! [`MAX_CHUNK_ROW_OFFSET_BYTES`] each (sizes from a listing), so all checks together
//! hold at most [`CHECK_MEMORY`]: a check takes its bytes from that budget once its
//! parts have arrived, for the copy and the check alone, so it waits only for other
//! checks' CPU work, never for their downloads.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::try_join_all;
use scdl_format::ArrayKind;
use tokio::sync::Semaphore;

use crate::catalog::chunked::{RowOffsetsVerdict, MAX_CHUNK_ROW_OFFSET_BYTES};
use crate::catalog::FlatDataset;
use crate::error::{FsError, FsResult};
use crate::fetch::{Fetcher, PartBytes};
use crate::planner_wake::PlannerWake;

/// How often a check gathers a chunk's row offsets when cached parts keep failing
/// (each failure drops the part, so the next attempt downloads it), as a read does.
const CACHED_PART_ATTEMPTS: u32 = 3;

/// The most bytes of row offsets all checks hold at once: one largest chunk's, so that
/// any chunk discovery accepted can be checked.
pub const CHECK_MEMORY: u64 = MAX_CHUNK_ROW_OFFSET_BYTES;

/// Bytes held by checks, within a total.
struct CheckMemory {
    bytes: Semaphore,
    total: u64,
}

impl CheckMemory {
    fn new(total: u64) -> CheckMemory {
        CheckMemory {
            bytes: Semaphore::new(total as usize),
            total,
        }
    }

    /// Room for `bytes`, once the checks holding it have given it back. Discovery
    /// bounds a chunk's row offsets by the total; a larger array would take it all.
    async fn hold(&self, bytes: u64) -> tokio::sync::SemaphorePermit<'_> {
        let permits = bytes.min(self.total) as u32;
        self.bytes
            .acquire_many(permits)
            .await
            .expect("the check memory is never closed")
    }
}

/// Runs the checks: each chunk's once per mount, whoever asks first.
pub struct RowOffsetCheck {
    fetcher: Arc<Fetcher>,
    planner: PlannerWake,
    memory: CheckMemory,
    /// Checks are started from FUSE threads too, outside the runtime.
    runtime: tokio::runtime::Handle,
}

impl RowOffsetCheck {
    /// Must be called within the runtime that will run the checks.
    pub fn new(fetcher: Arc<Fetcher>, planner: PlannerWake) -> Arc<RowOffsetCheck> {
        Arc::new(RowOffsetCheck {
            fetcher,
            planner,
            memory: CheckMemory::new(CHECK_MEMORY),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// The verdict on chunk `chunk`, if one was reached.
    pub fn verdict(dataset: &FlatDataset, chunk: usize) -> Option<&RowOffsetsVerdict> {
        dataset.row_ptr_check(chunk).get()
    }

    /// Whether chunk `chunk` has passed its check.
    pub fn passed(dataset: &FlatDataset, chunk: usize) -> bool {
        matches!(Self::verdict(dataset, chunk), Some(Ok(())))
    }

    /// The verdict on chunk `chunk`, reached now (downloading its row offsets) if no
    /// earlier caller has. A failed download is not a verdict on the data: it is
    /// returned as the error, and a later call tries again.
    pub async fn check<'a>(
        &self,
        dataset: &'a Arc<FlatDataset>,
        chunk: usize,
    ) -> FsResult<&'a RowOffsetsVerdict> {
        let decided_here = AtomicBool::new(false);
        let verdict = dataset
            .row_ptr_check(chunk)
            .get_or_try_init(|| async {
                let (_held, bytes) = self.whole_row_ptr(dataset, chunk).await?;
                let verdict = dataset.verify_row_ptr(chunk, &bytes);
                if let Err(reason) = &verdict {
                    tracing::error!(%reason, "corrupt row offsets: reads of this chunk fail with EIO");
                }
                decided_here.store(true, Ordering::Relaxed);
                FsResult::Ok(verdict)
            })
            .await?;
        if decided_here.into_inner() {
            self.planner.ring();
        }
        Ok(verdict)
    }

    /// Starts chunk `chunk`'s check in the background once its row offsets are cached
    /// (so the check costs no download), for a caller that must not wait: the verdict
    /// rings the prefetcher. At most once per chunk.
    pub fn start_when_local(self: &Arc<Self>, dataset: &Arc<FlatDataset>, chunk: usize) {
        let row_ptr = dataset.array(chunk, ArrayKind::RowPtr);
        if self.fetcher.is_cached(row_ptr) && dataset.start_row_ptr_check(chunk) {
            let (check, dataset) = (self.clone(), dataset.clone());
            self.runtime.spawn(async move {
                // A failed download leaves the chunk unchecked; a reader's read retries.
                let _ = check.check(&dataset, chunk).await;
            });
        }
    }

    /// All bytes of chunk `chunk`'s `row_ptr.npy`, held within the check memory. A
    /// cached part that fails its checksum or its read is dropped: fetched again.
    async fn whole_row_ptr(
        &self,
        dataset: &FlatDataset,
        chunk: usize,
    ) -> FsResult<(tokio::sync::SemaphorePermit<'_>, Vec<u8>)> {
        let object = dataset.array(chunk, ArrayKind::RowPtr);
        let mut attempt = 1;
        loop {
            let gathered = async {
                let parts = self.row_ptr_parts(dataset, chunk).await?;
                let held = self.memory.hold(object.size).await;
                let mut bytes = vec![0u8; object.size as usize];
                for (range, part) in parts {
                    part.copy_to(&mut bytes[range.start as usize..range.end as usize], 0)?;
                }
                FsResult::Ok((held, bytes))
            }
            .await;
            match gathered {
                Err(FsError::CacheCorrupt(_)) if attempt < CACHED_PART_ATTEMPTS => attempt += 1,
                result => return result,
            }
        }
    }

    /// The parts of chunk `chunk`'s `row_ptr.npy`, each with its bytes' place in the
    /// array, each noted as demanded.
    async fn row_ptr_parts(
        &self,
        dataset: &FlatDataset,
        chunk: usize,
    ) -> FsResult<Vec<(Range<u64>, PartBytes)>> {
        let object = dataset.array(chunk, ArrayKind::RowPtr);
        try_join_all(self.fetcher.parts_of(&(0..object.size)).map(|index| {
            let range = self.fetcher.part_range(object, index);
            self.fetcher.note_demand(Fetcher::key(object, index));
            async move {
                let part = self
                    .fetcher
                    .bytes(object, index, 0..range.end - range.start)
                    .await?;
                FsResult::Ok((range, part))
            }
        }))
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn checks_hold_at_most_the_check_memory_together() {
        let memory = Arc::new(CheckMemory::new(100));
        let first = memory.hold(60).await;
        let waiting = tokio::spawn({
            let memory = memory.clone();
            async move {
                let _second = memory.hold(60).await;
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "120 bytes held of a total of 100");
        drop(first);
        waiting.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_array_larger_than_the_total_is_checked_alone() {
        let memory = CheckMemory::new(100);
        let alone = tokio::time::timeout(Duration::from_secs(1), memory.hold(1000)).await;
        assert!(alone.is_ok(), "a check larger than the total never ran");
        assert_eq!(memory.bytes.available_permits(), 0);
    }
}
