//! Read-ahead for readers that give no hint: per open handle, a window that doubles
//! while reads are sequential and collapses on a jump, as kernels do for local files.
//! "Sequential" tolerates reordering: the kernel's own asynchronous read-ahead sends
//! neighbouring requests that may arrive out of order.

/// How far from the furthest byte read so far a read still counts as sequential.
const REORDER_SLACK: u64 = 1 << 20;

/// The read-ahead state of one open handle.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SequentialWindow {
    furthest: u64,
    window: u64,
}

impl SequentialWindow {
    /// Records a read of `len` bytes at `offset`; returns the byte range to read ahead
    /// (empty after a jump).
    pub fn observe(
        &mut self,
        offset: u64,
        len: u64,
        min_window: u64,
        max_window: u64,
    ) -> std::ops::Range<u64> {
        let end = offset + len;
        let sequential = len > 0
            && offset <= self.furthest + REORDER_SLACK
            && end + REORDER_SLACK >= self.furthest
            && (self.furthest > 0 || offset == 0);
        if sequential {
            self.window = (self.window * 2).clamp(min_window, max_window);
            self.furthest = self.furthest.max(end);
        } else {
            self.window = 0;
            self.furthest = end;
        }
        self.furthest..self.furthest + self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_while_sequential_and_collapses_on_a_jump() {
        let mut w = SequentialWindow::default();
        assert_eq!(w.observe(0, 10, 100, 1000), 10..110);
        assert_eq!(w.observe(10, 10, 100, 1000), 20..220);
        assert_eq!(w.observe(20, 10, 100, 1000), 30..430);
        assert_eq!(w.observe(30, 10, 100, 1000), 40..840);
        assert_eq!(w.observe(40, 10, 100, 1000), 50..1050, "capped");
        assert_eq!(
            w.observe(50 << 20, 10, 100, 1000),
            (50 << 20) + 10..(50 << 20) + 10,
            "a jump stops read-ahead"
        );
        assert_eq!(
            w.observe((50 << 20) + 10, 10, 100, 1000),
            (50 << 20) + 20..(50 << 20) + 120,
            "and it starts again small"
        );
    }

    #[test]
    fn reordered_neighbouring_reads_still_count_as_sequential() {
        let mut w = SequentialWindow::default();
        w.observe(0, 4096, 100, 1 << 20);
        let ahead = w.observe(256 << 10, 128 << 10, 100, 1 << 20);
        assert!(!ahead.is_empty());
        let ahead = w.observe(128 << 10, 128 << 10, 100, 1 << 20);
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
        assert!(w.observe(10 << 20, 4096, 100, 1000).is_empty());
    }
}
