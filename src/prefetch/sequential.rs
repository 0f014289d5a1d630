//! Read-ahead for readers that give no hint: per open handle, a window that opens after
//! a run of sequential reads, doubles while they continue and collapses on a jump,
//! as kernels do for local files.
//! "Sequential" tolerates reordering: the kernel's own asynchronous read-ahead sends
//! neighbouring requests that may arrive out of order, as far apart as its window.

/// How far from the furthest byte read so far a read still counts as sequential, at
/// least (more with a larger kernel read-ahead).
const MIN_REORDER_SLACK: u64 = 1 << 20;
/// Read-ahead starts once a run of sequential reads is longer than this many kernel
/// windows. A random reader of a mapped file makes the kernel send a read-around and
/// its own read-ahead next to it: a window of sequential-looking bytes per random
/// access past the jump, which must not start read-ahead.
const WINDOWS_TO_READ_AHEAD: u64 = 2;

/// The read-ahead state of one open handle.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SequentialWindow {
    furthest: u64,
    window: u64,
    /// Where the current run of sequential reads starts (after the read that jumped).
    run_start: u64,
    jumped: bool,
}

impl SequentialWindow {
    /// Whether the last read jumped: it did not follow the handle's earlier reads.
    pub fn last_read_jumped(&self) -> bool {
        self.jumped
    }

    /// Records a read of `len` bytes at `offset`; returns the byte range to read ahead
    /// (empty after a jump). `kernel_read_ahead`: the kernel's window, within which its
    /// requests may come reordered.
    pub fn observe(
        &mut self,
        offset: u64,
        len: u64,
        min_window: u64,
        max_window: u64,
        kernel_read_ahead: u64,
    ) -> std::ops::Range<u64> {
        let end = offset + len;
        let slack = MIN_REORDER_SLACK.max(kernel_read_ahead);
        let sequential = len > 0
            && offset <= self.furthest + slack
            && end + slack >= self.furthest
            && (self.furthest > 0 || offset == 0);
        self.jumped = !sequential;
        if sequential {
            self.furthest = self.furthest.max(end);
            if self.furthest - self.run_start > WINDOWS_TO_READ_AHEAD * kernel_read_ahead {
                self.window = (self.window * 2).clamp(min_window, max_window);
            }
        } else {
            self.window = 0;
            self.run_start = end;
            self.furthest = end;
        }
        self.furthest..self.furthest + self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's default read-ahead.
    const KERNEL: u64 = 128 << 10;

    /// A kernel window for reads of `len` such that three sequential reads read
    /// nothing ahead and the fourth does.
    fn kernel_for(len: u64) -> u64 {
        3 * len / WINDOWS_TO_READ_AHEAD
    }

    /// Feeds three sequential reads of `len` from `start`, which read nothing ahead
    /// yet (with the window of [`kernel_for`]); returns where they end.
    fn warm_up(w: &mut SequentialWindow, start: u64, len: u64) -> u64 {
        for k in 0..3 {
            assert!(
                w.observe(start + k * len, len, 100, 1000, kernel_for(len))
                    .is_empty(),
                "not yet a run"
            );
        }
        start + 3 * len
    }

    #[test]
    fn grows_while_sequential_and_collapses_on_a_jump() {
        let mut w = SequentialWindow::default();
        let at = warm_up(&mut w, 0, 10);
        // Each read in sequence doubles the window ahead of it, up to the 1000-byte cap.
        for (step, ahead) in [(0, 100), (10, 200), (20, 400), (30, 800), (40, 1000)] {
            let read_end = at + step + 10;
            assert_eq!(
                w.observe(at + step, 10, 100, 1000, kernel_for(10)),
                read_end..read_end + ahead,
                "read at {step}"
            );
        }
        let far = 50 << 20;
        assert!(
            w.observe(far, 10, 100, 1000, kernel_for(10)).is_empty(),
            "a jump stops read-ahead"
        );
        let at = warm_up(&mut w, far + 10, 10);
        assert_eq!(
            w.observe(at, 10, 100, 1000, kernel_for(10)),
            at + 10..at + 110,
            "and starts again small"
        );
    }

    #[test]
    fn random_access_with_kernel_read_around_never_reads_ahead() {
        let mut w = SequentialWindow::default();
        let mut x = 7u64;
        for _ in 0..100 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let offset = ((x >> 20) % (1 << 34)) & !0xfff;
            // The read-around of a fault, then the kernel's read-ahead right after it.
            assert!(w
                .observe(offset, 128 << 10, 100, 1 << 20, KERNEL)
                .is_empty());
            assert!(w
                .observe(offset + (128 << 10), 128 << 10, 100, 1 << 20, KERNEL)
                .is_empty());
        }
    }

    #[test]
    fn reordered_neighbouring_reads_still_count_as_sequential() {
        let mut w = SequentialWindow::default();
        warm_up(&mut w, 0, 4096);
        let ahead = w.observe(256 << 10, 128 << 10, 100, 1 << 20, KERNEL);
        assert!(!ahead.is_empty(), "a read a little past the furthest one");
        let ahead = w.observe(128 << 10, 128 << 10, 100, 1 << 20, KERNEL);
        assert_eq!(
            ahead.start,
            384 << 10,
            "an earlier read does not pull the window back"
        );
        assert!(!ahead.is_empty());
    }

    #[test]
    fn a_first_read_in_the_middle_is_not_sequential() {
        let mut w = SequentialWindow::default();
        assert!(w.observe(10 << 20, 4096, 100, 1000, KERNEL).is_empty());
    }
}
