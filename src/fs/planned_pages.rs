//! Planned pages: the exact bytes of a plan's rows, and the pages of row offsets that
//! bound them, stored into the page cache of the flat files as soon as the fetcher holds
//! them ([`crate::prefetch::exact`]), so that the reader's memory map finds them without
//! a FUSE read, and the kernel never reads around them.
//!
//! A store notification names an inode, so the flat files are remembered as they are
//! opened (at most [`FILES_KEPT`]); bytes of a file nobody opened stay with the fetcher
//! and are served by reads. One thread of its own does the stores, in arrival order
//! (a store waits for pages the kernel has locked for reads in flight, which the FUSE
//! threads answer). Once stored, the bytes are given back to the fetcher's budget: the
//! page cache holds them now, and a page the kernel drops before it is read is read
//! through FUSE like any other.

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use scdl_format::ArrayKind;

use super::page_cache::{Given, PageCache};
use super::page_filler::PageFiller;
use crate::catalog::{FileContent, FlatDataset, Node, NodeKind};
use crate::metrics::Metrics;
use crate::prefetch::PlannedPages;
use crate::read::ReadPath;
use crate::view::plan_read;

/// Flat files remembered for stores: three per dataset version a reader opened.
pub const FILES_KEPT: usize = 256;

/// A flat file as a store names it: its inode, and its node (which holds the dataset).
type FlatFile = (u64, Arc<Node>);

/// A flat array: its dataset's address, and which of its arrays.
type FileKey = (usize, ArrayKind);

/// A range of a flat file to store.
struct Store {
    ino: u64,
    node: Arc<Node>,
    bytes: Range<u64>,
}

pub struct PlannedPusher {
    /// (dataset, array) → the inode and node of its flat file. The node holds the
    /// dataset, so the address a key is made of is not reused while it is kept.
    files: Mutex<lru::LruCache<FileKey, FlatFile>>,
    queue: OnceLock<Mutex<Sender<Store>>>,
    read_path: Arc<ReadPath>,
    metrics: Arc<Metrics>,
    given: Arc<Given>,
    page: u64,
}

fn file_key(dataset: &Arc<FlatDataset>, kind: ArrayKind) -> FileKey {
    (Arc::as_ptr(dataset) as usize, kind)
}

impl PlannedPusher {
    pub(super) fn new(
        read_path: Arc<ReadPath>,
        metrics: Arc<Metrics>,
        given: Arc<Given>,
        page: u64,
    ) -> PlannedPusher {
        PlannedPusher {
            files: Mutex::new(lru::LruCache::new(NonZeroUsize::new(FILES_KEPT).unwrap())),
            queue: OnceLock::new(),
            read_path,
            metrics,
            given,
            page,
        }
    }

    /// Remembers an opened file if it is a flat array.
    pub fn opened(&self, ino: u64, node: &Arc<Node>) {
        let NodeKind::File(file) = &node.kind else {
            return;
        };
        if let FileContent::FlatArray(dataset, kind) = &file.content {
            self.files
                .lock()
                .put(file_key(dataset, *kind), (ino, node.clone()));
        }
    }

    /// Starts the thread that stores into `page_cache` (once); it ends when the pusher
    /// is dropped.
    pub(super) fn connect(self: &Arc<Self>, page_cache: Arc<dyn PageCache>) {
        let (sender, receiver) = channel();
        if self.queue.set(Mutex::new(sender)).is_err() {
            return;
        }
        let worker = StoreWorker {
            read_path: self.read_path.clone(),
            metrics: self.metrics.clone(),
            filler: PageFiller::new(
                self.read_path.clone(),
                page_cache,
                self.given.clone(),
                self.page,
            ),
        };
        let spawned = std::thread::Builder::new()
            .name("scdlfs-planned".into())
            .spawn(move || worker.run(receiver));
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the planned pages' thread");
        }
    }
}

impl PlannedPages for PlannedPusher {
    fn arrived(&self, dataset: &Arc<FlatDataset>, kind: ArrayKind, file_bytes: Range<u64>) {
        let (Some(queue), Some((ino, node))) = (
            self.queue.get(),
            self.files.lock().get(&file_key(dataset, kind)).cloned(),
        ) else {
            return;
        };
        // The thread ends only with the pusher: a send fails only while it is dropped.
        let _ = queue.lock().send(Store {
            ino,
            node,
            bytes: file_bytes,
        });
    }
}

struct StoreWorker {
    read_path: Arc<ReadPath>,
    metrics: Arc<Metrics>,
    filler: PageFiller,
}

impl StoreWorker {
    fn run(mut self, queue: Receiver<Store>) {
        while let Ok(store) = queue.recv() {
            self.store(&store);
        }
    }

    /// Stores the range a slice ([`PUSH_SLICE`](super::page_cache::PUSH_SLICE)) at a time if every byte is local (the fetcher may have
    /// dropped some past its cap), then gives the fetcher's copies back.
    fn store(&mut self, store: &Store) {
        let NodeKind::File(file) = &store.node.kind else {
            return;
        };
        let bytes = &store.bytes;
        let whole = plan_read(
            &file.content,
            file.size,
            bytes.start,
            bytes.end - bytes.start,
        );
        if !self.read_path.is_local(&whole) {
            return;
        }
        // Pages the kernel was given are skipped: pushed already, or asked for by a read,
        // which may still be in flight. A store waits for the pages such a read holds
        // locked, and this thread's stores are in arrival order: one store behind a read
        // of the link held every range behind it, 5 s of an 8 s epoch of blocks.
        let missing = self.filler.missing(store.ino, bytes);
        let stored = &self.metrics.planned_bytes_pushed;
        if !self.filler.fill(store.ino, file, missing, stored) {
            return;
        }
        self.read_path.release_planned(&whole);
    }
}
