//! An earlier daemon's part files not yet claimed (the strays), as the books keep
//! them: counted against the budget at once from their names, found by part id for a
//! read that claims its own ([`super::adoption`] judges and claims them), and deleted
//! oldest first when a download needs their room.

use std::collections::{HashMap, VecDeque};
use std::io;

use super::adopt::{ListedObject, PartFileName};
use super::directory::{Found, HeldDir};
use super::part_file::PartHeader;

/// Part files of an earlier daemon that no listed object has claimed yet. Their bytes
/// (what their names declare) are outside the policy's budget (which is the cache's
/// budget less theirs); they are deleted oldest first when a download needs their room.
#[derive(Default)]
pub(super) struct Strays {
    /// Their files' names in the parts directory, oldest first; an entry no longer in
    /// `names` was claimed or removed.
    pub(super) order: VecDeque<String>,
    pub(super) names: HashMap<String, PartFileName>,
    pub(super) total_bytes: u64,
    /// The newest stray of each part id ([`super::adopt::part_id`]), while headers are
    /// still being read, so that a read can claim its part's file itself.
    pub(super) by_part: HashMap<u64, String>,
    /// Strays whose header has been read, by object key.
    pub(super) by_key: HashMap<String, Vec<ReadStray>>,
    /// Objects listed while headers are still being read, so a stray read later
    /// finds its object; emptied once every header is read.
    pub(super) listed: HashMap<String, (ListedObject, u64)>,
    pub(super) headers_read: bool,
}

/// A stray whose header has been read.
pub(super) struct ReadStray {
    pub(super) file: String,
    pub(super) header: PartHeader,
    pub(super) header_len: u64,
}

impl Strays {
    /// The part files a scan `found` in `parts`, oldest first, counted at the lengths
    /// their names declare; the oldest beyond `budget_bytes` deleted (how many: the
    /// second value).
    pub(super) fn found(
        found: Vec<Found>,
        parts: &HeldDir,
        budget_bytes: u64,
    ) -> io::Result<(Strays, u64)> {
        let mut strays = Strays::default();
        for found in found {
            strays.total_bytes += found.name.len;
            strays.names.insert(found.file.clone(), found.name);
            // Oldest first: a part's newest file wins.
            strays.by_part.insert(found.name.part, found.file.clone());
            strays.order.push_back(found.file);
        }
        let mut over_budget = 0;
        while strays.total_bytes > budget_bytes {
            let (file, _) = strays.oldest().expect("bytes over budget are in files");
            parts.remove(&file)?;
            over_budget += 1;
        }
        strays.headers_read = strays.names.is_empty();
        Ok((strays, over_budget))
    }

    /// Forgets a stray (claimed or to be deleted); its bytes, if it was still known.
    pub(super) fn take(&mut self, file: &str) -> Option<u64> {
        let bytes = self.names.remove(file)?.len;
        self.total_bytes -= bytes;
        Some(bytes)
    }

    pub(super) fn contains(&self, file: &str) -> bool {
        self.names.contains_key(file)
    }

    pub(super) fn oldest(&mut self) -> Option<(String, u64)> {
        while let Some(file) = self.order.pop_front() {
            if let Some(bytes) = self.take(&file) {
                return Some((file, bytes));
            }
        }
        None
    }
}
