//! Checked reads out of the cache: every block a read touches is checked against the
//! CRC32C kept since the part was written, and a [`PinnedPart`] keeps its part resident
//! (and its file open) until it is dropped.

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ownership::private_file;
use super::ADVISE_AGAIN_AFTER;
use super::{CacheError, DiskCache, ResidentFile};
use crate::parts::{span, spans_touched, PartKey};

thread_local! {
    /// Where a read puts the bytes of the (at most two) blocks it covers only in part
    /// that fall outside it: read with the rest, to check those blocks whole.
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
/// touches against its CRC32C. The touched blocks are read in one vectored read: the
/// bytes `buf` asks for straight into it, those of the edge blocks outside it into a
/// scratch buffer, and each block's CRC32C runs over its pieces in turn. So every byte
/// is copied once and every block read once, in one system call.
pub(super) fn read_checked(
    blocks: &CheckedBlocks<'_>,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), BlockReadFailure> {
    let range = offset..offset + buf.len() as u64;
    assert!(range.end <= blocks.data_len, "read past the part's end");
    let touched = spans_touched(&range, blocks.block_len);
    if touched.is_empty() {
        return Ok(());
    }
    assert!(
        touched.end as usize <= blocks.block_crc32c.len(),
        "read of a block not yet written"
    );
    let block_range = |block: u64| span(block, blocks.block_len, blocks.data_len);
    let whole = block_range(touched.start).start..block_range(touched.end - 1).end;
    let head_len = (range.start - whole.start) as usize;
    SCRATCH.with_borrow_mut(|scratch| {
        let edges = head_len + (whole.end - range.end) as usize;
        if scratch.len() < edges {
            scratch.resize(edges, 0);
        }
        let (head, tail) = scratch[..edges].split_at_mut(head_len);
        read_exact_vectored_at(
            blocks.file,
            &mut [
                IoSliceMut::new(head),
                IoSliceMut::new(buf),
                IoSliceMut::new(tail),
            ],
            blocks.data_offset + whole.start,
        )?;
        let pieces = [
            (whole.start, &head[..]),
            (range.start, &buf[..]),
            (range.end, &tail[..]),
        ];
        for block in touched {
            if crc32c_of(&pieces, &block_range(block)) != blocks.block_crc32c[block as usize] {
                return Err(BlockReadFailure::BadBlock(block));
            }
        }
        Ok(())
    })
}

/// The CRC32C of bytes `bytes`, held by `pieces` (each: where it starts, its bytes),
/// which together cover them.
fn crc32c_of(pieces: &[(u64, &[u8])], bytes: &Range<u64>) -> u32 {
    pieces.iter().fold(0, |crc, &(start, piece)| {
        let end = start + piece.len() as u64;
        let from = bytes.start.max(start);
        let to = bytes.end.min(end);
        if from >= to {
            return crc;
        }
        crc32c::crc32c_append(crc, &piece[(from - start) as usize..(to - start) as usize])
    })
}

/// Fills `bufs` in order from `offset` of `file`, as `read_exact_at` fills one buffer.
fn read_exact_vectored_at(
    file: &File,
    mut bufs: &mut [IoSliceMut<'_>],
    mut offset: u64,
) -> io::Result<()> {
    IoSliceMut::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match rustix::io::preadv(file, bufs, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the part file ended before the blocks read",
                ))
            }
            Ok(n) => {
                IoSliceMut::advance_slices(&mut bufs, n);
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(error) => return Err(error.into()),
        }
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
            .file(&file.file, |path| private_file().read(true).open(path))
            .map_err(|error| self.unreadable(error))?;
        let blocks = CheckedBlocks {
            file: &handle,
            data_offset: file.data_offset,
            data_len: file.data_len,
            block_len: file.block_len as u64,
            block_crc32c: &file.block_crc32c,
        };
        let result = read_checked(&blocks, buf, offset);
        if result.is_ok() && self.cache.advises_whole_parts.load(Ordering::Relaxed) {
            self.advise_whole_part(&handle);
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

    /// Asks the kernel to bring the whole part into the page cache, at most once per
    /// [`ADVISE_AGAIN_AFTER`]. Advice only: a failure changes nothing but speed.
    fn advise_whole_part(&self, handle: &File) {
        let now = self.cache.opened.elapsed().as_millis() as u64 + 1;
        let last = self.file.advised_at_ms.load(Ordering::Relaxed);
        // Another reader may have advised on a later reading of the clock than ours.
        if last != 0 && now.saturating_sub(last) < ADVISE_AGAIN_AFTER.as_millis() as u64 {
            return;
        }
        if self
            .file
            .advised_at_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let len = std::num::NonZeroU64::new(self.file.data_len);
            let _ = rustix::fs::fadvise(
                handle,
                self.file.data_offset,
                len,
                rustix::fs::Advice::WillNeed,
            );
        }
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
        let mut inner = self.cache.inner.lock();
        // A part dropped as corrupt took its pins with it.
        let current = inner
            .files
            .get(&self.key)
            .is_some_and(|(file, _)| Arc::ptr_eq(file, &self.file));
        if current {
            inner.policy.unpin(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    /// A file of `header` bytes, then `data`, and the CRC32C of each block of `data`.
    fn part_file(header: usize, data: &[u8], block_len: usize) -> (File, Vec<u32>) {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![0xA5; header]).unwrap();
        file.write_all(data).unwrap();
        let crcs = data.chunks(block_len).map(crc32c::crc32c).collect();
        (file, crcs)
    }

    fn read(
        file: &File,
        header: usize,
        len: usize,
        block_len: usize,
        crcs: &[u32],
        range: Range<usize>,
    ) -> Result<Vec<u8>, u64> {
        let blocks = CheckedBlocks {
            file,
            data_offset: header as u64,
            data_len: len as u64,
            block_len: block_len as u64,
            block_crc32c: crcs,
        };
        let mut buf = vec![0xEE; range.len()];
        match read_checked(&blocks, &mut buf, range.start as u64) {
            Ok(()) => Ok(buf),
            Err(BlockReadFailure::BadBlock(block)) => Err(block),
            Err(BlockReadFailure::Io(error)) => panic!("{error}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any range of a part reads its bytes; a byte changed on disk fails the read
        /// with its block if the range touches that block, and changes nothing if not.
        #[test]
        fn a_read_gives_its_bytes_and_fails_on_a_changed_block_it_touches(
            header in 0usize..5000,
            len in 1usize..20_000,
            block_len in 1usize..5000,
            start_frac in 0.0f64..1.0,
            read_len in 0usize..20_000,
            changed_frac in proptest::option::of(0.0f64..1.0),
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let (file, crcs) = part_file(header, &data, block_len);
            let start = ((len - 1) as f64 * start_frac) as usize;
            let range = start..(start + read_len).min(len);
            let changed = changed_frac.map(|f| ((len - 1) as f64 * f) as usize);
            if let Some(at) = changed {
                use std::os::unix::fs::FileExt;
                file.write_all_at(&[data[at] ^ 1], (header + at) as u64).unwrap();
            }
            let got = read(&file, header, len, block_len, &crcs, range.clone());
            let touched = spans_touched(&(range.start as u64..range.end as u64), block_len as u64);
            match changed.map(|at| (at / block_len) as u64) {
                Some(block) if touched.contains(&block) => prop_assert_eq!(got, Err(block)),
                _ => prop_assert_eq!(got, Ok(data[range].to_vec())),
            }
        }
    }
}
