//! The handle table: every open file's state, under the id the table mints for it.
//!
//! A data handle carries its sequential read-ahead window and the user who opened it,
//! whose reads of it follow that user's plans only; a hint handle carries the
//! decoder of its byte stream, the dataset its plan is for, the user who opened it,
//! whose budget its plan spends (the plan itself lives in the prefetcher's registry
//! under the same id, and goes when the handle closes), and the announcement it reads,
//! once made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use scdl_format::hint::HintDecoder;

use crate::catalog::Dataset;
use crate::prefetch::sequential::SequentialWindow;

/// What one open handle knows.
pub enum HandleState {
    Data {
        window: SequentialWindow,
        uid: u32,
    },
    Hints {
        decoder: HintDecoder,
        dataset: Dataset,
        uid: u32,
        /// What the handle reads: the announcement made at its first read.
        announced: Option<Bytes>,
    },
}

/// Open handles by id. Each handle has its own lock, so handles never wait on each
/// other.
pub struct HandleTable {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Mutex<HandleState>>>>,
}

impl Default for HandleTable {
    fn default() -> Self {
        HandleTable {
            // 0 stays unused: the kernel passes it for reads without an open handle.
            next_id: AtomicU64::new(1),
            open: Mutex::default(),
        }
    }
}

impl HandleTable {
    /// Registers a newly opened handle and returns its id.
    pub fn open(&self, state: HandleState) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open.lock().insert(id, Arc::new(Mutex::new(state)));
        id
    }

    pub fn get(&self, id: u64) -> Option<Arc<Mutex<HandleState>>> {
        self.open.lock().get(&id).cloned()
    }

    /// Forgets handle `id`, returning what it held.
    pub fn close(&self, id: u64) -> Option<Arc<Mutex<HandleState>>> {
        self.open.lock().remove(&id)
    }
}
