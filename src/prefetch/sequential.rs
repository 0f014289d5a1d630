//! Read-ahead for readers that give no hint: per open handle, a window that doubles
//! while reads are sequential and collapses on a jump, as kernels do for local files.

/// The read-ahead state of one open handle.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SequentialWindow {
    next_offset: u64,
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
        if offset == self.next_offset && len > 0 {
            self.window = (self.window * 2).clamp(min_window, max_window);
        } else {
            self.window = 0;
        }
        self.next_offset = end;
        end..end + self.window
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
            w.observe(5000, 10, 100, 1000),
            5010..5010,
            "a jump stops read-ahead"
        );
        assert_eq!(
            w.observe(5010, 10, 100, 1000),
            5020..5120,
            "and it starts again small"
        );
    }
}
