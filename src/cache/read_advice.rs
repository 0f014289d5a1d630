//! The read-ahead advice a read of a part gives the kernel: a part read at all is soon
//! read through (a chunk window's rows spread over all of it), so its first read asks
//! the kernel to bring the whole part from disk at once instead of a read-ahead window
//! per FUSE read ([`ADVISE_AGAIN_AFTER`]). A mount whose read-around reads the windows
//! around reads through the part files in order leaves it to the disk's own read-ahead
//! ([`ReadAdvice::leave_to_read_around`]).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::books::ResidentFile;

/// How long after advising the kernel to read a whole part the next read of it advises
/// again, in case the page cache dropped it. Cheap when the pages are resident. Asked
/// once the read has its own bytes: asked before, the read's pages queued behind the
/// whole part's, and a warm windows epoch with the page cache dropped took 7% longer
/// (1.44–1.49 s against 1.34–1.37 s on a 1.46 GB dataset). Not asked where the
/// read-around reads ahead ([`ReadAdvice::leave_to_read_around`]).
const ADVISE_AGAIN_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(super) struct ReadAdvice {
    /// The clock of [`ResidentFile::advised_at_ms`].
    pub(super) opened: Instant,
    /// Whether a read advises the kernel to read its whole part.
    whole_parts: AtomicBool,
}

impl ReadAdvice {
    pub(super) fn new() -> ReadAdvice {
        ReadAdvice {
            opened: Instant::now(),
            whole_parts: AtomicBool::new(true),
        }
    }

    /// Stops advising the kernel to read a whole part at its first read, for a mount
    /// whose read-around reads the windows around reads (1 MiB or more) through the
    /// part files in order, so that the cache disk's own read-ahead brings the parts in
    /// as they are read. There the advice cost CPU and bought no speed: without it a
    /// disk-cache warm windows epoch took 0.66 daemon CPU s per GB instead of 0.77, and
    /// read no slower beside local disk (docs/architecture.md, where the CPU goes per
    /// byte).
    pub(super) fn leave_to_read_around(&self) {
        self.whole_parts.store(false, Ordering::Relaxed);
    }

    /// After a read of `file` through `handle` got its bytes: asks the kernel to bring
    /// the whole part into the page cache, at most once per [`ADVISE_AGAIN_AFTER`].
    /// Advice only: a failure changes nothing but speed.
    pub(super) fn after_read(&self, handle: &File, file: &ResidentFile) {
        if !self.whole_parts.load(Ordering::Relaxed) {
            return;
        }
        let now = self.opened.elapsed().as_millis() as u64 + 1;
        let last = file.advised_at_ms.load(Ordering::Relaxed);
        // Another reader may have advised on a later reading of the clock than ours.
        if last != 0 && now.saturating_sub(last) < ADVISE_AGAIN_AFTER.as_millis() as u64 {
            return;
        }
        if file
            .advised_at_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let len = std::num::NonZeroU64::new(file.data_len);
            let _ =
                rustix::fs::fadvise(handle, file.data_offset, len, rustix::fs::Advice::WillNeed);
        }
    }
}
