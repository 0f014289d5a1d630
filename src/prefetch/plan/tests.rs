use super::*;

/// Room for any plan: the bounds are tested on their own.
const UNLIMITED: Room = Room {
    entries: usize::MAX,
    work: u64::MAX,
};

fn layout(chunks: u64, rows_per_chunk: u64) -> ChunkGeometry {
    ChunkGeometry::new(chunks * rows_per_chunk, rows_per_chunk).unwrap()
}

fn chunks(chunks: &[usize]) -> Touched {
    Touched {
        chunks: chunks.to_vec(),
        parts: Vec::new(),
    }
}

fn window(chunks: &[u32]) -> HintLine {
    HintLine::Window {
        chunks: chunks.to_vec(),
    }
}

#[test]
fn a_batch_tells_how_far_ahead_of_the_reader_it_changed_the_plan() {
    let l = layout(8, 10);
    let mut plan = Plan::default();
    let new_plan = [HintLine::Plan { epoch: 1 }, window(&[0]), window(&[1])];
    assert_eq!(plan.apply(&new_plan, &l, UNLIMITED), Ok(Some(0)));
    assert_eq!(plan.apply(&[window(&[2])], &l, UNLIMITED), Ok(Some(2)));
    assert_eq!(
        plan.apply(&[window(&[3]), window(&[4])], &l, UNLIMITED),
        Ok(Some(3))
    );
    for _ in 0..READS_TO_ADVANCE {
        plan.observe(&chunks(&[2]), &l);
    }
    assert_eq!(plan.position, 2);
    // Step 0 is retired, the step just left stays: the new step is 3 steps ahead.
    assert_eq!(plan.apply(&[window(&[5])], &l, UNLIMITED), Ok(Some(3)));
    assert_eq!(plan.position, 1);
    let greeting = [HintLine::Greeting { version: 2 }];
    assert_eq!(
        plan.apply(&greeting, &l, UNLIMITED),
        Ok(None),
        "nothing new"
    );
    let emptied = [HintLine::Plan { epoch: 2 }];
    assert_eq!(
        plan.apply(&emptied, &l, UNLIMITED),
        Ok(Some(0)),
        "a new, empty plan"
    );
}

#[test]
fn a_plan_past_its_entry_budget_is_refused_and_changes_nothing() {
    let l = layout(8, 10);
    let mut plan = Plan::default();
    let room = Room {
        entries: 5,
        work: u64::MAX,
    };
    plan.apply(&[HintLine::Plan { epoch: 1 }, window(&[0, 1, 2])], &l, room)
        .unwrap();
    assert_eq!(plan.entries(), 3);
    let error = plan.apply(&[window(&[3, 4, 5])], &l, room).unwrap_err();
    assert_eq!(
        error,
        PlanRefused::TooManyEntries {
            limit: MAX_PLANNED_ENTRIES
        }
    );
    assert_eq!(plan.steps, vec![Step::Window(vec![0, 1, 2].into())]);
    plan.apply(&[window(&[3, 4])], &l, room).unwrap();
    assert_eq!(plan.entries(), 5);
}

fn rows(ranges: &[Range<u64>]) -> HintLine {
    HintLine::Rows {
        ranges: ranges.to_vec(),
    }
}

fn one_range(range: Range<u64>) -> HintLine {
    rows(std::slice::from_ref(&range))
}

/// A row range is one entry, but one unit of work for each chunk it spans: a plan
/// is held to its room in work, whatever its number of entries.
#[test]
fn a_plan_is_held_to_the_work_its_steps_expand_to_not_their_entries() {
    let l = layout(1000, 10);
    let mut plan = Plan::default();
    let room = Room {
        entries: usize::MAX,
        work: 300,
    };
    // 10 + 90 + 2 chunks: rows 2005..2015 cross one chunk edge.
    let lines = [
        one_range(0..100),
        one_range(100..1000),
        one_range(2005..2015),
    ];
    plan.apply(&lines, &l, room).unwrap();
    assert_eq!((plan.entries(), plan.work()), (3, 102));
    let wide = [rows(&[0..1000, 5000..6000])];
    assert_eq!(
        plan.apply(&wide, &l, room),
        Err(PlanRefused::TooMuchWork {
            work: 302,
            limit: 300
        }),
        "two entries, 200 chunks"
    );
    assert_eq!((plan.steps.len(), plan.work()), (3, 102), "unchanged");
    // Steps the reader passed give their work back as they retire.
    while !plan.observe(&chunks(&[200]), &l) {}
    assert_eq!(plan.position, 2);
    plan.apply(&wide, &l, room).unwrap();
    assert_eq!(plan.work(), 90 + 2 + 200);
    // A new plan starts from nothing.
    plan.apply(&[HintLine::Plan { epoch: 2 }, one_range(0..10)], &l, room)
        .unwrap();
    assert_eq!((plan.entries(), plan.work()), (1, 1));
}

#[test]
fn a_step_wider_than_the_step_bound_is_refused_whatever_the_room() {
    let per_chunk = 2;
    let chunks = MAX_STEP_WORK + 1;
    let l = layout(chunks, per_chunk);
    let mut plan = Plan::default();
    let all_rows = 0..chunks * per_chunk;
    assert_eq!(
        plan.apply(&[rows(std::slice::from_ref(&all_rows))], &l, UNLIMITED),
        Err(PlanRefused::StepTooWide {
            work: MAX_STEP_WORK + 1,
            limit: MAX_STEP_WORK
        })
    );
    let many_ranges: Vec<Range<u64>> = (0..chunks).map(|c| c * per_chunk..c * per_chunk).collect();
    assert!(
        matches!(
            plan.apply(&[rows(&many_ranges)], &l, UNLIMITED),
            Err(PlanRefused::StepTooWide { .. })
        ),
        "empty ranges count one each"
    );
    assert!(plan.steps.is_empty());
    plan.apply(&[one_range(0..MAX_STEP_WORK * per_chunk)], &l, UNLIMITED)
        .unwrap();
}

#[test]
fn a_writer_assuming_other_chunks_is_refused() {
    let l = layout(4, 10);
    let mut plan = Plan::default();
    let error = plan
        .apply(
            &[HintLine::ChunkRows { rows: 11 }, window(&[0])],
            &l,
            UNLIMITED,
        )
        .unwrap_err();
    assert_eq!(
        error,
        PlanRefused::ChunkRows {
            writer: 11,
            dataset: 10
        }
    );
    assert!(plan.steps.is_empty());
    plan.apply(
        &[HintLine::ChunkRows { rows: 10 }, window(&[0])],
        &l,
        UNLIMITED,
    )
    .unwrap();
    assert_eq!(plan.steps, vec![Step::Window(vec![0].into())]);
}

#[test]
fn out_of_range_steps_are_refused_and_change_nothing() {
    let l = layout(4, 10);
    let mut plan = Plan::default();
    plan.apply(
        &[HintLine::Plan { epoch: 1 }, window(&[0, 1])],
        &l,
        UNLIMITED,
    )
    .unwrap();
    assert!(plan
        .apply(&[window(&[2]), window(&[4])], &l, UNLIMITED)
        .is_err());
    assert!(plan
        .apply(
            &[HintLine::Rows {
                ranges: vec![0..3, 30..41]
            }],
            &l,
            UNLIMITED,
        )
        .is_err());
    assert_eq!(plan.steps, vec![Step::Window(vec![0, 1].into())]);
}

#[test]
fn a_new_plan_replaces_the_old_and_steps_append() {
    let l = layout(4, 10);
    let mut plan = Plan::default();
    plan.apply(&[HintLine::Plan { epoch: 1 }, window(&[0])], &l, UNLIMITED)
        .unwrap();
    plan.apply(&[window(&[1])], &l, UNLIMITED).unwrap();
    assert_eq!(plan.steps.len(), 2);
    plan.apply(&[HintLine::Plan { epoch: 2 }, window(&[3])], &l, UNLIMITED)
        .unwrap();
    assert_eq!(
        (plan.epoch, plan.steps.clone()),
        (2, vec![Step::Window(vec![3].into())])
    );
}

#[test]
fn reads_move_the_position_forward_and_back() {
    let l = layout(6, 10);
    let mut plan = Plan::default();
    let lines: Vec<_> = [[3u32, 1], [0, 5], [2, 4]]
        .iter()
        .map(|w| window(w))
        .collect();
    plan.apply(&lines, &l, UNLIMITED).unwrap();
    assert!(
        !plan.observe(&chunks(&[5]), &l),
        "one read elsewhere is not a move"
    );
    assert!(!plan.observe(&chunks(&[5]), &l));
    assert!(plan.observe(&chunks(&[5]), &l));
    assert_eq!(plan.position, 1);
    assert!(!plan.observe(&chunks(&[0]), &l), "same step");
    for _ in 1..READS_TO_GO_BACK {
        assert!(!plan.observe(&chunks(&[1]), &l));
    }
    assert!(
        plan.observe(&chunks(&[1]), &l),
        "a reader behind moves the position back"
    );
    assert_eq!(plan.position, 0);
    let ahead = plan.chunks_ahead(&l);
    assert_eq!(ahead[&3], NextUse::Current);
    assert_eq!(ahead[&5], NextUse::Ahead(1));
    assert_eq!(ahead[&4], NextUse::Ahead(2));
    while !plan.observe(&chunks(&[5]), &l) {}
    assert_eq!(
        plan.chunks_ahead(&l)[&3],
        NextUse::JustLeft,
        "the step just left is still ranked"
    );
}

#[test]
fn stray_reads_between_reads_of_the_current_step_do_not_move_it() {
    let l = layout(6, 10);
    let mut plan = Plan::default();
    plan.apply(&[window(&[0]), window(&[1]), window(&[2])], &l, UNLIMITED)
        .unwrap();
    for _ in 0..2 * READS_TO_ADVANCE {
        assert!(!plan.observe(&chunks(&[2]), &l));
        assert!(!plan.observe(&chunks(&[0]), &l));
    }
    assert_eq!(plan.position, 0);
    for _ in 1..READS_TO_ADVANCE {
        assert!(!plan.observe(&chunks(&[2]), &l));
    }
    assert!(
        plan.observe(&chunks(&[2]), &l),
        "a reader that skipped a step"
    );
    assert_eq!(plan.position, 2);
}

#[test]
fn resolved_steps_are_matched_by_part_not_by_chunk() {
    let l = layout(2, 10);
    let part = |index| PartKey {
        object: crate::parts::ObjectId(7),
        index,
    };
    let mut plan = Plan::default();
    let rows = |a, b| HintLine::Rows {
        ranges: std::iter::once(a..b).collect(),
    };
    plan.apply(&[rows(0, 3), rows(5, 8)], &l, UNLIMITED)
        .unwrap();
    plan.resolve(0, &plan.steps[0].clone(), HashSet::from([part(0)]));
    plan.resolve(1, &plan.steps[1].clone(), HashSet::from([part(1)]));
    let read_of = |index| Touched {
        chunks: vec![0],
        parts: vec![part(index)],
    };
    // Both steps read chunk 0; only the parts tell them apart.
    for _ in 1..READS_TO_ADVANCE {
        assert!(!plan.observe(&read_of(1), &l));
    }
    assert!(plan.observe(&read_of(1), &l));
    assert_eq!(plan.position, 1);
}

/// Each chunk is reported finished once, when the reader has passed the step just
/// left after it: whole for a window, and for row steps once all its rows were read.
#[test]
fn chunks_are_finished_once_every_row_was_read_by_passed_steps() {
    let l = layout(4, 10);
    let mut plan = Plan::default();
    let lines = [
        HintLine::Plan { epoch: 1 },
        window(&[3]),
        HintLine::Rows {
            ranges: vec![0..10, 12..16],
        },
        HintLine::Rows {
            ranges: vec![10..12, 16..20],
        },
        window(&[2]),
        window(&[3]),
    ];
    plan.apply(&lines, &l, UNLIMITED).unwrap();
    assert!(plan.finished_chunks(&l).is_empty());
    while !plan.observe(&chunks(&[1]), &l) {}
    assert_eq!(plan.position, 1);
    assert!(
        plan.finished_chunks(&l).is_empty(),
        "the step just left is current"
    );
    while !plan.observe(&chunks(&[2]), &l) {}
    assert_eq!(plan.position, 3);
    // Window 3 passed; the first row step read all of chunk 0 and part of chunk 1.
    assert_eq!(plan.finished_chunks(&l), vec![3, 0]);
    assert!(plan.finished_chunks(&l).is_empty(), "reported once");
    plan.apply(&[window(&[1])], &l, UNLIMITED).unwrap();
    while !plan.observe(&chunks(&[3]), &l) {}
    // The rest of chunk 1 was read by a step counted after the first ones retired.
    assert_eq!(plan.finished_chunks(&l), vec![1]);
    plan.apply(&lines, &l, UNLIMITED).unwrap();
    while !plan.observe(&chunks(&[2]), &l) {}
    assert_eq!(
        plan.finished_chunks(&l),
        vec![3, 0],
        "a new epoch counts anew"
    );
}

/// A top-up takes its steps from the plan as it was; by the time it fetches them
/// the reader may have passed them, or a new batch may have renumbered them.
#[test]
fn steps_are_upcoming_until_passed_and_only_in_their_revision() {
    let l = layout(6, 10);
    let mut plan = Plan::default();
    let lines: Vec<HintLine> = std::iter::once(HintLine::Plan { epoch: 1 })
        .chain((0..6).map(|c| window(&[c])))
        .collect();
    plan.apply(&lines, &l, UNLIMITED).unwrap();
    let revision = plan.revision;
    assert!(plan.is_upcoming(revision, 0));
    while !plan.observe(&chunks(&[2]), &l) {}
    assert!(!plan.is_upcoming(revision, 0), "passed");
    assert!(plan.is_upcoming(revision, 1), "just left: still current");
    assert!(plan.is_upcoming(revision, 5));
    // The next epoch in the same order names the same steps at the same places,
    // but the end of the last epoch is the far end of the new one.
    plan.apply(&lines, &l, UNLIMITED).unwrap();
    assert!(!plan.is_upcoming(revision, 5));
    assert!(plan.is_upcoming(plan.revision, 5));
}

#[test]
fn passed_steps_are_retired_when_steps_are_appended() {
    let l = layout(6, 10);
    let mut plan = Plan::default();
    plan.apply(
        &[
            HintLine::Plan { epoch: 1 },
            window(&[0]),
            window(&[1]),
            window(&[2]),
        ],
        &l,
        UNLIMITED,
    )
    .unwrap();
    while !plan.observe(&chunks(&[2]), &l) {}
    plan.apply(&[window(&[3])], &l, UNLIMITED).unwrap();
    // The step just left stays, protected; the one before it goes.
    assert_eq!(
        plan.steps,
        vec![
            Step::Window(vec![1].into()),
            Step::Window(vec![2].into()),
            Step::Window(vec![3].into())
        ]
    );
    assert_eq!(plan.position, 1);
    assert_eq!(plan.chunks_ahead(&l)[&1], NextUse::JustLeft);
}

#[test]
fn row_steps_map_to_the_chunks_they_span() {
    let l = layout(4, 10);
    let mut plan = Plan::default();
    plan.apply(
        &[
            HintLine::Rows {
                ranges: std::iter::once(8..12).collect(),
            },
            HintLine::Rows {
                ranges: std::iter::once(35..40).collect(),
            },
        ],
        &l,
        UNLIMITED,
    )
    .unwrap();
    assert_eq!(plan.steps[0].chunks(&l), vec![0, 1]);
    while !plan.observe(&chunks(&[3]), &l) {}
    assert_eq!(plan.position, 1);
}

/// A writer's `reading` line moves the position forward to the step it names, counted
/// from the `plan` line however many steps were retired since, and never back.
#[test]
fn the_writer_says_which_step_it_reads() {
    let l = layout(8, 10);
    let mut plan = Plan::default();
    let steps: Vec<HintLine> = (0..6).map(|c| window(&[c])).collect();
    let mut lines = vec![HintLine::Plan { epoch: 0 }];
    lines.extend(steps);
    plan.apply(&lines, &l, UNLIMITED).unwrap();
    assert!(plan.reading(3));
    assert_eq!(plan.position, 3);
    assert!(!plan.reading(2), "never back");
    assert!(!plan.reading(3), "already there");
    // Steps 0 and 1 are retired (the one just left, 2, stays): step 4 is now index 2.
    plan.apply(&[window(&[6])], &l, UNLIMITED).unwrap();
    assert_eq!(plan.position, 1);
    assert!(plan.reading(4));
    assert_eq!(plan.position, 2);
    assert_eq!(plan.steps[plan.position], Step::Window(vec![4].into()));
    assert!(plan.reading(100), "clamped to the plan's end");
    assert_eq!(plan.position, plan.steps.len());
    // A new plan counts from 0 again.
    plan.apply(
        &[HintLine::Plan { epoch: 1 }, window(&[0]), window(&[1])],
        &l,
        UNLIMITED,
    )
    .unwrap();
    assert!(plan.reading(1));
    assert_eq!(plan.position, 1);
}

/// Protocol version 4: a step longer than a line comes as `rows+` (or `window+`)
/// lines and one last line, maybe over several writes, and is one step, whose work is
/// bounded as a whole.
#[test]
fn a_step_in_several_lines_is_one_step_even_across_writes() {
    let l = layout(100, 10);
    let mut plan = Plan::default();
    let part = |ranges: &[Range<u64>]| HintLine::RowsPart {
        ranges: ranges.to_vec(),
    };
    let begun = [HintLine::Plan { epoch: 1 }, part(&[0..1, 50..51])];
    assert_eq!(plan.apply(&begun, &l, UNLIMITED), Ok(Some(0)));
    assert!(plan.steps.is_empty(), "no step before its last line");
    assert!(!plan.is_empty());
    assert_eq!(plan.entries(), 2);
    let ended = [part(&[70..71, 75..76]), one_range(90..92), one_range(3..4)];
    assert_eq!(plan.apply(&ended, &l, UNLIMITED), Ok(Some(0)));
    assert_eq!(
        plan.steps,
        vec![
            Step::Rows(vec![0..1, 50..51, 70..71, 75..76, 90..92].into()),
            Step::Rows(std::iter::once(3..4).collect())
        ]
    );
    assert_eq!(plan.entries(), 6);
    let window_part = HintLine::WindowPart { chunks: vec![4, 2] };
    plan.apply(&[window_part, window(&[9])], &l, UNLIMITED)
        .unwrap();
    assert_eq!(plan.steps[2], Step::Window(vec![4, 2, 9].into()));
}

#[test]
fn a_step_in_several_lines_is_refused_when_it_mixes_kinds_or_outgrows_a_step() {
    let l = layout(MAX_STEP_WORK + 10, 1);
    let mut plan = Plan::default();
    let begun = HintLine::WindowPart { chunks: vec![1] };
    plan.apply(&[HintLine::Plan { epoch: 0 }, begun], &l, UNLIMITED)
        .unwrap();
    assert_eq!(
        plan.apply(&[one_range(0..1)], &l, UNLIMITED),
        Err(PlanRefused::MixedStep)
    );
    let half = (MAX_STEP_WORK / 2 + 1) as u32;
    let first_half = HintLine::WindowPart {
        chunks: (0..half).collect(),
    };
    assert_eq!(
        plan.apply(
            &[first_half, window(&(half..2 * half).collect::<Vec<_>>())],
            &l,
            UNLIMITED
        ),
        Err(PlanRefused::StepTooWide {
            work: 2 * half as u64 + 1,
            limit: MAX_STEP_WORK
        }),
        "the parts count together, with the chunk begun in the earlier write"
    );
    assert!(plan.steps.is_empty());
    // A new plan drops the step begun in the old one.
    plan.apply(
        &[HintLine::Plan { epoch: 1 }, one_range(0..1)],
        &l,
        UNLIMITED,
    )
    .unwrap();
    assert_eq!(plan.steps, [Step::Rows(std::iter::once(0..1).collect())]);
}
