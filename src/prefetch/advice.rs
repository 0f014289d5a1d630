//! Eviction advice: the ranks the plans give the cache's units (the step each is next
//! needed at, or done for this epoch), read by the cache when it must evict.

use std::collections::{HashMap, HashSet};

use parking_lot::RwLock;

use crate::cache::{EvictionAdvisor, NextUse, Unit};
use crate::parts::{GroupId, ObjectId};

#[derive(Default)]
pub(super) struct Advice {
    pub(super) ranks: RwLock<HashMap<Unit, NextUse>>,
    /// By plan (its hint handle): the units of the chunks it has finished this epoch
    /// ([`Plan::finished_chunks`](super::plan::Plan::finished_chunks)), which rank [`NextUse::Done`] unless a plan's steps
    /// rank them otherwise.
    pub(super) done: RwLock<HashMap<u64, HashSet<Unit>>>,
    /// The chunks of planned datasets whose rows the plans fetch exactly
    /// ([`super::exact`]): by group, the chunk's row offsets, all the plans read of it
    /// from the cache.
    pub(super) row_offsets_only: RwLock<HashMap<GroupId, ObjectId>>,
    /// Units a plan of windows ranks: it reads them from the cache whole, even where
    /// its dataset's rows are fetched exactly (a `windows` step fetches whole parts).
    pub(super) read_whole: RwLock<HashSet<Unit>>,
}

impl EvictionAdvisor for Advice {
    fn next_use(&self, unit: Unit) -> Option<NextUse> {
        if let Some(rank) = self.ranks.read().get(&unit) {
            return Some(*rank);
        }
        let done = self.done.read();
        done.values()
            .any(|units| units.contains(&unit))
            .then_some(NextUse::Done)
    }

    fn ranks_any(&self) -> bool {
        !self.ranks.read().is_empty()
    }

    fn reads_only(&self, unit: Unit) -> Option<ObjectId> {
        match unit {
            Unit::Group(_) if self.read_whole.read().contains(&unit) => None,
            Unit::Group(group) => self.row_offsets_only.read().get(&group).copied(),
            Unit::Part(_) => None,
        }
    }
}
