//! Open handles of hint files: each decodes its own byte stream into plan steps and
//! hands them to the prefetcher; closing the handle drops its plan.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use scdl_format::hint::{HintDecoder, HintLine};

use crate::catalog::FlatDataset;
use crate::error::{FsError, FsResult};
use crate::prefetch::Prefetcher;

struct Handle {
    decoder: HintDecoder,
    dataset: Arc<FlatDataset>,
}

pub(super) struct HintHandles {
    prefetcher: Arc<Prefetcher>,
    handles: Mutex<HashMap<u64, Handle>>,
}

impl HintHandles {
    pub(super) fn new(prefetcher: Arc<Prefetcher>) -> HintHandles {
        HintHandles {
            prefetcher,
            handles: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn open(&self, dataset: Arc<FlatDataset>) -> u64 {
        let id = self.prefetcher.open_handle();
        self.handles.lock().insert(
            id,
            Handle {
                decoder: HintDecoder::default(),
                dataset,
            },
        );
        id
    }

    /// Applies one write. A refused write changes nothing: neither the handle's
    /// decoder nor its plan. Handles of other files are read-only.
    pub(super) fn write(&self, id: u64, data: &[u8]) -> FsResult<()> {
        let mut handles = self.handles.lock();
        let handle = handles.get_mut(&id).ok_or(FsError::ReadOnly)?;
        let dataset = handle.dataset.clone();
        let mut trial = handle.decoder.clone();
        let lines: Vec<HintLine> = trial
            .feed(data)
            .map_err(|e| self.refuse(&dataset, e.to_string()))?;
        self.prefetcher
            .apply(id, &dataset, &lines)
            .map_err(|reason| self.refuse(&dataset, reason))?;
        handle.decoder = trial;
        Ok(())
    }

    fn refuse(&self, dataset: &FlatDataset, reason: String) -> FsError {
        tracing::warn!(dataset = %dataset.prefix, %reason, "hint write refused with EINVAL");
        FsError::InvalidHint(reason)
    }

    /// Closes handle `id` if it is a hint handle, dropping its plan.
    pub(super) fn close(&self, id: u64) {
        if self.handles.lock().remove(&id).is_some() {
            self.prefetcher.drop_plan(id);
        }
    }
}
