//! What the daemon stores into the kernel's page cache, and what it knows the kernel
//! holds there: the store ([`PageCache`], the mount's FUSE store notification or a
//! test's record), the pages the kernel was given ([`Given`], [`GivenPages`]), and
//! stores cut into slices of [`PUSH_SLICE`]. Both pushers use it: the read-around's
//! windows around cached reads ([`super::read_around`]) and a plan's exact rows as they
//! arrive ([`super::planned_pages`]).

use std::collections::BTreeMap;
use std::io;
use std::ops::Range;

use parking_lot::Mutex;

/// Bytes a pusher reads and stores at once: its buffer. A store of 1 MiB costs the
/// kernel one write of the FUSE device, against the 128 KiB reads it saves eight of.
pub const PUSH_SLICE: u64 = 1 << 20;

/// Where pushed bytes go: the mount's page cache in the kernel, or a test's record.
pub trait PageCache: Send + Sync {
    /// Stores `bytes` as the contents of file `ino` from `offset` on.
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> io::Result<()>;
}

/// Pages per block of marks: one block's bits cover 2 MiB of a file of 4 KiB pages.
const BLOCK_PAGES: u64 = 512;

const BLOCK_WORDS: usize = (BLOCK_PAGES / 64) as usize;

/// The most blocks of marks kept, over all files: about 2 MiB of marks, covering
/// 32 GiB of files of 4 KiB pages (random rows over a 1.2 TB atlas mark a block a
/// row, each seldom read again: 8 MiB of marks at four times this bound). Sizes come from listings, which the daemon does not
/// trust, so marks are kept only for the blocks reads touched, and at most these; past
/// them the lowest blocks are forgotten (a sequential reader's oldest). Forgetting is
/// always safe: a forgotten page is pushed again, and the kernel ignores pages it holds.
pub const MAX_MARKED_BLOCKS: usize = 1 << 14;

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
    pub(super) fn is_given(&self, ino: u64, page: u64) -> bool {
        let (word, mask) = bit(page % BLOCK_PAGES);
        self.blocks
            .get(&(ino, page / BLOCK_PAGES))
            .is_some_and(|bits| bits[word] & mask != 0)
    }

    pub(super) fn any_given(&self, ino: u64, pages: Range<u64>) -> bool {
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

    pub(super) fn forget(&mut self, ino: u64, pages: Range<u64>) {
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
    }
}
