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

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use scdl_format::hint::{HintLine, HINT_FILE, VERSION};

/// The most bytes one `write()` carries. The daemon accepts or refuses each FUSE
/// write request as a whole, and the kernel splits a write larger than the mount's
/// `max_write` (as small as one page) into several requests: keeping writes within a
/// page keeps one bad line from taking good lines of other requests down with it (a
/// single longer line is still sent alone).
const MAX_WRITE_BYTES: usize = 4096;

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
    file: Option<File>,
    unreported: Option<HintWriteError>,
}

impl HintWriter {
    /// Opens the hint file of the dataset at `dataset_dir`, greets the daemon and states
    /// `chunk_rows`, the rows per chunk that `window` steps will assume. Never fails:
    /// without a hint file the writer stays silent, and an open or greeting failure is
    /// kept for [`HintWriter::take_error`] and silences the writer, since the daemon
    /// refuses every step of a handle that has not greeted or that disagrees on chunks.
    pub fn open(dataset_dir: &Path, chunk_rows: u64) -> HintWriter {
        let path = dataset_dir.join(HINT_FILE);
        let mut writer = HintWriter {
            file: None,
            unreported: None,
            path,
        };
        match OpenOptions::new().write(true).open(&writer.path) {
            Ok(file) => {
                writer.file = Some(file);
                let opening = [
                    HintLine::Greeting { version: VERSION },
                    HintLine::ChunkRows { rows: chunk_rows },
                ];
                if !writer.write_lines(&opening) {
                    writer.file = None;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                writer.unreported = Some(HintWriteError::Open {
                    path: writer.path.clone(),
                    source,
                })
            }
        }
        writer
    }

    /// A writer that gives no hints, for a sampler told not to.
    pub fn disabled() -> HintWriter {
        HintWriter {
            path: PathBuf::new(),
            file: None,
            unreported: None,
        }
    }

    /// Whether hints are being written.
    pub fn is_active(&self) -> bool {
        self.file.is_some()
    }

    /// The first failure since the last call. Later failures while one is unreported
    /// are not kept: they are usually its consequences.
    pub fn take_error(&mut self) -> Option<HintWriteError> {
        self.unreported.take()
    }

    /// Writes `lines`, whole lines per `write()`. Returns whether all were accepted;
    /// a refusal is recorded, and the lines after it in this call are still tried,
    /// because the daemon judges each write on its own.
    pub fn write_lines(&mut self, lines: &[HintLine]) -> bool {
        let Some(file) = &mut self.file else {
            return true;
        };
        let mut all_written = true;
        for piece in pack_lines(lines) {
            if let Err(source) = file.write_all(&piece) {
                all_written = false;
                self.unreported.get_or_insert(HintWriteError::Write {
                    path: self.path.clone(),
                    source,
                });
            }
        }
        all_written
    }
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
