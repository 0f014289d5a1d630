//! A pusher's hands: the pages of a range of a file that the kernel was not given, read
//! from local parts and stored into its page cache a slice ([`PUSH_SLICE`]) at a time
//! through one buffer, each slice's pages marked given once stored. The read-around's
//! pushers ([`super::read_around`]) and the planned pages' thread
//! ([`super::planned_pages`]) each own one; they differ in which ranges they offer and
//! what they do around the fill, not in the fill.

use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::page_cache::{pages_of, slices, Given, PageCache, PUSH_SLICE};
use crate::catalog::tree::FileNode;
use crate::metrics::Metrics;
use crate::read::ReadPath;
use crate::view::plan_read;

pub(super) struct PageFiller {
    read_path: Arc<ReadPath>,
    page_cache: Arc<dyn PageCache>,
    given: Arc<Given>,
    page: u64,
    /// One slice's bytes, kept between slices: a buffer of a whole range held megabytes
    /// per pusher.
    buffer: Vec<u8>,
}

impl PageFiller {
    pub(super) fn new(
        read_path: Arc<ReadPath>,
        page_cache: Arc<dyn PageCache>,
        given: Arc<Given>,
        page: u64,
    ) -> PageFiller {
        PageFiller {
            read_path,
            page_cache,
            given,
            page,
            buffer: Vec::with_capacity(PUSH_SLICE as usize),
        }
    }

    /// The runs of bytes within `bytes` of file `ino` whose pages the kernel was not
    /// given, in order.
    pub(super) fn missing(&self, ino: u64, bytes: &Range<u64>) -> Vec<Range<u64>> {
        let pages = self
            .given
            .pages
            .lock()
            .missing(ino, pages_of(bytes, self.page));
        pages
            .into_iter()
            .map(|run| {
                (run.start * self.page).max(bytes.start)..(run.end * self.page).min(bytes.end)
            })
            .collect()
    }

    /// Reads `runs` of `file` (inode `ino`) from local parts and stores them, counting
    /// the bytes stored in `stored`; `false` at the first slice that was not all local
    /// any more (evicted since the caller found it local) or that the kernel refused:
    /// the rest is not stored.
    pub(super) fn fill(
        &mut self,
        ino: u64,
        file: &FileNode,
        runs: Vec<Range<u64>>,
        stored: &AtomicU64,
    ) -> bool {
        runs.into_iter()
            .flat_map(|run| slices(run, PUSH_SLICE))
            .all(|slice| self.fill_slice(ino, file, slice, stored))
    }

    fn fill_slice(
        &mut self,
        ino: u64,
        file: &FileNode,
        slice: Range<u64>,
        stored: &AtomicU64,
    ) -> bool {
        let len = slice.end - slice.start;
        let plan = plan_read(&file.content, file.size, slice.start, len);
        match self.read_path.read_around(&plan, &mut self.buffer) {
            Some(Ok(())) if self.buffer.len() as u64 == len => {}
            Some(Err(error)) => {
                tracing::debug!(ino, ?slice, %error, "pages not stored: their bytes were not read");
                return false;
            }
            // Not all local, or the file is shorter than it said.
            _ => return false,
        }
        if let Err(error) = self.page_cache.store(ino, slice.start, &self.buffer) {
            // The file may be gone from the kernel's inode cache: nothing to fill.
            tracing::debug!(ino, ?slice, %error, "page cache store refused");
            return false;
        }
        self.given
            .pages
            .lock()
            .give(ino, pages_of(&slice, self.page));
        Metrics::add(stored, len);
        true
    }
}
