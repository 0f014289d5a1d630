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
//! A push sends only the pages the kernel was not given already
//! ([`GivenPages`](super::page_cache::GivenPages)): the daemon marks the pages of every
//! read it is asked for and of every push, and a read of a marked page shows the kernel
//! dropped it, which clears its window's marks. The marks are sparse, kept only for
//! blocks of pages that reads touched and at most
//! [`MAX_MARKED_BLOCKS`](super::page_cache::MAX_MARKED_BLOCKS) of them: file sizes come
//! from listings, which are not trusted. So a cold epoch, whose reader read most of a
//! window while its parts arrived, pushes only the rest, and a warm one after the page
//! cache was dropped pushes each window whole.
//!
//! Windows are aligned to their size, so that the reads of one window offer it once.
//! Pushes run on [`PUSHERS`] threads of their own, never in a FUSE thread (a store
//! notification waits for pages the kernel has locked for reads in flight, which FUSE
//! threads answer). A pusher reads and stores the pages a window lacks a slice
//! ([`PUSH_SLICE`]) at a time, through one buffer of that size it keeps: a buffer of
//! the whole window (two, where a read crosses a window's edge) held 16 MiB per pusher,
//! touched page by page over a long epoch, and read the pages the kernel had too. A
//! read offered while every pusher is busy is just a read.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::page_cache::{pages_of, Given, PageCache, PUSH_SLICE};
use super::page_filler::PageFiller;
use super::planned_pages::PlannedPusher;
use crate::catalog::{Node, NodeKind};
use crate::metrics::Metrics;
use crate::read::ReadPath;
use crate::view::plan_read;

/// Threads pushing windows; the disk and the copies are shared with the reads.
pub const PUSHERS: usize = 2;

/// The largest window.
pub const MAX_WINDOW: u64 = 16 << 20;

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
                pushing: self.pushing.clone(),
                filler: PageFiller::new(
                    self.read_path.clone(),
                    page_cache.clone(),
                    self.given.clone(),
                    self.page,
                ),
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
    pushing: Arc<Mutex<HashSet<(u64, u64)>>>,
    filler: PageFiller,
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
        let missing = self.filler.missing(*ino, around);
        let window = plan_read(
            &file.content,
            file.size,
            around.start,
            around.end - around.start,
        );
        if missing.is_empty() || !self.read_path.is_local(&window) {
            return;
        }
        if !self
            .filler
            .fill(*ino, file, missing, &self.metrics.read_around_bytes)
        {
            return;
        }
        Metrics::add(&self.metrics.read_around_windows, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_read_takes_the_aligned_window_it_falls_in() {
        assert_eq!(window_around(&(100..200), 1000, 10_000), 0..1000);
        assert_eq!(window_around(&(1500..1600), 1000, 10_000), 1000..2000);
        assert_eq!(window_around(&(900..1100), 1000, 10_000), 0..2000);
        assert_eq!(window_around(&(9500..9800), 1000, 9800), 9000..9800);
    }

    proptest! {
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
