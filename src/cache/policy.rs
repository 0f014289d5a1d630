//! The cache's bookkeeping, without any I/O: which parts are resident, how many bytes
//! they and the downloads in flight take, which are pinned, and which unit to evict next.
//!
//! The policy unit is either a *group* of parts that live and die together (an SCDL
//! chunk: the parts of its three arrays) or a lone part. Units are kept in LRU order;
//! eviction takes the least recently used unit that has no pinned part, unless an
//! [`EvictionAdvisor`] ranks units (groups, or lone parts such as a monolithic dataset's)
//! first. Two budgets bound the cache: bytes (always)
//! and resident groups (optional, the loader's old `max_cached_chunks`). The invariant
//! `used + reserved <= budget` holds after every operation, which is what keeps the
//! cache directory within its budget: a download reserves its bytes before it writes.

use std::collections::HashMap;
use std::hash::Hash;

use lru::LruCache;

use crate::parts::{GroupId, ObjectId, PartKey};

/// What the LRU orders and eviction removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Group(GroupId),
    Part(PartKey),
}

impl Unit {
    pub fn of(key: PartKey, group: Option<GroupId>) -> Unit {
        group.map_or(Unit::Part(key), Unit::Group)
    }
}

/// Lets a planner that knows the future order rank eviction candidates.
pub trait EvictionAdvisor: Send + Sync {
    /// How soon a unit is needed again: `None` if no plan needs it; otherwise larger
    /// means later. Units nobody needs go first (groups, then lone parts, each in LRU
    /// order), then those needed furthest ahead.
    fn next_use(&self, unit: Unit) -> Option<NextUse>;
    /// Whether the plans rank any unit now: a unit [`EvictionAdvisor::next_use`] leaves
    /// unranked is then one no plan reads within its announced steps, not one of a
    /// mount nobody plans on.
    fn ranks_any(&self) -> bool;
    /// Of a unit the plans rank, the one object whose parts they read from the cache,
    /// if they read no other (`None`: any of its parts). A chunk whose rows a plan
    /// fetches exactly is read from the cache for its row offsets alone: its other
    /// parts, left by an earlier order, go as a unit no plan needs would.
    fn reads_only(&self, _unit: Unit) -> Option<ObjectId> {
        None
    }
}

/// What a reservation makes room for, which decides what it may evict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A reader waits for the part: any unit that is not pinned or being read may go.
    Demand,
    /// Read-ahead: units no plan needs again this epoch ([`NextUse::Done`], or no rank
    /// at all); and, for a part the plans need within [`NEAR_STEPS`], also the step
    /// just left and the units they need after it. Evicting a unit needed sooner than the one fetched costs a
    /// download without saving one: the prefetched part waits in the cache while the
    /// evicted one is fetched again before it is read. And a part needed further ahead
    /// waits for the room the steps being read free: evicting for it now gives up a
    /// unit a later eviction could have spared, since by the time the part is read
    /// the plans will have finished units that could have made its room.
    Prefetch,
}

/// How many steps ahead a prefetched part may be needed and still evict what the plans
/// need after it: the next step must be arriving while the current one is read, or
/// the reader waits on the link.
pub const NEAR_STEPS: u64 = 1;

/// Whether pinning a part counts as a use of it for the least-recently-used order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recency {
    /// A reader's read: the part's unit becomes the most recently used.
    Use,
    /// Bytes no reader has asked for yet (the read-around): the order stays.
    Keep,
}

/// A unit's rank in the planners' view of the future.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NextUse {
    /// Needed now, by the step being read: never evicted. The prefetcher gives it to at
    /// most a share of the budget per user (`prefetch::Prefetcher::rank_plans`).
    Current,
    /// Read by the step just left, whose last rows a reader may still have in hand
    /// when the position moves on. Kept from everything but the room the step being
    /// read and the next one need, which it gives before any unit the plans read later:
    /// with steps as large as half the cache, the step just left and the current one
    /// fill it, and protecting both left the current step's own parts no room (each
    /// downloaded into memory, dropped and downloaded again) and the next step none.
    JustLeft,
    /// Needed this many steps ahead.
    Ahead(u64),
    /// Read this epoch by a plan that reads each row once an epoch, and not needed by
    /// any plan's announced steps: needed again in the next epoch at the soonest, after
    /// everything the plans have not read yet. Evicted first.
    Done,
}

#[derive(Debug)]
struct PartState {
    bytes: u64,
    unit: Unit,
}

#[derive(Debug, Default)]
struct UnitState {
    parts: Vec<PartKey>,
    bytes: u64,
    pins: u32,
}

/// Bytes held for a download that has not landed yet.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation must be committed or cancelled"]
pub struct Reservation {
    bytes: u64,
    /// The group the part joins.
    group: Option<GroupId>,
}

/// What one eviction removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    /// The unit, or as many of its last parts as the room needs.
    Unit(Unit),
    /// The parts of a ranked unit that no plan reads from the cache
    /// ([`EvictionAdvisor::reads_only`]).
    Spare(Unit, ObjectId),
}

/// What one reservation may evict: not the unit it is for, and what its admission
/// allows.
struct EvictionScope<'a> {
    keep: Unit,
    advisor: Option<&'a dyn EvictionAdvisor>,
    /// Units a plan needs this many steps ahead or later may go (`None`: none of them).
    planned_from: Option<u64>,
}

impl<'a> EvictionScope<'a> {
    fn new(keep: Unit, advisor: Option<&'a dyn EvictionAdvisor>, admission: Admission) -> Self {
        let planned_from = match admission {
            Admission::Demand => Some(0),
            Admission::Prefetch => match advisor.and_then(|a| a.next_use(keep)) {
                Some(NextUse::Current | NextUse::JustLeft) => Some(1),
                Some(NextUse::Ahead(steps)) if steps <= NEAR_STEPS => Some(steps + 1),
                Some(NextUse::Ahead(_) | NextUse::Done) | None => None,
            },
        };
        EvictionScope {
            keep,
            advisor,
            planned_from,
        }
    }
}

#[derive(Debug)]
pub struct Policy {
    budget_bytes: u64,
    max_groups: Option<usize>,
    used_bytes: u64,
    reserved_bytes: u64,
    parts: HashMap<PartKey, PartState>,
    units: LruCache<Unit, UnitState>,
    groups_resident: usize,
    /// Groups with downloads on their way in, and how many. They are not evicted
    /// meanwhile, and those not resident yet hold a group slot.
    incoming_groups: HashMap<GroupId, u32>,
    pins: HashMap<PartKey, u32>,
    /// Moves whenever a part joins or leaves the books: what was derived from them at
    /// one generation (an announcement of the chunks held) holds until it moves.
    generation: u64,
}

impl Policy {
    pub fn new(budget_bytes: u64, max_groups: Option<usize>) -> Policy {
        Policy {
            budget_bytes,
            max_groups,
            used_bytes: 0,
            reserved_bytes: 0,
            parts: HashMap::new(),
            units: LruCache::unbounded(),
            groups_resident: 0,
            incoming_groups: HashMap::new(),
            pins: HashMap::new(),
            generation: 0,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    pub fn max_groups(&self) -> Option<usize> {
        self.max_groups
    }

    pub fn resident_parts(&self) -> usize {
        self.parts.len()
    }

    pub fn resident_groups(&self) -> usize {
        self.groups_resident
    }

    pub fn contains(&self, key: PartKey) -> bool {
        self.parts.contains_key(&key)
    }

    /// Pins a resident part; `false` if it is not resident. `Recency::Use` marks its
    /// unit used, `Recency::Keep` leaves the unit's place in the order as it is.
    pub fn pin(&mut self, key: PartKey, recency: Recency) -> bool {
        let Some(state) = self.parts.get(&key) else {
            return false;
        };
        let unit = match recency {
            Recency::Use => self.units.get_mut(&state.unit),
            Recency::Keep => self.units.peek_mut(&state.unit),
        };
        if let Some(unit) = unit {
            unit.pins += 1;
        }
        *self.pins.entry(key).or_default() += 1;
        true
    }

    pub fn unpin(&mut self, key: PartKey) {
        let Some(count) = self.pins.get_mut(&key) else {
            debug_assert!(false, "unpin of unpinned {key:?}");
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.pins.remove(&key);
        }
        if let Some(state) = self.parts.get(&key) {
            if let Some(unit) = self.units.peek_mut(&state.unit) {
                unit.pins -= 1;
            }
        }
    }

    /// Whether [`Policy::reserve`] would find room for `bytes` of `unit` now.
    pub fn has_room(
        &self,
        bytes: u64,
        unit: Unit,
        advisor: Option<&dyn EvictionAdvisor>,
        admission: Admission,
    ) -> bool {
        self.groups_to_evict(bytes, &EvictionScope::new(unit, advisor, admission))
            .is_some()
    }

    /// How many groups must go before `bytes` of the room's unit fit in both budgets,
    /// if what the room may evict makes enough room. The units are counted only when
    /// something must go: a prefetcher asks for every part of its steps.
    fn groups_to_evict(&self, bytes: u64, room: &EvictionScope) -> Option<usize> {
        let (bytes_to_free, groups_to_evict) = self.shortfall(bytes, room.keep);
        let fits = (bytes_to_free == 0 || self.evictable_bytes_reach(room, bytes_to_free))
            && (groups_to_evict == 0 || self.evictable_groups_reach(room, groups_to_evict));
        fits.then_some(groups_to_evict)
    }

    /// The bytes to free and the groups to evict before `bytes` of `unit` fit in both
    /// budgets (a part of a group not yet resident needs a group slot too).
    fn shortfall(&self, bytes: u64, unit: Unit) -> (u64, usize) {
        let needs_slot = matches!(unit, Unit::Group(g)
            if !self.units.contains(&unit) && !self.incoming_groups.contains_key(&g));
        let groups_to_evict = match self.max_groups {
            Some(max) if needs_slot => (self.groups_held() + 1).saturating_sub(max),
            _ => 0,
        };
        let bytes_to_free =
            (self.used_bytes + self.reserved_bytes + bytes).saturating_sub(self.budget_bytes);
        (bytes_to_free, groups_to_evict)
    }

    /// Reserves `bytes` for a download into `unit`, evicting other units as needed to
    /// stay within both budgets, only those `admission` may. Returns the reservation,
    /// if there is room, and the parts evicted, whose files the caller must delete
    /// (before writing the new one). When pinned or protected data leaves no room
    /// nothing is evicted, unless the advice changed while victims were being chosen.
    pub fn reserve(
        &mut self,
        bytes: u64,
        unit: Unit,
        advisor: Option<&dyn EvictionAdvisor>,
        admission: Admission,
    ) -> (Option<Reservation>, Vec<PartKey>) {
        let group = match unit {
            Unit::Group(group) => Some(group),
            Unit::Part(_) => None,
        };
        let room = EvictionScope::new(unit, advisor, admission);
        let Some(groups_to_evict) = self.groups_to_evict(bytes, &room) else {
            return (None, Vec::new());
        };
        // The advice may change between the count above and the choices below (plans
        // move as reads are served): then stop, keeping what was already evicted.
        let mut victims = Vec::new();
        for _ in 0..groups_to_evict {
            match self.choose_victim(&room, true) {
                Some(Victim::Unit(unit)) => victims.extend(self.evict(unit)),
                Some(Victim::Spare(..)) => unreachable!("spare parts free no group's slot"),
                None => return (None, victims),
            }
        }
        loop {
            let to_free =
                (self.used_bytes + self.reserved_bytes + bytes).saturating_sub(self.budget_bytes);
            if to_free == 0 {
                break;
            }
            match self.choose_victim(&room, false) {
                Some(Victim::Unit(unit)) => victims.extend(self.evict_at_least(unit, to_free)),
                Some(Victim::Spare(unit, read)) => {
                    victims.extend(self.evict_last_parts(unit, to_free, Some(read)))
                }
                None => return (None, victims),
            }
        }
        self.reserved_bytes += bytes;
        if let Some(group) = group {
            *self.incoming_groups.entry(group).or_default() += 1;
        }
        (Some(Reservation { bytes, group }), victims)
    }

    /// Groups resident or on their way in: what the group budget bounds.
    fn groups_held(&self) -> usize {
        let incoming_only = self
            .incoming_groups
            .keys()
            .filter(|g| !self.units.contains(&Unit::Group(**g)))
            .count();
        self.groups_resident + incoming_only
    }

    // Both count from the least recently used end and stop once they have enough: each
    // unit asks the plans' advice, and with 22,000 parts of row offsets cached (10^8
    // rows, eight ranks of random rows) counting them all at every download was most of
    // the daemon's time.
    fn evictable_groups_reach(&self, room: &EvictionScope, groups: usize) -> bool {
        self.units
            .iter()
            .rev()
            .filter(|(unit, state)| {
                matches!(unit, Unit::Group(_)) && self.evictable(**unit, state, room)
            })
            .nth(groups - 1)
            .is_some()
    }

    fn evictable_bytes_reach(&self, room: &EvictionScope, bytes: u64) -> bool {
        let mut evictable = 0;
        self.units.iter().rev().any(|(unit, state)| {
            let next_use = room.advisor.and_then(|a| a.next_use(*unit));
            evictable += if self.evictable_given(*unit, state, room, next_use) {
                state.bytes
            } else {
                self.spare_parts(*unit, state, room, next_use)
                    .map_or(0, |(_, parts)| parts.map(|(_, bytes)| bytes).sum())
            };
            evictable >= bytes
        })
    }

    /// The parts of a unit the plans rank that they read not from the cache
    /// ([`EvictionAdvisor::reads_only`]), unpinned, with their bytes, and the object the
    /// plans do read. With random rows over 10^4 chunks, the steps being read rank most
    /// chunks of the dataset, so the steps being read may give them up too.
    fn spare_parts<'s>(
        &'s self,
        unit: Unit,
        state: &'s UnitState,
        room: &EvictionScope,
        next_use: Option<NextUse>,
    ) -> Option<(ObjectId, impl Iterator<Item = (PartKey, u64)> + 's)> {
        if unit == room.keep || next_use.is_none() {
            return None;
        }
        let read = room.advisor?.reads_only(unit)?;
        let parts = state
            .parts
            .iter()
            .filter(move |key| key.object != read && !self.pins.contains_key(key))
            .filter_map(|key| Some((*key, self.parts.get(key)?.bytes)));
        Some((read, parts))
    }

    fn evictable(&self, unit: Unit, state: &UnitState, room: &EvictionScope) -> bool {
        let next_use = room.advisor.and_then(|a| a.next_use(unit));
        self.evictable_given(unit, state, room, next_use)
    }

    /// [`Self::evictable`] with the advice on the unit already asked.
    fn evictable_given(
        &self,
        unit: Unit,
        state: &UnitState,
        room: &EvictionScope,
        next_use: Option<NextUse>,
    ) -> bool {
        let incoming =
            matches!(unit, Unit::Group(group) if self.incoming_groups.contains_key(&group));
        let needed = match next_use {
            Some(NextUse::Current) => true,
            Some(NextUse::JustLeft) => room.planned_from.is_none(),
            Some(NextUse::Ahead(steps)) => room.planned_from.is_none_or(|from| steps < from),
            Some(NextUse::Done) | None => false,
        };
        unit != room.keep && state.pins == 0 && !incoming && !needed
    }

    pub fn cancel(&mut self, reservation: Reservation) {
        self.reserved_bytes -= reservation.bytes;
        self.settle_incoming(reservation.group);
    }

    fn settle_incoming(&mut self, group: Option<GroupId>) {
        if let Some(group) = group {
            if let Some(count) = self.incoming_groups.get_mut(&group) {
                *count -= 1;
                if *count == 0 {
                    self.incoming_groups.remove(&group);
                }
            }
        }
    }

    /// Turns a reservation into a resident part; `false` if the part was resident
    /// already (the caller then discards its copy).
    pub fn commit(
        &mut self,
        reservation: Reservation,
        key: PartKey,
        group: Option<GroupId>,
    ) -> bool {
        self.reserved_bytes -= reservation.bytes;
        self.settle_incoming(reservation.group);
        let unit = Unit::of(key, group);
        if self.parts.contains_key(&key) {
            return false;
        }
        self.used_bytes += reservation.bytes;
        self.generation += 1;
        self.parts.insert(
            key,
            PartState {
                bytes: reservation.bytes,
                unit,
            },
        );
        if !self.units.contains(&unit) && matches!(unit, Unit::Group(_)) {
            self.groups_resident += 1;
        }
        let state = self.units.get_or_insert_mut(unit, UnitState::default);
        state.parts.push(key);
        state.bytes += reservation.bytes;
        true
    }

    /// Books a part whose file is on disk already (an earlier mount's, claimed by its
    /// object) as the least recently used unit, if it is new: nothing says it will be
    /// read soon. `false` if it does not fit the budgets as they are (nothing is
    /// evicted for it) or is resident already.
    pub fn adopt(&mut self, key: PartKey, group: Option<GroupId>, bytes: u64) -> bool {
        let unit = Unit::of(key, group);
        let new_unit = !self.units.contains(&unit);
        let needs_slot = matches!(unit, Unit::Group(g)
            if new_unit && !self.incoming_groups.contains_key(&g));
        if self.parts.contains_key(&key)
            || self.used_bytes + self.reserved_bytes + bytes > self.budget_bytes
            || needs_slot && self.max_groups.is_some_and(|max| self.groups_held() >= max)
        {
            return false;
        }
        self.used_bytes += bytes;
        self.generation += 1;
        self.parts.insert(key, PartState { bytes, unit });
        if new_unit && matches!(unit, Unit::Group(_)) {
            self.groups_resident += 1;
        }
        if new_unit {
            self.units.put(unit, UnitState::default());
            self.units.demote(&unit);
        }
        // Peeked: joining a unit is no use of it.
        let state = self.units.peek_mut(&unit).expect("put above if new");
        state.parts.push(key);
        state.bytes += bytes;
        true
    }

    /// Moves the byte budget; the caller keeps `used + reserved` within it (bytes
    /// handed over from or to files the books do not hold).
    pub fn set_budget_bytes(&mut self, budget_bytes: u64) {
        debug_assert!(self.used_bytes + self.reserved_bytes <= budget_bytes);
        self.budget_bytes = budget_bytes;
    }

    /// Removes one part from the books (its unit stays, with the other parts), pinned
    /// or not: for a part whose bytes turned out to be bad. Its pins are forgotten: the
    /// holders must not unpin it (the key may be resident again by then, a new copy).
    pub fn discard(&mut self, key: PartKey) {
        let Some(part) = self.parts.remove(&key) else {
            return;
        };
        self.used_bytes -= part.bytes;
        self.generation += 1;
        let pins = self.pins.remove(&key).unwrap_or(0);
        let Some(unit) = self.units.peek_mut(&part.unit) else {
            return;
        };
        unit.parts.retain(|k| *k != key);
        unit.bytes -= part.bytes;
        unit.pins -= pins;
        if unit.parts.is_empty() {
            self.units.pop(&part.unit);
            if matches!(part.unit, Unit::Group(_)) {
                self.groups_resident -= 1;
            }
        }
    }

    /// Removes parts of `unit` holding at least `bytes` from the books, returning them:
    /// a group larger than that keeps the rest, losing its last parts first. Evicted
    /// whole, a chunk of 180 MB went for one part's room, and the next epoch fetched
    /// it all again where it needed a part.
    fn evict_at_least(&mut self, unit: Unit, bytes: u64) -> Vec<PartKey> {
        match self.units.peek(&unit) {
            Some(state) if state.bytes <= bytes => self.evict(unit),
            Some(_) => self.evict_last_parts(unit, bytes, None),
            None => Vec::new(),
        }
    }

    /// Removes the unpinned parts of `unit` not of object `kept` (if any), last parts
    /// first, until they hold at least `bytes` or none is left; returns them. The unit
    /// goes from the books with its last part.
    fn evict_last_parts(&mut self, unit: Unit, bytes: u64, kept: Option<ObjectId>) -> Vec<PartKey> {
        let Some(state) = self.units.peek_mut(&unit) else {
            return Vec::new();
        };
        let (mut freed, mut evicted) = (0, Vec::new());
        for index in (0..state.parts.len()).rev() {
            if freed >= bytes {
                break;
            }
            let key = state.parts[index];
            if Some(key.object) == kept || self.pins.contains_key(&key) {
                continue;
            }
            state.parts.remove(index);
            if let Some(part) = self.parts.remove(&key) {
                state.bytes -= part.bytes;
                self.used_bytes -= part.bytes;
                self.generation += 1;
                freed += part.bytes;
            }
            evicted.push(key);
        }
        if state.parts.is_empty() {
            self.units.pop(&unit);
            if matches!(unit, Unit::Group(_)) {
                self.groups_resident -= 1;
            }
        }
        evicted
    }

    /// Removes `unit` and all its parts from the books, returning the parts.
    fn evict(&mut self, unit: Unit) -> Vec<PartKey> {
        let Some(state) = self.units.pop(&unit) else {
            return Vec::new();
        };
        if matches!(unit, Unit::Group(_)) {
            self.groups_resident -= 1;
        }
        for key in &state.parts {
            if let Some(part) = self.parts.remove(key) {
                self.used_bytes -= part.bytes;
                self.generation += 1;
            }
        }
        state.parts
    }

    fn choose_victim(&self, room: &EvictionScope, groups_only: bool) -> Option<Victim> {
        // Least recently used first; `iter` runs from most to least recent. The advice
        // on each unit is asked once.
        let candidates = self
            .units
            .iter()
            .rev()
            .filter(|(unit, _)| !groups_only || matches!(unit, Unit::Group(_)))
            .filter_map(|(unit, state)| {
                let next_use = room.advisor.and_then(|a| a.next_use(*unit));
                if self.evictable_given(*unit, state, room, next_use) {
                    return Some((Victim::Unit(*unit), next_use));
                }
                if groups_only {
                    return None;
                }
                let (read, mut spare) = self.spare_parts(*unit, state, room, next_use)?;
                spare.next()?;
                Some((Victim::Spare(*unit, read), None))
            });
        if room.advisor.is_none() {
            return candidates.map(|(victim, _)| victim).next();
        }
        // What the plans are done with this epoch, in LRU order; then groups (or the
        // parts of groups) no plan reads, in LRU order; then lone parts no plan needs,
        // in LRU order; then the step just left, in LRU order; then the units needed
        // furthest ahead. The first unit done with, in LRU order, is the choice:
        // nothing after it comes before it.
        let mut best: Option<((u64, u64), Victim)> = None;
        for (position, (victim, next_use)) in candidates.enumerate() {
            let key = match (next_use, victim) {
                (Some(NextUse::Done), _) => return Some(victim),
                (Some(NextUse::JustLeft), _) => (3, position as u64),
                (Some(NextUse::Ahead(steps)), _) => (4, u64::MAX - steps),
                (_, Victim::Unit(Unit::Group(_)) | Victim::Spare(..)) => (1, position as u64),
                (_, Victim::Unit(Unit::Part(_))) => (2, position as u64),
            };
            if best.is_none_or(|(best_key, _)| key < best_key) {
                best = Some((key, victim));
            }
        }
        best.map(|(_, victim)| victim)
    }
}

#[cfg(test)]
mod tests;
