//! The writing end of the read-ahead hint protocol ([`scdl_format::hint`]).
//!
//! An scdlfs mount offers a hint file, `.scdlfs-hints`, in each dataset directory. A
//! sampler that finds one opens it (write-only; the daemon keeps a plan per open
//! handle, dropped when the handle closes), greets, states the rows per chunk its
//! windows assume (`chunk-rows`, which the daemon checks against its own), and writes
//! the steps it is about to read. A directory without the file (a plain local dataset) gets no hints and loses
//! nothing, since hints only advise the daemon's prefetching. For the same reason a
//! failed write never stops iteration: the first failure is kept for the caller to
//! inspect, and writing goes on.
//!
//! Each write to the hint file is a round trip through the kernel to the daemon. The
//! greeting is written by the caller, so that a handle that cannot greet is known to be
//! silent at once; every later write is handed to a thread of the writer's own
//! (`scdl-hints`), in order, so that a reader whose rows come from the page cache does
//! not wait for the daemon between minibatches. The queue to that thread is bounded:
//! a daemon slower than the reader holds the reader back, not memory.
//!
//! A process forked from the writer's (a DataLoader worker under `fork`) inherits the
//! handle but not the thread: there the writer is silent, and dropping it closes the
//! child's copy of the handle without waiting for a thread it does not have.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use scdl_format::hint::{HintLine, HINT_FILE, VERSION};

/// The most bytes one `write()` carries. The daemon accepts or refuses each FUSE
/// write request as a whole, and the kernel splits a write into requests of at most
/// the mount's `max_write`, which for an scdlfs mount is the largest request the kernel
/// makes (128 KiB on kernels without `FUSE_MAX_PAGES`, up to 1 MiB with it). Within
/// that, pieces are large because each write is a round trip through the kernel to the
/// daemon, taken beside the reader: a piece carries whole lines, so a refused one loses
/// no line of another piece (a single longer line is still sent alone).
const MAX_WRITE_BYTES: usize = 64 << 10;

/// Writes queued for the writer's thread before the caller waits: a top-up of any
/// order is a piece or a few, so this holds several top-ups, at most 4 MiB of hints.
const QUEUED_WRITES: usize = 64;

/// Why hints could not be given.
#[derive(Debug, thiserror::Error)]
pub enum HintWriteError {
    #[error("cannot open the hint file {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("the daemon refused or lost hints written to {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// The open hint file of one dataset, or nothing when the dataset has none.
#[derive(Debug)]
pub struct HintWriter {
    path: PathBuf,
    /// Set while hints are written: the thread that writes them.
    background: Option<Background>,
    /// The first failure not yet taken, from the caller's writes or the thread's.
    unreported: Arc<Mutex<Option<HintWriteError>>>,
    /// Declared last: dropped after [`HintWriter::drop`] has joined the thread that
    /// writes to it.
    file: Option<File>,
}

/// The thread that writes one handle's hints, and how to reach it.
#[derive(Debug)]
struct Background {
    /// The process that started the thread; in any other (a fork) it does not exist.
    owner_pid: u32,
    queue: SyncSender<Job>,
    thread: JoinHandle<()>,
}

enum Job {
    Write(Vec<u8>),
    /// Answered once every write queued before it is done.
    Flush(SyncSender<()>),
}

impl HintWriter {
    /// Opens the hint file of the dataset at `dataset_dir`, greets the daemon and states
    /// `chunk_rows`, the rows per chunk that `window` steps will assume. Never fails:
    /// without a hint file the writer stays silent, and an open or greeting failure is
    /// kept for [`HintWriter::take_error`] and silences the writer, since the daemon
    /// refuses every step of a handle that has not greeted or that disagrees on chunks.
    pub fn open(dataset_dir: &Path, chunk_rows: u64) -> HintWriter {
        let mut writer = HintWriter {
            path: dataset_dir.join(HINT_FILE),
            background: None,
            unreported: Arc::default(),
            file: None,
        };
        let mut file = match OpenOptions::new().write(true).open(&writer.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return writer,
            Err(source) => {
                writer.record(HintWriteError::Open {
                    path: writer.path.clone(),
                    source,
                });
                return writer;
            }
        };
        let opening = [
            HintLine::Greeting { version: VERSION },
            HintLine::ChunkRows { rows: chunk_rows },
        ];
        for piece in pack_lines(&opening) {
            if let Err(source) = file.write_all(&piece) {
                writer.record(HintWriteError::Write {
                    path: writer.path.clone(),
                    source,
                });
                return writer;
            }
        }
        match writer.start_background(&file) {
            Ok(background) => {
                writer.background = Some(background);
                writer.file = Some(file);
            }
            Err(source) => writer.record(HintWriteError::Write {
                path: writer.path.clone(),
                source,
            }),
        }
        writer
    }

    fn start_background(&self, file: &File) -> io::Result<Background> {
        // SAFETY: the thread writes through the descriptor of `file`, which the writer
        // owns and closes only after joining the thread (`Drop`); `ManuallyDrop` keeps
        // the thread from closing it.
        let borrowed = ManuallyDrop::new(unsafe { File::from_raw_fd(file.as_raw_fd()) });
        let (queue, jobs) = sync_channel(QUEUED_WRITES);
        let path = self.path.clone();
        let unreported = self.unreported.clone();
        let thread = std::thread::Builder::new()
            .name("scdl-hints".into())
            .spawn(move || write_jobs(&borrowed, jobs, &path, &unreported))?;
        Ok(Background {
            owner_pid: std::process::id(),
            queue,
            thread,
        })
    }

    /// A writer that gives no hints, for a sampler told not to.
    pub fn disabled() -> HintWriter {
        HintWriter {
            path: PathBuf::new(),
            background: None,
            unreported: Arc::default(),
            file: None,
        }
    }

    /// The thread writing hints, when there is one in this process.
    fn own_background(&self) -> Option<&Background> {
        self.background
            .as_ref()
            .filter(|b| b.owner_pid == std::process::id())
    }

    /// Whether hints are being written (never in a process that inherited the writer).
    pub fn is_active(&self) -> bool {
        self.own_background().is_some()
    }

    /// Waits until the hints written so far have reached the hint file.
    pub fn flush(&self) {
        let Some(background) = self.own_background() else {
            return;
        };
        let (done, wait) = sync_channel(1);
        if background.queue.send(Job::Flush(done)).is_ok() {
            // An error: the thread is gone, so nothing is left to wait for.
            let _ = wait.recv();
        }
    }

    /// The first failure since the last call, once the hints written so far have been
    /// tried. Later failures while one is unreported are not kept: they are usually its
    /// consequences.
    pub fn take_error(&mut self) -> Option<HintWriteError> {
        if self.background.is_some() && !self.is_active() {
            // Inherited across a fork: the failures are the parent's, and the parent's
            // thread may have held their lock when the process was copied.
            return None;
        }
        self.flush();
        lock(&self.unreported).take()
    }

    /// The failure [`HintWriter::take_error`] would give next, as text, without
    /// waiting for the writes queued and without taking it: for a caller that tells
    /// of a failure while it iterates, and leaves the failure to whoever takes it.
    pub fn pending_error(&self) -> Option<String> {
        if self.background.is_some() && !self.is_active() {
            // Inherited across a fork: as in `take_error`.
            return None;
        }
        lock(&self.unreported).as_ref().map(|e| e.to_string())
    }

    fn record(&self, error: HintWriteError) {
        record(&self.unreported, error);
    }

    /// Hands `lines` to the writer's thread, whole lines per `write()`, in order. A
    /// refusal is recorded for [`HintWriter::take_error`], and the writes after it are
    /// still tried, because the daemon judges each write on its own.
    pub fn write_lines(&mut self, lines: &[HintLine]) {
        let Some(background) = self.own_background() else {
            return;
        };
        for piece in pack_lines(lines) {
            if background.queue.send(Job::Write(piece)).is_err() {
                // Only a panic ends the thread before the writer drops.
                self.record(HintWriteError::Write {
                    path: self.path.clone(),
                    source: io::Error::other("the hint writer's thread has stopped"),
                });
                return;
            }
        }
    }
}

impl Drop for HintWriter {
    fn drop(&mut self) {
        let Some(background) = self.background.take() else {
            return;
        };
        if background.owner_pid == std::process::id() {
            // Closing the queue lets the thread finish the writes queued, then end.
            drop(background.queue);
            let _ = background.thread.join();
        } else {
            // Inherited across a fork: the thread is not in this process, and the
            // queue's state was copied mid-use; leave both untouched. `file` closes
            // this process's copy of the handle only.
            std::mem::forget(background);
        }
    }
}

/// The writer's thread: writes each piece as it comes, answers flushes, and records
/// the first failure.
fn write_jobs(
    mut file: &File,
    jobs: Receiver<Job>,
    path: &Path,
    unreported: &Mutex<Option<HintWriteError>>,
) {
    for job in jobs {
        match job {
            Job::Write(piece) => {
                if let Err(source) = file.write_all(&piece) {
                    let path = path.to_owned();
                    record(unreported, HintWriteError::Write { path, source });
                }
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Keeps `error` unless an earlier one is still unreported.
fn record(slot: &Mutex<Option<HintWriteError>>, error: HintWriteError) {
    lock(slot).get_or_insert(error);
}

/// The error slot, also after a panic elsewhere while it was held (it holds no
/// invariant a panic could break).
fn lock(slot: &Mutex<Option<HintWriteError>>) -> std::sync::MutexGuard<'_, Option<HintWriteError>> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Encodes `lines` into pieces of whole lines, each at most [`MAX_WRITE_BYTES`] long
/// unless it holds a single longer line.
fn pack_lines(lines: &[HintLine]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    for line in lines {
        let encoded = format!("{line}\n");
        if !piece.is_empty() && piece.len() + encoded.len() > MAX_WRITE_BYTES {
            pieces.push(std::mem::take(&mut piece));
        }
        piece.extend_from_slice(encoded.as_bytes());
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_line() -> impl Strategy<Value = HintLine> {
        prop_oneof![
            any::<u64>().prop_map(|epoch| HintLine::Plan { epoch }),
            proptest::collection::vec(any::<u32>(), 1..1200)
                .prop_map(|chunks| HintLine::Window { chunks }),
            (0u64..u64::MAX / 2, 1u64..1000).prop_map(|(start, len)| HintLine::Rows {
                ranges: std::iter::once(start..start + len).collect()
            }),
        ]
    }

    proptest! {
        /// Packing changes where writes start and end, never the bytes, and every
        /// piece is whole lines within the size limit or one long line alone.
        #[test]
        fn pieces_are_whole_lines_within_the_limit(
            lines in proptest::collection::vec(any_line(), 0..60),
        ) {
            let pieces = pack_lines(&lines);
            let expected: String = lines.iter().map(|l| format!("{l}\n")).collect();
            prop_assert_eq!(pieces.concat(), expected.into_bytes());
            for piece in &pieces {
                prop_assert_eq!(piece.last(), Some(&b'\n'));
                let line_count = piece.iter().filter(|&&b| b == b'\n').count();
                prop_assert!(piece.len() <= MAX_WRITE_BYTES || line_count == 1);
            }
        }
    }
}
