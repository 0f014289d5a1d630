use super::*;
use crate::parts::ObjectId;
use proptest::prelude::*;
use std::collections::HashSet;

fn part(object: u64, index: u64) -> PartKey {
    PartKey {
        object: ObjectId(object),
        index,
    }
}

fn fill(policy: &mut Policy, key: PartKey, group: Option<GroupId>, bytes: u64) -> Vec<PartKey> {
    let (reservation, victims) =
        policy.reserve(bytes, Unit::of(key, group), None, Admission::Demand);
    assert!(policy.commit(reservation.expect("room"), key, group));
    victims
}

#[test]
fn evicts_the_least_recently_used_unit() {
    let mut p = Policy::new(300, None);
    fill(&mut p, part(1, 0), None, 100);
    fill(&mut p, part(2, 0), None, 100);
    fill(&mut p, part(3, 0), None, 100);
    assert!(p.pin(part(1, 0), Recency::Use));
    p.unpin(part(1, 0));
    assert_eq!(fill(&mut p, part(4, 0), None, 100), vec![part(2, 0)]);
}

#[test]
fn a_part_pinned_without_use_keeps_its_place_in_the_order() {
    let mut p = Policy::new(300, None);
    fill(&mut p, part(1, 0), None, 100);
    fill(&mut p, part(2, 0), None, 100);
    fill(&mut p, part(3, 0), None, 100);
    assert!(p.pin(part(1, 0), Recency::Keep));
    p.unpin(part(1, 0));
    assert_eq!(fill(&mut p, part(4, 0), None, 100), vec![part(1, 0)]);
}

#[test]
fn adopted_parts_join_their_group_and_are_evicted_first() {
    let mut p = Policy::new(400, Some(2));
    let g = Some(GroupId(7));
    fill(&mut p, part(1, 0), None, 100);
    assert!(p.adopt(part(2, 0), g, 100));
    assert!(p.adopt(part(2, 1), g, 100));
    assert!(!p.adopt(part(2, 1), g, 100), "resident already");
    assert!(
        !p.adopt(part(3, 0), Some(GroupId(8)), 200),
        "over the byte budget"
    );
    assert!(p.adopt(part(4, 0), Some(GroupId(9)), 50));
    assert!(
        !p.adopt(part(5, 0), Some(GroupId(10)), 50),
        "over the group budget"
    );
    assert_eq!((p.used_bytes(), p.resident_groups()), (350, 2));
    // The unit used in this mount outlives the adopted ones, which were demoted.
    let mut victims = fill(&mut p, part(6, 0), None, 250);
    victims.sort();
    assert_eq!(victims, vec![part(2, 0), part(2, 1), part(4, 0)]);
}

#[test]
fn a_group_is_evicted_whole_when_the_room_needs_all_of_it() {
    let mut p = Policy::new(400, None);
    let g = Some(GroupId(7));
    fill(&mut p, part(1, 0), g, 100);
    fill(&mut p, part(2, 0), g, 100);
    fill(&mut p, part(3, 0), None, 100);
    let mut victims = fill(&mut p, part(4, 0), None, 300);
    victims.sort();
    assert_eq!(victims, vec![part(1, 0), part(2, 0)]);
    assert_eq!((p.used_bytes(), p.resident_groups()), (400, 0));
}

#[test]
fn a_group_larger_than_the_room_needed_gives_its_last_parts_and_keeps_the_rest() {
    let mut p = Policy::new(400, None);
    let g = Some(GroupId(7));
    fill(&mut p, part(1, 0), g, 100);
    fill(&mut p, part(1, 1), g, 100);
    fill(&mut p, part(2, 0), g, 100);
    fill(&mut p, part(3, 0), None, 100);
    assert_eq!(
        fill(&mut p, part(4, 0), None, 150),
        vec![part(2, 0), part(1, 1)]
    );
    assert_eq!((p.used_bytes(), p.resident_groups()), (350, 1));
    assert!(p.contains(part(1, 0)), "the group's first part was evicted");
}

#[test]
fn pinned_parts_are_never_evicted_and_may_leave_no_room() {
    let mut p = Policy::new(200, None);
    fill(&mut p, part(1, 0), None, 100);
    fill(&mut p, part(2, 0), None, 100);
    assert!(p.pin(part(1, 0), Recency::Use));
    assert!(p.pin(part(2, 0), Recency::Use));
    assert_eq!(
        p.reserve(100, Unit::Part(part(3, 0)), None, Admission::Demand),
        (None, vec![])
    );
    assert_eq!(
        p.resident_parts(),
        2,
        "a refused reservation evicts nothing"
    );
    p.unpin(part(2, 0));
    let (r, victims) = p.reserve(100, Unit::Part(part(3, 0)), None, Admission::Demand);
    assert_eq!(victims, vec![part(2, 0)]);
    p.cancel(r.unwrap());
}

#[test]
fn the_group_budget_counts_groups() {
    let mut p = Policy::new(10_000, Some(2));
    fill(&mut p, part(1, 0), Some(GroupId(1)), 10);
    fill(&mut p, part(2, 0), Some(GroupId(2)), 10);
    fill(&mut p, part(2, 1), Some(GroupId(2)), 10);
    assert_eq!(
        fill(&mut p, part(3, 0), Some(GroupId(3)), 10),
        vec![part(1, 0)]
    );
    assert_eq!(p.resident_groups(), 2);
}

struct Plan(HashMap<Unit, NextUse>);
impl EvictionAdvisor for Plan {
    fn next_use(&self, unit: Unit) -> Option<NextUse> {
        self.0.get(&unit).copied()
    }
    fn ranks_any(&self) -> bool {
        !self.0.is_empty()
    }
}

#[test]
fn the_advisor_orders_eviction_and_protects_the_current_step() {
    let mut p = Policy::new(300, None);
    for g in 1..=3 {
        fill(&mut p, part(g, 0), Some(GroupId(g)), 100);
    }
    let plan = Plan(HashMap::from([
        (Unit::Group(GroupId(1)), NextUse::Current),
        (Unit::Group(GroupId(2)), NextUse::Ahead(1)),
        (Unit::Group(GroupId(3)), NextUse::Ahead(5)),
    ]));
    // New data of the current step (group 1) displaces the plan's later chunks.
    let current = Unit::Group(GroupId(1));
    let (r, victims) = p.reserve(100, current, Some(&plan), Admission::Demand);
    assert_eq!(victims, vec![part(3, 0)], "furthest ahead goes first");
    assert!(p.commit(r.unwrap(), part(1, 1), Some(GroupId(1))));
    let (r, victims) = p.reserve(100, current, Some(&plan), Admission::Demand);
    assert_eq!(victims, vec![part(2, 0)]);
    assert!(p.commit(r.unwrap(), part(1, 2), Some(GroupId(1))));
    assert_eq!(
        p.reserve(100, Unit::Part(part(9, 0)), Some(&plan), Admission::Demand),
        (None, vec![]),
        "the current step's data stays"
    );
}

#[test]
fn what_the_plans_are_done_with_goes_before_what_they_have_not_read() {
    let mut p = Policy::new(300, None);
    for group in 1..=3 {
        fill(&mut p, part(group, 0), Some(GroupId(group)), 100);
    }
    // Least recent first: 1, 2, 3. Group 3 was read this epoch; 1 and 2 were not.
    let plan = Plan(HashMap::from([(Unit::Group(GroupId(3)), NextUse::Done)]));
    let key = part(4, 0);
    let (r, evicted) = p.reserve(100, Unit::Group(GroupId(4)), Some(&plan), Admission::Demand);
    assert!(p.commit(r.expect("room"), key, Some(GroupId(4))));
    assert_eq!(evicted, vec![part(3, 0)], "the most recent, but done with");
}

#[test]
fn a_prefetch_for_the_next_step_evicts_only_what_no_plan_needs_sooner() {
    let mut p = Policy::new(300, None);
    for group in 1..=3 {
        fill(&mut p, part(group, 0), Some(GroupId(group)), 100);
    }
    // Group 3 was read this epoch; the next step reads 4 and 5, then come 7, 1, 2, 6.
    let plan = Plan(HashMap::from([
        (Unit::Group(GroupId(4)), NextUse::Ahead(1)),
        (Unit::Group(GroupId(5)), NextUse::Ahead(1)),
        (Unit::Group(GroupId(7)), NextUse::Ahead(2)),
        (Unit::Group(GroupId(1)), NextUse::Ahead(3)),
        (Unit::Group(GroupId(2)), NextUse::Ahead(9)),
        (Unit::Group(GroupId(6)), NextUse::Ahead(10)),
        (Unit::Group(GroupId(3)), NextUse::Done),
    ]));
    let group = |g| Unit::Group(GroupId(g));
    let (r, evicted) = p.reserve(100, group(4), Some(&plan), Admission::Prefetch);
    assert!(p.commit(r.expect("room"), part(4, 0), Some(GroupId(4))));
    assert_eq!(evicted, vec![part(3, 0)], "done with this epoch");
    let (r, evicted) = p.reserve(100, group(5), Some(&plan), Admission::Prefetch);
    assert!(p.commit(r.expect("room"), part(5, 0), Some(GroupId(5))));
    assert_eq!(
        evicted,
        vec![part(2, 0)],
        "needed furthest after the next step"
    );
    // Left: 4 and 5 for the next step, and 1. Group 7 is needed before 1, but two
    // steps ahead: it waits for the room the next steps free.
    assert!(!p.has_room(100, group(7), Some(&plan), Admission::Prefetch));
    assert_eq!(
        p.reserve(100, group(7), Some(&plan), Admission::Prefetch),
        (None, vec![]),
        "a prefetch beyond the next step evicts nothing a plan needs"
    );
    assert!(!p.has_room(100, group(6), Some(&plan), Admission::Prefetch));
    let (r, evicted) = p.reserve(100, group(6), Some(&plan), Admission::Demand);
    assert!(p.commit(r.expect("room"), part(6, 0), Some(GroupId(6))));
    assert_eq!(
        evicted,
        vec![part(1, 0)],
        "a reader's part: the furthest ahead goes"
    );
}

/// Steps of half the cache: the step just left (groups 1 and 2) and the current one
/// (3 and 4) fill it. The current step's last part and the next step (5) take the
/// room of the step just left, before any unit a plan reads later (6); a prefetch
/// further ahead (7) does not.
#[test]
fn the_step_just_left_gives_its_room_to_the_current_and_next_steps_only() {
    let mut p = Policy::new(500, None);
    for group in [6, 1, 2, 3, 4] {
        fill(&mut p, part(group, 0), Some(GroupId(group)), 100);
    }
    let plan = Plan(HashMap::from([
        (Unit::Group(GroupId(1)), NextUse::JustLeft),
        (Unit::Group(GroupId(2)), NextUse::JustLeft),
        (Unit::Group(GroupId(3)), NextUse::Current),
        (Unit::Group(GroupId(4)), NextUse::Current),
        (Unit::Group(GroupId(5)), NextUse::Ahead(1)),
        (Unit::Group(GroupId(6)), NextUse::Ahead(3)),
        (Unit::Group(GroupId(7)), NextUse::Ahead(2)),
    ]));
    let group = |g| Unit::Group(GroupId(g));
    assert!(
        !p.has_room(100, group(7), Some(&plan), Admission::Prefetch),
        "a prefetch two steps ahead waits"
    );
    let (r, evicted) = p.reserve(100, group(4), Some(&plan), Admission::Prefetch);
    assert!(p.commit(r.expect("room"), part(4, 1), Some(GroupId(4))));
    assert_eq!(evicted, vec![part(1, 0)], "for the current step");
    let (r, evicted) = p.reserve(100, group(5), Some(&plan), Admission::Prefetch);
    assert!(p.commit(r.expect("room"), part(5, 0), Some(GroupId(5))));
    assert_eq!(evicted, vec![part(2, 0)], "for the next step");
    let (r, evicted) = p.reserve(100, group(3), Some(&plan), Admission::Demand);
    assert!(p.commit(r.expect("room"), part(3, 1), Some(GroupId(3))));
    assert_eq!(evicted, vec![part(6, 0)], "then what is needed later");
}

#[test]
fn lone_parts_a_plan_ranks_go_after_those_it_does_not_and_the_current_ones_stay() {
    let mut p = Policy::new(400, None);
    for object in 1..=4 {
        fill(&mut p, part(object, 0), None, 100);
    }
    // Least recent first: 1, 2, 3, 4. A plan needs 1 now, then 2, 5, 6 and 3.
    let plan = Plan(HashMap::from([
        (Unit::Part(part(1, 0)), NextUse::Current),
        (Unit::Part(part(2, 0)), NextUse::Ahead(1)),
        (Unit::Part(part(5, 0)), NextUse::Ahead(2)),
        (Unit::Part(part(6, 0)), NextUse::Ahead(3)),
        (Unit::Part(part(3, 0)), NextUse::Ahead(4)),
    ]));
    let mut victims = Vec::new();
    for object in 5..=7 {
        let key = part(object, 0);
        let (r, evicted) = p.reserve(100, Unit::Part(key), Some(&plan), Admission::Demand);
        assert!(p.commit(r.expect("room"), key, None));
        victims.extend(evicted);
    }
    assert_eq!(
        victims,
        vec![part(4, 0), part(3, 0), part(6, 0)],
        "the one no plan needs, then those needed furthest ahead"
    );
    assert!(p.contains(part(1, 0)) && p.contains(part(2, 0)) && p.contains(part(5, 0)));
}

#[derive(Debug, Clone)]
enum Op {
    Fill {
        object: u64,
        index: u64,
        group: Option<u64>,
        bytes: u64,
    },
    Pin {
        object: u64,
        index: u64,
    },
    UnpinOne,
    Discard {
        object: u64,
        index: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..6, 0u64..4, proptest::option::of(0u64..3), 1u64..120).prop_map(
            |(object, index, group, bytes)| Op::Fill {
                object,
                index,
                group,
                bytes
            }
        ),
        (0u64..6, 0u64..4).prop_map(|(object, index)| Op::Pin { object, index }),
        Just(Op::UnpinOne),
        (0u64..6, 0u64..4).prop_map(|(object, index)| Op::Discard { object, index }),
    ]
}

proptest! {
    /// Whatever happens, resident + reserved bytes stay within the budget, the books
    /// add up, and pinned parts stay resident.
    #[test]
    fn accounting_holds(ops in proptest::collection::vec(op(), 1..80), budget in 100u64..400, max_groups in proptest::option::of(1usize..4)) {
        let mut p = Policy::new(budget, max_groups);
        let mut resident: HashMap<PartKey, u64> = HashMap::new();
        let mut pinned: Vec<PartKey> = Vec::new();
        for op in ops {
            match op {
                Op::Fill { object, index, group, bytes } => {
                    let key = part(object, index);
                    if resident.contains_key(&key) { continue; }
                    // A part belongs to one group for life, as objects do in a mount.
                    let group = group.map(|_| GroupId(object % 3));
                    let (r, victims) = p.reserve(bytes, Unit::of(key, group), None, Admission::Demand);
                    for v in &victims { resident.remove(v); }
                    if let Some(r) = r {
                        prop_assert!(p.commit(r, key, group));
                        resident.insert(key, bytes);
                    }
                }
                Op::Pin { object, index } => {
                    let key = part(object, index);
                    if p.pin(key, Recency::Use) { pinned.push(key); }
                }
                Op::UnpinOne => {
                    if let Some(key) = pinned.pop() { p.unpin(key); }
                }
                Op::Discard { object, index } => {
                    let key = part(object, index);
                    p.discard(key);
                    resident.remove(&key);
                    pinned.retain(|k| *k != key);
                }
            }
            prop_assert!(p.used_bytes() + p.reserved_bytes() <= budget);
            if let Some(max) = max_groups {
                prop_assert!(p.resident_groups() <= max, "{} groups", p.resident_groups());
            }
            prop_assert_eq!(p.used_bytes(), resident.values().sum::<u64>());
            prop_assert_eq!(p.resident_parts(), resident.len());
            let pinned_set: HashSet<_> = pinned.iter().collect();
            for key in pinned_set { prop_assert!(p.contains(*key), "pinned {:?} evicted", key); }
        }
    }
}

/// An advisor whose plans read only one object of some groups from the cache, as a plan
/// that fetches a chunk's rows exactly reads its row offsets alone.
struct ExactPlan {
    ranks: HashMap<Unit, NextUse>,
    reads_only: HashMap<Unit, ObjectId>,
}
impl EvictionAdvisor for ExactPlan {
    fn next_use(&self, unit: Unit) -> Option<NextUse> {
        self.ranks.get(&unit).copied()
    }
    fn ranks_any(&self) -> bool {
        !self.ranks.is_empty()
    }
    fn reads_only(&self, unit: Unit) -> Option<ObjectId> {
        self.reads_only.get(&unit).copied()
    }
}

#[test]
fn the_parts_of_a_ranked_chunk_its_plan_does_not_read_go_before_any_it_reads() {
    // Chunks 1 and 2 hold their row offsets (object 10, 20) and values (11, 21) an
    // earlier order left; the plan reads both chunks' rows exactly, many steps ahead.
    let mut p = Policy::new(400, None);
    let (g1, g2) = (Some(GroupId(1)), Some(GroupId(2)));
    fill(&mut p, part(10, 0), g1, 50);
    fill(&mut p, part(11, 0), g1, 100);
    fill(&mut p, part(20, 0), g2, 50);
    fill(&mut p, part(21, 0), g2, 100);
    fill(&mut p, part(21, 1), g2, 100);
    let plan = ExactPlan {
        ranks: HashMap::from([
            (Unit::Group(GroupId(1)), NextUse::Ahead(4)),
            (Unit::Group(GroupId(2)), NextUse::Ahead(6)),
            (Unit::Group(GroupId(3)), NextUse::Ahead(2)),
        ]),
        reads_only: HashMap::from([
            (Unit::Group(GroupId(1)), ObjectId(10)),
            (Unit::Group(GroupId(2)), ObjectId(20)),
            (Unit::Group(GroupId(3)), ObjectId(30)),
        ]),
    };
    // A prefetch of chunk 3's row offsets, read sooner than both: only the values go,
    // the least recently used chunk's first.
    let next = Unit::Group(GroupId(3));
    assert!(p.has_room(150, next, Some(&plan), Admission::Prefetch));
    let (r, evicted) = p.reserve(150, next, Some(&plan), Admission::Prefetch);
    assert!(p.commit(r.expect("room"), part(30, 0), Some(GroupId(3))));
    assert_eq!(evicted, vec![part(11, 0), part(21, 1)]);
    assert!(p.contains(part(10, 0)) && p.contains(part(20, 0)));
    assert_eq!(p.resident_groups(), 3);
    // A pinned part stays; the row offsets the plans read are never spare.
    assert!(p.pin(part(21, 0), Recency::Keep));
    assert_eq!(
        p.reserve(
            100,
            Unit::Group(GroupId(3)),
            Some(&plan),
            Admission::Prefetch
        ),
        (None, vec![])
    );
    p.unpin(part(21, 0));
    let (r, evicted) = p.reserve(
        100,
        Unit::Group(GroupId(3)),
        Some(&plan),
        Admission::Prefetch,
    );
    p.cancel(r.expect("room"));
    assert_eq!(evicted, vec![part(21, 0)]);
}

#[test]
fn the_chunks_of_the_step_being_read_give_up_the_parts_their_plan_does_not_read() {
    let mut p = Policy::new(200, None);
    fill(&mut p, part(10, 0), Some(GroupId(1)), 50);
    fill(&mut p, part(11, 0), Some(GroupId(1)), 150);
    let plan = ExactPlan {
        ranks: HashMap::from([(Unit::Group(GroupId(1)), NextUse::Current)]),
        reads_only: HashMap::from([(Unit::Group(GroupId(1)), ObjectId(10))]),
    };
    let (r, evicted) = p.reserve(
        100,
        Unit::Part(part(9, 0)),
        Some(&plan),
        Admission::Prefetch,
    );
    p.cancel(r.expect("room"));
    assert_eq!(evicted, vec![part(11, 0)]);
    assert!(p.contains(part(10, 0)), "the row offsets it reads stay");
}
