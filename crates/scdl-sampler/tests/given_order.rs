//! Specification of the hints for an order given from outside ([`GivenOrderHints`]):
//! each step the caller hands over is one step of the plan, its rows as sorted,
//! coalesced ranges, in the lines a sampler's own fetch would take, and `reading` says
//! the reader's step after the steps written with it. The hint file here is a regular
//! file, read back and decoded as the daemon decodes it.

mod common;

use std::collections::BTreeSet;

use common::*;
use proptest::prelude::*;
use scdl_format::hint::{HintLine, VERSION};
use scdl_sampler::{DatasetLayout, GivenOrderHints, HintWriter, DEFAULT_VIRTUAL_CHUNK_SIZE};

fn hints_of(dir: &std::path::Path) -> GivenOrderHints {
    let layout = DatasetLayout::discover(dir, DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    GivenOrderHints::new(HintWriter::open(dir, layout.chunks.chunk_size()))
}

/// The rows each step of `lines` names (`rows+` lines joined to the `rows` line that
/// ends their step), and the `reading` lines, in order.
fn steps_and_positions(lines: &[HintLine]) -> (Vec<Vec<u64>>, Vec<u64>) {
    let (mut steps, mut positions, mut open) = (Vec::new(), Vec::new(), Vec::new());
    for line in lines {
        match line {
            HintLine::RowsPart { ranges } => open.extend(ranges.iter().cloned().flatten()),
            HintLine::Rows { ranges } => {
                open.extend(ranges.iter().cloned().flatten());
                steps.push(std::mem::take(&mut open));
            }
            HintLine::Reading { step } => positions.push(*step),
            _ => {}
        }
    }
    (steps, positions)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever rows a step holds (unsorted, repeated, thousands of single rows), it is
    /// announced as one step of exactly its distinct rows, sorted and coalesced.
    #[test]
    fn each_step_is_announced_as_its_distinct_rows(
        steps in proptest::collection::vec(proptest::collection::vec(0u64..20_000, 1..3000), 1..6),
        epoch in 0u64..5,
    ) {
        let dataset = raw_dataset(20_000, 100, true);
        let mut hints = hints_of(dataset.path());
        prop_assert!(hints.is_active());
        hints.start(epoch);
        hints.advance(&steps, Some(0));
        hints.flush();
        let lines = hint_lines(dataset.path());
        prop_assert_eq!(&lines[..3], &[
            HintLine::Greeting { version: VERSION },
            HintLine::ChunkRows { rows: 100 },
            HintLine::Plan { epoch },
        ]);
        for line in &lines {
            if let HintLine::Rows { ranges } | HintLine::RowsPart { ranges } = line {
                prop_assert!(ranges.windows(2).all(|w| w[0].end < w[1].start), "{:?}", ranges);
            }
        }
        let (announced, positions) = steps_and_positions(&lines);
        let expected: Vec<Vec<u64>> = steps
            .iter()
            .map(|rows| rows.iter().copied().collect::<BTreeSet<_>>().into_iter().collect())
            .collect();
        prop_assert_eq!(announced, expected);
        prop_assert_eq!(positions, vec![0]);
        prop_assert!(hints.take_error().is_none());
    }
}

#[test]
fn steps_and_positions_go_out_in_the_order_given() {
    let dataset = raw_dataset(1000, 100, true);
    let mut hints = hints_of(dataset.path());
    hints.start(7);
    hints.advance(&[vec![5, 3, 4], vec![900]], Some(0));
    hints.advance(&[] as &[Vec<u64>], Some(1));
    hints.advance(&[vec![10, 11, 500, 12]], None);
    let rows = |pairs: &[(u64, u64)]| HintLine::Rows {
        ranges: pairs.iter().map(|&(start, end)| start..end).collect(),
    };
    hints.start(8);
    hints.flush();
    assert_eq!(
        hint_lines(dataset.path()).last(),
        Some(&rows(&[(10, 13), (500, 501)])),
        "a plan goes out with its first steps"
    );
    hints.advance(&[vec![1]], Some(0));
    hints.start(9);
    hints.advance(&[] as &[Vec<u64>], None);
    hints.flush();
    assert_eq!(
        hint_lines(dataset.path())[2..],
        [
            HintLine::Plan { epoch: 7 },
            rows(&[(3, 6)]),
            rows(&[(900, 901)]),
            HintLine::Reading { step: 0 },
            HintLine::Reading { step: 1 },
            rows(&[(10, 13), (500, 501)]),
            HintLine::Plan { epoch: 8 },
            rows(&[(1, 2)]),
            HintLine::Reading { step: 0 },
            HintLine::Plan { epoch: 9 },
        ]
    );
}

#[test]
fn without_a_hint_file_nothing_is_written_and_nothing_fails() {
    let dataset = raw_dataset(100, 10, false);
    let mut hints = hints_of(dataset.path());
    assert!(!hints.is_active());
    hints.start(0);
    hints.advance(&[vec![1, 2]], Some(0));
    assert!(hints.take_error().is_none());
    assert!(!dataset.path().join(".scdlfs-hints").exists());
}
