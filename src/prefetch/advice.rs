//! Eviction advice: the ranks the plans give the cache's units (the step each is next
//! needed at, or done for this epoch), read by the cache when it must evict.

use std::collections::{HashMap, HashSet};

use parking_lot::RwLock;

use crate::cache::{EvictionAdvisor, NextUse, Unit};

#[derive(Default)]
pub(super) struct Advice {
    pub(super) ranks: RwLock<HashMap<Unit, NextUse>>,
    /// By plan (its hint handle): the units of the chunks it has finished this epoch
    /// ([`Plan::finished_chunks`](super::plan::Plan::finished_chunks)), which rank [`NextUse::Done`] unless a plan's steps
    /// rank them otherwise.
    pub(super) done: RwLock<HashMap<u64, HashSet<Unit>>>,
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
}
