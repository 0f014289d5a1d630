//! Checked reads out of the cache: every block a read touches is checked against the
//! CRC32C kept since the part was written, and a [`PinnedPart`] keeps its part resident
//! (and its file open) until it is dropped.

use std::fs::File;
use std::io::{self};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::books::ResidentFile;
use super::{CacheError, DiskCache};
use crate::parts::{span, spans_touched, PartKey};

thread_local! {
    /// Where a read puts the blocks it covers only in part, to check them whole.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A part's data in a file, with the CRC32C of each of its blocks (all of them, or
/// the first ones of a part still being written, whose reads stay within them).
pub(super) struct CheckedBlocks<'a> {
    pub(super) file: &'a File,
    pub(super) data_offset: u64,
    pub(super) data_len: u64,
    pub(super) block_len: u64,
    pub(super) block_crc32c: &'a [u32],
}

pub(super) enum BlockReadFailure {
    Io(io::Error),
    BadBlock(u64),
}

impl From<io::Error> for BlockReadFailure {
    fn from(error: io::Error) -> Self {
        BlockReadFailure::Io(error)
    }
}

/// Fills `buf` from `offset` within the data of `blocks`, checking every block it
/// touches against its CRC32C. Blocks the request covers whole are read straight into
/// `buf`; the (at most two) blocks it covers in part are read whole into a scratch
/// buffer.
pub(super) fn read_checked(
    blocks: &CheckedBlocks<'_>,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), BlockReadFailure> {
    let range = offset..offset + buf.len() as u64;
    assert!(range.end <= blocks.data_len, "read past the part's end");
    let block_len = blocks.block_len;
    let block_range = |block: u64| span(block, block_len, blocks.data_len);
    let check = |block: u64, bytes: &[u8]| {
        let expected = blocks.block_crc32c.get(block as usize);
        assert!(expected.is_some(), "read of a block not yet written");
        if expected == Some(&crc32c::crc32c(bytes)) {
            Ok(())
        } else {
            Err(BlockReadFailure::BadBlock(block))
        }
    };
    let touched = spans_touched(&range, block_len);
    let covered = |block: u64| {
        let bytes = block_range(block);
        range.start <= bytes.start && bytes.end <= range.end
    };
    let whole_start = touched.start + u64::from(!covered(touched.start));
    let whole_end = touched.end - u64::from(touched.end > whole_start && !covered(touched.end - 1));
    if whole_start < whole_end {
        let bytes = block_range(whole_start).start..block_range(whole_end - 1).end;
        let dest = &mut buf[(bytes.start - offset) as usize..(bytes.end - offset) as usize];
        blocks
            .file
            .read_exact_at(dest, blocks.data_offset + bytes.start)?;
        for (i, block) in dest.chunks(block_len as usize).enumerate() {
            check(whole_start + i as u64, block)?;
        }
    }
    for block in touched.filter(|b| !(whole_start..whole_end).contains(b)) {
        let bytes = block_range(block);
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.resize((bytes.end - bytes.start) as usize, 0);
            blocks
                .file
                .read_exact_at(scratch, blocks.data_offset + bytes.start)?;
            check(block, scratch)?;
            let from = range.start.max(bytes.start);
            let to = range.end.min(bytes.end);
            buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                &scratch[(from - bytes.start) as usize..(to - bytes.start) as usize],
            );
            Ok::<_, BlockReadFailure>(())
        })?;
    }
    Ok(())
}

/// A resident part, kept from eviction while this handle lives.
pub struct PinnedPart {
    pub(super) cache: Arc<DiskCache>,
    pub(super) key: PartKey,
    pub(super) file: Arc<ResidentFile>,
}

impl PinnedPart {
    pub fn len(&self) -> u64 {
        self.file.data_len
    }

    pub fn is_empty(&self) -> bool {
        self.file.data_len == 0
    }

    /// Fills `buf` from `offset` within the part's data, checking every block it
    /// touches ([`read_checked`]).
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), CacheError> {
        if buf.is_empty() {
            return Ok(());
        }
        let file = &*self.file;
        let handle = self
            .cache
            .open_files
            .file(&file.file, |name| {
                self.cache.parts.dir.open_for_reading(name)
            })
            .map_err(|error| self.unreadable(error))?;
        let blocks = CheckedBlocks {
            file: &handle,
            data_offset: file.data_offset,
            data_len: file.data_len,
            block_len: file.block_len as u64,
            block_crc32c: &file.block_crc32c,
        };
        let result = read_checked(&blocks, buf, offset);
        if result.is_ok() {
            self.cache.read_advice.after_read(&handle, file);
        }
        result.map_err(|failure| match failure {
            BlockReadFailure::Io(error) => self.unreadable(error),
            BlockReadFailure::BadBlock(block) => {
                self.cache.drop_corrupt(self.key, &self.file, block);
                CacheError::Corrupt {
                    part: self.key,
                    block,
                }
            }
        })
    }

    /// A part file that cannot be opened again or read (truncated, deleted or replaced
    /// behind the daemon's back, or a bad sector) is dropped like a corrupt one, so the
    /// read fetches the part afresh.
    fn unreadable(&self, error: io::Error) -> CacheError {
        self.cache
            .drop_unreadable(self.key, &self.file, &error.to_string());
        CacheError::Unreadable {
            part: self.key,
            reason: error.to_string(),
        }
    }
}

impl Drop for PinnedPart {
    fn drop(&mut self) {
        let mut books = self.cache.books.lock();
        // A part dropped as corrupt took its pins with it.
        if books.is_current(self.key, &self.file) {
            books.policy.unpin(self.key);
        }
    }
}
