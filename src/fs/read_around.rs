//! Read-around from the disk cache: a read served from local parts also brings the
//! window of the file around it into the kernel's page cache, as a read of the cache's
//! own disk would.
//!
//! The kernel asks a FUSE mount for at most its read-ahead per fault (128 KiB), while
//! a local disk's read-around is the device's (8 MiB on many virtual disks). A reader
//! warm from the disk cache then pays a FUSE round trip and a disk read per 128 KiB
//! where it would pay one disk read per window on the cache's disk itself. Raising the
//! mount's read-ahead instead would widen every fault, cold ones too: a cold fault
//! would then wait on, or fetch, megabytes it does not need. So the mount's read-ahead
//! stays small and the daemon pushes the rest of a window itself, with FUSE's store
//! notification, and only when every byte of the window is already local: a push never
//! downloads, never waits, and never counts as a use of the parts for the eviction
//! order ([`Recency::Keep`](crate::cache::Recency)).
//!
//! A push sends only the pages the kernel was not given already ([`GivenPages`]): the
//! daemon marks the pages of every read it is asked for and of every push, and a read
//! of a marked page shows the kernel dropped it, which clears its window's marks. The
//! marks are sparse, kept only for blocks of pages that reads touched and at most
//! [`MAX_MARKED_BLOCKS`] of them: file sizes come from listings, which are not trusted. So a
//! cold epoch, whose reader read most of a window while its parts arrived, pushes only
//! the rest, and a warm one after the page cache was dropped pushes each window whole.
//!
//! Windows are aligned to their size, so that the reads of one window offer it once.
//! Pushes run on [`PUSHERS`] threads of their own, never in a FUSE thread (a store
//! notification waits for pages the kernel has locked for reads in flight, which FUSE
//! threads answer). A pusher reads and stores the pages a window lacks a slice
//! ([`PUSH_SLICE`]) at a time, through one buffer of that size it keeps: a buffer of
//! the whole window (two, where a read crosses a window's edge) held 16 MiB per pusher,
//! touched page by page over a long epoch, and read the pages the kernel had too. A
//! read offered while every pusher is busy is just a read.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::planned_pages::PlannedPusher;
use crate::catalog::{FileContent, Node, NodeKind};
use crate::metrics::Metrics;
use crate::read::ReadPath;
use crate::view::plan_read;

/// Threads pushing windows; the disk and the copies are shared with the reads.
pub const PUSHERS: usize = 2;

/// The largest window.
pub const MAX_WINDOW: u64 = 16 << 20;

/// Bytes a pusher reads and stores at once: its buffer. A store of 1 MiB costs the
/// kernel one write of the FUSE device, against the 128 KiB reads it saves eight of.
pub const PUSH_SLICE: u64 = 1 << 20;

/// Where pushed bytes go: the mount's page cache in the kernel, or a test's record.
pub trait PageCache: Send + Sync {
    /// Stores `bytes` as the contents of file `ino` from `offset` on.
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> io::Result<()>;
}

/// The window, aligned to `window` bytes, that holds every byte of `read`, clipped to
/// the file's `file_size` bytes.
pub fn window_around(read: &Range<u64>, window: u64, file_size: u64) -> Range<u64> {
    let start = read.start / window * window;
    let end = read
        .end
        .div_ceil(window)
        .saturating_mul(window)
        .min(file_size);
    start..end.max(read.end.min(file_size))
}

/// One window to push: the pages of `around` the kernel was not given, of file `ino`.
struct Push {
    ino: u64,
    node: Arc<Node>,
    around: Range<u64>,
}

/// Pages per block of marks: one block's bits cover 2 MiB of a file of 4 KiB pages.
const BLOCK_PAGES: u64 = 512;

const BLOCK_WORDS: usize = (BLOCK_PAGES / 64) as usize;

/// The most blocks of marks kept, over all files: about 8 MiB of marks, covering
/// 128 GiB of files of 4 KiB pages. Sizes come from listings, which the daemon does not
/// trust, so marks are kept only for the blocks reads touched, and at most these; past
/// them the lowest blocks are forgotten (a sequential reader's oldest). Forgetting is
/// always safe: a forgotten page is pushed again, and the kernel ignores pages it holds.
pub const MAX_MARKED_BLOCKS: usize = 1 << 16;

/// The pages of the mount's files the kernel was given (asked for by a read, or
/// pushed) and has not been seen to drop: one bit per page, in blocks of
/// [`BLOCK_PAGES`] kept only where a bit is set, at most [`MAX_MARKED_BLOCKS`] of
/// them. A dense bitmap per file grew to the offset of the last read: a listed 1 PiB
/// object and one read near its end took 32 GiB.
#[derive(Debug, Default)]
pub(super) struct GivenPages {
    /// (inode, block) → the bits of the block's pages.
    blocks: BTreeMap<(u64, u64), [u64; BLOCK_WORDS]>,
}

/// `pages` cut at block boundaries: (block, the pages' offsets within it).
fn by_block(pages: Range<u64>) -> impl Iterator<Item = (u64, Range<u64>)> {
    let first = pages.start / BLOCK_PAGES;
    let last = pages.end.div_ceil(BLOCK_PAGES);
    (first..last).filter_map(move |block| {
        let base = block * BLOCK_PAGES;
        let within = pages.start.max(base) - base..pages.end.min(base + BLOCK_PAGES) - base;
        (!within.is_empty()).then_some((block, within))
    })
}

fn bit(page_in_block: u64) -> (usize, u64) {
    ((page_in_block / 64) as usize, 1 << (page_in_block % 64))
}

impl GivenPages {
    fn is_given(&self, ino: u64, page: u64) -> bool {
        let (word, mask) = bit(page % BLOCK_PAGES);
        self.blocks
            .get(&(ino, page / BLOCK_PAGES))
            .is_some_and(|bits| bits[word] & mask != 0)
    }

    fn any_given(&self, ino: u64, pages: Range<u64>) -> bool {
        by_block(pages).any(|(block, within)| {
            self.blocks.get(&(ino, block)).is_some_and(|bits| {
                within.into_iter().any(|page| {
                    let (word, mask) = bit(page);
                    bits[word] & mask != 0
                })
            })
        })
    }

    pub(super) fn give(&mut self, ino: u64, pages: Range<u64>) {
        for (block, within) in by_block(pages) {
            if !self.blocks.contains_key(&(ino, block)) && self.blocks.len() >= MAX_MARKED_BLOCKS {
                self.blocks.pop_first();
            }
            let bits = self.blocks.entry((ino, block)).or_default();
            for page in within {
                let (word, mask) = bit(page);
                bits[word] |= mask;
            }
        }
    }

    fn forget(&mut self, ino: u64, pages: Range<u64>) {
        for (block, within) in by_block(pages) {
            let Some(bits) = self.blocks.get_mut(&(ino, block)) else {
                continue;
            };
            for page in within {
                let (word, mask) = bit(page);
                bits[word] &= !mask;
            }
            if bits.iter().all(|&word| word == 0) {
                self.blocks.remove(&(ino, block));
            }
        }
    }

    /// The runs of pages within `pages` of file `ino` not given, in order.
    pub(super) fn missing(&self, ino: u64, pages: Range<u64>) -> Vec<Range<u64>> {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for page in pages {
            if self.is_given(ino, page) {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.end == page => run.end += 1,
                _ => runs.push(page..page + 1),
            }
        }
        runs
    }

    #[cfg(test)]
    fn blocks(&self) -> usize {
        self.blocks.len()
    }
}

/// The pages holding bytes `bytes`, of `page` bytes each.
pub(super) fn pages_of(bytes: &Range<u64>, page: u64) -> Range<u64> {
    bytes.start / page..bytes.end.div_ceil(page)
}

/// What the kernel holds of the mount's files, as far as the daemon knows, shared by
/// the reads that mark it and the pushers.
#[derive(Default)]
pub(super) struct Given {
    pub(super) pages: Mutex<GivenPages>,
}

pub struct ReadAround {
    /// Window bytes; 0 turns the read-around off.
    window: u64,
    read_path: Arc<ReadPath>,
    metrics: Arc<Metrics>,
    /// The pushers' queue, once connected to a page cache.
    queue: OnceLock<SyncSender<Push>>,
    /// (inode, window start) of the pushes queued or running.
    pushing: Arc<Mutex<HashSet<(u64, u64)>>>,
    given: Arc<Given>,
    page: u64,
    /// A plan's exact rows, stored as they arrive, whatever the window.
    planned: Arc<PlannedPusher>,
}

impl ReadAround {
    /// A read-around of `window` bytes (whole pages, at most [`MAX_WINDOW`]; 0: off)
    /// that pushes nothing until [`ReadAround::connect`]ed to a page cache.
    pub fn new(window: u64, read_path: Arc<ReadPath>, metrics: Arc<Metrics>) -> Arc<ReadAround> {
        let page = rustix::param::page_size() as u64;
        let given = Arc::new(Given::default());
        let planned = Arc::new(PlannedPusher::new(
            read_path.clone(),
            metrics.clone(),
            given.clone(),
            page,
        ));
        Arc::new(ReadAround {
            window: window.min(MAX_WINDOW).div_ceil(page) * page,
            read_path,
            metrics,
            queue: OnceLock::new(),
            pushing: Arc::new(Mutex::new(HashSet::new())),
            given,
            page,
            planned,
        })
    }

    /// The stores of a plan's exact rows into the page cache.
    pub fn planned(&self) -> &Arc<PlannedPusher> {
        &self.planned
    }

    /// Whether its windows are wide enough to bring the part files into the page cache
    /// through the disk's read-ahead as it reads them: one push slice or more.
    pub fn reads_parts_ahead(&self) -> bool {
        self.window >= PUSH_SLICE
    }

    /// Starts the pushers, which send windows to `page_cache` (once: the mount's kernel
    /// connection), and the planned pages' thread. They stop when the read-around is
    /// dropped.
    pub fn connect(&self, page_cache: Arc<dyn PageCache>) {
        self.planned.connect(page_cache.clone());
        if self.window == 0 {
            return;
        }
        // Room for one waiting window per pusher: more would be stale when its turn came.
        let (sender, receiver) = sync_channel(PUSHERS);
        if self.queue.set(sender).is_err() {
            tracing::warn!("the read-around is connected to a page cache already");
            return;
        }
        let receiver = Arc::new(Mutex::new(receiver));
        for n in 0..PUSHERS {
            let pusher = Pusher {
                read_path: self.read_path.clone(),
                metrics: self.metrics.clone(),
                page_cache: page_cache.clone(),
                pushing: self.pushing.clone(),
                given: self.given.clone(),
                page: self.page,
                buffer: Vec::with_capacity(PUSH_SLICE as usize),
            };
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("scdlfs-push-{n}"))
                .spawn(move || pusher.run(&receiver));
            if let Err(error) = spawned {
                tracing::warn!(%error, "cannot start a read-around thread");
            }
        }
    }

    /// Notes that the kernel asks for bytes `read` of data file `ino` of `file_size`
    /// bytes: it will hold their pages, and if it was given any of them before, it has
    /// dropped pages of that window since.
    pub fn note_asked(&self, ino: u64, file_size: u64, read: &Range<u64>) {
        if self.queue.get().is_none() {
            return;
        }
        let pages = pages_of(read, self.page);
        let mut given = self.given.pages.lock();
        if given.any_given(ino, pages.clone()) {
            given.forget(
                ino,
                pages_of(&window_around(read, self.window, file_size), self.page),
            );
        }
        given.give(ino, pages);
    }

    /// Offers the window around `read`, which the disk cache has just served from data
    /// file `ino` (`node`), for a push in the background.
    pub fn offer(&self, ino: u64, node: &Arc<Node>, read: Range<u64>) {
        let Some(queue) = self.queue.get() else {
            return;
        };
        let NodeKind::File(file) = &node.kind else {
            return;
        };
        let around = window_around(&read, self.window, file.size);
        if around.end - around.start <= read.end - read.start
            || !self.pushing.lock().insert((ino, around.start))
        {
            return;
        }
        let push = Push {
            ino,
            node: node.clone(),
            around,
        };
        if let Err(TrySendError::Full(push) | TrySendError::Disconnected(push)) =
            queue.try_send(push)
        {
            self.pushing.lock().remove(&(push.ino, push.around.start));
        }
    }
}

/// One pusher thread's state.
struct Pusher {
    read_path: Arc<ReadPath>,
    metrics: Arc<Metrics>,
    page_cache: Arc<dyn PageCache>,
    pushing: Arc<Mutex<HashSet<(u64, u64)>>>,
    given: Arc<Given>,
    page: u64,
    buffer: Vec<u8>,
}

impl Pusher {
    fn run(mut self, queue: &Mutex<Receiver<Push>>) {
        loop {
            let next = queue.lock().recv();
            let Ok(push) = next else {
                return;
            };
            self.push(&push);
            self.pushing.lock().remove(&(push.ino, push.around.start));
        }
    }

    /// Pushes the pages of the window the kernel was not given, if every byte of the
    /// window is local.
    fn push(&mut self, push: &Push) {
        let NodeKind::File(file) = &push.node.kind else {
            return;
        };
        let Push { ino, around, .. } = push;
        let missing = self
            .given
            .pages
            .lock()
            .missing(*ino, pages_of(around, self.page));
        let window = plan_read(
            &file.content,
            file.size,
            around.start,
            around.end - around.start,
        );
        if missing.is_empty() || !self.read_path.is_local(&window) {
            return;
        }
        for pages in missing {
            let run = pages.start * self.page..(pages.end * self.page).min(around.end);
            for slice in slices(run, PUSH_SLICE) {
                if !self.push_slice(*ino, file.size, &file.content, slice) {
                    return;
                }
            }
        }
        Metrics::add(&self.metrics.read_around_windows, 1);
    }

    /// Reads bytes `slice` of the file from local parts and stores them; `false` if
    /// they were not all local any more (evicted since the window was found local) or
    /// the kernel refused them.
    fn push_slice(
        &mut self,
        ino: u64,
        file_size: u64,
        content: &FileContent,
        slice: Range<u64>,
    ) -> bool {
        let plan = plan_read(content, file_size, slice.start, slice.end - slice.start);
        match self.read_path.read_around(&plan, &mut self.buffer) {
            Some(Ok(())) if self.buffer.len() as u64 == slice.end - slice.start => {}
            Some(Err(error)) => {
                tracing::debug!(ino, ?slice, %error, "read-around skipped");
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
        let pages = pages_of(&slice, self.page);
        self.given.pages.lock().give(ino, pages);
        Metrics::add(&self.metrics.read_around_bytes, slice.end - slice.start);
        true
    }
}

/// `bytes` cut into consecutive ranges of at most `slice` bytes.
pub(super) fn slices(bytes: Range<u64>, slice: u64) -> impl Iterator<Item = Range<u64>> {
    (bytes.start..bytes.end)
        .step_by(slice as usize)
        .map(move |start| start..(start + slice).min(bytes.end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_read_takes_the_aligned_window_it_falls_in() {
        assert_eq!(window_around(&(100..200), 1000, 10_000), 0..1000);
        assert_eq!(window_around(&(1500..1600), 1000, 10_000), 1000..2000);
        assert_eq!(window_around(&(900..1100), 1000, 10_000), 0..2000);
        assert_eq!(window_around(&(9500..9800), 1000, 9800), 9000..9800);
    }

    /// What `GivenPages` should say: a plain set of (inode, page).
    fn runs_missing_from(
        set: &BTreeSet<(u64, u64)>,
        ino: u64,
        pages: Range<u64>,
    ) -> Vec<Range<u64>> {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for page in pages.filter(|page| !set.contains(&(ino, *page))) {
            match runs.last_mut() {
                Some(run) if run.end == page => run.end = page + 1,
                _ => runs.push(page..page + 1),
            }
        }
        runs
    }

    /// Pages near the start of a file, across a block edge, and near the end of a
    /// file of a petabyte (2^38 pages of 4 KiB).
    fn a_page() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..300,
            BLOCK_PAGES - 100..BLOCK_PAGES + 100,
            (1u64 << 38) - 300..1 << 38,
        ]
    }

    #[test]
    fn marks_near_the_end_of_a_petabyte_file_take_one_block() {
        let mut given = GivenPages::default();
        let last = (1u64 << 50) / 4096 - 1;
        given.give(7, last - 3..last + 1);
        assert!(given.any_given(7, last..last + 1));
        assert_eq!(given.blocks(), 1);
    }

    #[test]
    fn marks_beyond_the_bound_forget_the_lowest_blocks() {
        let mut given = GivenPages::default();
        let blocks = MAX_MARKED_BLOCKS as u64 + 10;
        for block in 0..blocks {
            given.give(1, block * BLOCK_PAGES..block * BLOCK_PAGES + 1);
        }
        assert_eq!(given.blocks(), MAX_MARKED_BLOCKS);
        assert!(!given.any_given(1, 0..1), "the lowest block is forgotten");
        let newest = (blocks - 1) * BLOCK_PAGES;
        assert!(given.any_given(1, newest..newest + 1));
    }

    proptest! {
        #[test]
        fn given_pages_are_the_set_of_pages_given_and_not_forgotten(
            changes in proptest::collection::vec((any::<bool>(), 0u64..3, a_page(), 0u64..1200), 0..40),
            asked in (0u64..3, a_page(), 0u64..1200),
        ) {
            let mut given = GivenPages::default();
            let mut model = BTreeSet::new();
            for (give, ino, start, len) in changes {
                let pages = start..start + len;
                if give {
                    given.give(ino, pages.clone());
                    model.extend(pages.map(|page| (ino, page)));
                } else {
                    given.forget(ino, pages.clone());
                    for page in pages {
                        model.remove(&(ino, page));
                    }
                }
            }
            let (ino, start, len) = asked;
            let asked = start..start + len;
            prop_assert_eq!(given.missing(ino, asked.clone()), runs_missing_from(&model, ino, asked.clone()));
            prop_assert_eq!(given.any_given(ino, asked.clone()), asked.clone().any(|p| model.contains(&(ino, p))));
            // Only blocks holding a given page are kept.
            let touched: BTreeSet<_> = model.iter().map(|&(ino, page)| (ino, page / BLOCK_PAGES)).collect();
            prop_assert_eq!(given.blocks(), touched.len());
        }

        #[test]
        fn slices_cover_the_bytes_in_order_each_whole_but_the_last(
            start in 0u64..1 << 40,
            len in 0u64..1 << 24,
            slice in 1u64..1 << 22,
        ) {
            let slices: Vec<_> = slices(start..start + len, slice).collect();
            let mut at = start;
            for (n, s) in slices.iter().enumerate() {
                prop_assert_eq!(s.start, at);
                prop_assert!(s.end > s.start);
                if n + 1 < slices.len() {
                    prop_assert_eq!(s.end - s.start, slice);
                } else {
                    prop_assert!(s.end - s.start <= slice);
                }
                at = s.end;
            }
            prop_assert_eq!(at, start + len);
        }

        #[test]
        fn the_window_covers_the_read_and_stays_in_the_file(
            file_size in 1u64..1 << 40,
            start_frac in 0.0f64..1.0,
            len in 1u64..1 << 22,
            window in 1u64..1 << 25,
        ) {
            let start = ((file_size - 1) as f64 * start_frac) as u64;
            let read = start..(start + len).min(file_size);
            let around = window_around(&read, window, file_size);
            prop_assert!(around.start <= read.start && read.end <= around.end);
            prop_assert!(around.end <= file_size);
            prop_assert!(around.start.is_multiple_of(window));
            prop_assert!(around.end == file_size || around.end.is_multiple_of(window));
            prop_assert!(around.end - around.start < (read.end - read.start) + 2 * window);
        }
    }
}
