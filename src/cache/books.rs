//! The cache's books, all kept under its one lock: the policy's accounts of resident
//! parts, reservations, pins and units ([`Policy`]), the file that holds each resident
//! part ([`ResidentFile`]), and the earlier mount's files not yet claimed
//! ([`Strays`]).
//!
//! The books touch no disk. What they stop counting, a caller deletes before it lets
//! the lock go (their methods hand back the names of those files), so that no insert
//! writes into room still taken on disk.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::open_files::PartFile;
use super::policy::Policy;
use super::strays::Strays;
use crate::parts::PartKey;

/// A resident part's file and what a checked read of it needs.
#[derive(Debug)]
pub(super) struct ResidentFile {
    /// Open while the bound on open part files allows ([`super::open_files`]).
    pub(super) file: Arc<PartFile>,
    /// Where the data starts in the file: the header's length.
    pub(super) data_offset: u64,
    pub(super) data_len: u64,
    pub(super) block_len: u32,
    pub(super) block_crc32c: Box<[u32]>,
    /// When the kernel was last told the whole part will be read
    /// ([`super::read_advice`]), in milliseconds since the cache opened; 0: never.
    pub(super) advised_at_ms: AtomicU64,
}

pub(super) struct Books {
    pub(super) policy: Policy,
    /// Each resident part's file, and its name in the parts directory.
    pub(super) files: HashMap<PartKey, (Arc<ResidentFile>, String)>,
    pub(super) strays: Strays,
}

impl Books {
    pub(super) fn new(policy: Policy, strays: Strays) -> Books {
        Books {
            policy,
            files: HashMap::new(),
            strays,
        }
    }

    /// Forgets the files of parts the policy evicted; their names, to be deleted.
    pub(super) fn forget(&mut self, victims: Vec<PartKey>) -> Vec<String> {
        victims
            .into_iter()
            .filter_map(|key| self.files.remove(&key).map(|(_, name)| name))
            .collect()
    }

    /// Forgets `key` if `file` is still its file (an earlier read may have dropped it,
    /// and the part been fetched again into a new one); the file's name, to be deleted.
    pub(super) fn forget_if_current(
        &mut self,
        key: PartKey,
        file: &Arc<ResidentFile>,
    ) -> Option<String> {
        if !self.is_current(key, file) {
            return None;
        }
        let (_, name) = self.files.remove(&key).expect("present");
        self.policy.discard(key);
        Some(name)
    }

    /// Whether `file` is still `key`'s resident file.
    pub(super) fn is_current(&self, key: PartKey, file: &Arc<ResidentFile>) -> bool {
        self.files
            .get(&key)
            .is_some_and(|(resident, _)| Arc::ptr_eq(resident, file))
    }

    /// Forgets the oldest strays until `bytes` more fit the policy's budget (or none is
    /// left), handing their room to the policy: an earlier mount's parts that nothing
    /// claimed are the least recently used. Their names, to be deleted.
    pub(super) fn room_from_strays(&mut self, bytes: u64) -> Vec<String> {
        let mut freed_files = Vec::new();
        while self.policy.used_bytes() + self.policy.reserved_bytes() + bytes
            > self.policy.budget_bytes()
        {
            let Some((file, freed)) = self.strays.oldest() else {
                break;
            };
            freed_files.push(file);
            self.give_room(freed);
        }
        freed_files
    }

    /// Raises the policy's budget by the bytes of a stray it now accounts for, adopted
    /// or deleted.
    pub(super) fn give_room(&mut self, bytes: u64) {
        let budget = self.policy.budget_bytes() + bytes;
        self.policy.set_budget_bytes(budget);
    }
}
