//! Whether the cache directory can be written: a write that fails (a full disk, a
//! removed or read-only directory) turns caching off with one log line and a reason
//! for `status`; downloads are then served from memory, and one insert tries the disk
//! again every [`DISK_RETRY_AFTER`]. The first write that works turns caching on again.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long caching stays off after a failed write before one insert tries again.
pub const DISK_RETRY_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct DiskHealth {
    state: Mutex<DiskState>,
    /// [`DISK_RETRY_AFTER`], shorter in tests.
    pub(super) retry_after: Duration,
    /// The parts directory, for messages only.
    shown: PathBuf,
}

/// Since when the disk cannot be written, and why.
#[derive(Debug, Default)]
struct DiskState {
    unusable_since: Option<Instant>,
    reason: Option<String>,
}

impl DiskHealth {
    pub(super) fn new(shown: PathBuf) -> DiskHealth {
        DiskHealth {
            state: Mutex::new(DiskState::default()),
            retry_after: DISK_RETRY_AFTER,
            shown,
        }
    }

    /// Whether an insert may write: always while the disk works; after a failure,
    /// one insert per [`DiskHealth::retry_after`].
    pub(super) fn usable(&self) -> bool {
        let mut state = self.state.lock();
        match state.unusable_since {
            None => true,
            Some(since) if since.elapsed() >= self.retry_after => {
                state.unusable_since = Some(Instant::now());
                true
            }
            Some(_) => false,
        }
    }

    /// A write failed: caching is off until the next try works.
    pub(super) fn failed(&self, error: &io::Error) {
        let mut state = self.state.lock();
        if state.reason.is_none() {
            tracing::error!(dir = %self.shown.display(), %error, retry_seconds = self.retry_after.as_secs(), "the cache directory cannot be written: serving parts from the store without caching them");
        }
        state.unusable_since = Some(Instant::now());
        state.reason = Some(error.to_string());
    }

    /// A write worked: caching is on.
    pub(super) fn ok(&self) {
        let mut state = self.state.lock();
        if state.reason.take().is_some() {
            tracing::info!(dir = %self.shown.display(), "the cache directory can be written again: caching resumes");
        }
        state.unusable_since = None;
    }

    /// Why the disk cannot be written, while it cannot.
    pub(super) fn unusable(&self) -> Option<String> {
        self.state.lock().reason.clone()
    }
}
