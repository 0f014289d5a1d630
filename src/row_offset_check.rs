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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::try_join_all;
use scdl_format::ArrayKind;

use crate::catalog::dataset::RowOffsetsVerdict;
use crate::catalog::FlatDataset;
use crate::error::{FsError, FsResult};
use crate::fetch::Fetcher;
use crate::planner_wake::PlannerWake;

/// How often a check gathers a chunk's row offsets when cached parts keep failing
/// (each failure drops the part, so the next attempt downloads it), as a read does.
const CACHED_PART_ATTEMPTS: u32 = 3;

/// Runs the checks: each chunk's once per mount, whoever asks first.
pub struct RowOffsetCheck {
    fetcher: Arc<Fetcher>,
    planner: PlannerWake,
    /// Checks are started from FUSE threads too, outside the runtime.
    runtime: tokio::runtime::Handle,
}

impl RowOffsetCheck {
    /// Must be called within the runtime that will run the checks.
    pub fn new(fetcher: Arc<Fetcher>, planner: PlannerWake) -> Arc<RowOffsetCheck> {
        Arc::new(RowOffsetCheck {
            fetcher,
            planner,
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
                let bytes = self.whole_row_ptr(dataset, chunk).await?;
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

    /// All bytes of chunk `chunk`'s `row_ptr.npy`, each part noted as demanded. A
    /// cached part that fails its checksum or its read is dropped: fetched again.
    async fn whole_row_ptr(&self, dataset: &FlatDataset, chunk: usize) -> FsResult<Vec<u8>> {
        let mut attempt = 1;
        loop {
            match self.whole_row_ptr_once(dataset, chunk).await {
                Err(FsError::CacheCorrupt(_)) if attempt < CACHED_PART_ATTEMPTS => attempt += 1,
                result => return result,
            }
        }
    }

    async fn whole_row_ptr_once(&self, dataset: &FlatDataset, chunk: usize) -> FsResult<Vec<u8>> {
        let object = dataset.array(chunk, ArrayKind::RowPtr);
        let parts = try_join_all(self.fetcher.parts_of(&(0..object.size)).map(|index| {
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
        .await?;
        let mut bytes = vec![0u8; object.size as usize];
        for (range, part) in parts {
            part.copy_to(&mut bytes[range.start as usize..range.end as usize], 0)?;
        }
        Ok(bytes)
    }
}
