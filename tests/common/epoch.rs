//! One training epoch through a mount behind a slow link, as the prefetch tests measure
//! it: a sampler (announcing its order through the hint file, or not) feeds a reader
//! that checks every row against the source and "trains" 40 µs per row, and the
//! mount's counters are taken after the first step and at the end. What a plan missed
//! is counted in parts, not seconds, so the verdicts hold on a loaded machine.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::ObjectStore;
use scdl_sampler::{DatasetLayout, Order, Sampler, Shard, Workers, DEFAULT_VIRTUAL_CHUNK_SIZE};
use scdlfs::metrics::MetricsSnapshot;
use scdlfs::store::throttled::Throttle;
use scdlfs::store::wrapper::HookedStore;
use scdlfs::synthetic::SyntheticDataset;

use super::{MappedRows, TestMount};

/// Epochs run one at a time: each counts waits, which a second epoch's load shifts.
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How an epoch went: counters after the first step and at the end.
pub struct Epoch {
    pub layout: DatasetLayout,
    pub after_first_step: MetricsSnapshot,
    pub at_end: MetricsSnapshot,
    pub steps: usize,
}

impl Epoch {
    pub fn waits_after_first_step(&self) -> u64 {
        self.at_end.demand_reads_waited - self.after_first_step.demand_reads_waited
    }

    /// Parts a reader had to ask for after the first step because no prefetch had: a
    /// count of what the plan missed, whatever the machine's speed. (A read that waits
    /// for a prefetch still under way is a matter of speed, and not in it.)
    pub fn unforeseen_after_first_step(&self) -> u64 {
        self.at_end.demand_downloads - self.after_first_step.demand_downloads
    }
}

/// The mount and the reader of [`run_epoch`].
pub struct EpochSetup {
    /// Where the dataset `spec` lies, under `ds/`.
    pub store: Arc<dyn ObjectStore>,
    pub spec: SyntheticDataset,
    pub cache_bytes: u64,
    pub part_size: u64,
}

/// Mounts the store behind a 20 ms, 40 MB/s link and reads one epoch with `order`,
/// with or without hints.
pub fn run_epoch(setup: &EpochSetup, order: Order, hints: bool) -> Epoch {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let link = Throttle::new(Duration::from_millis(20), 40_000_000);
    let store = Arc::new(HookedStore::new(setup.store.clone(), link));
    let mount = TestMount::start(store, "", |s| {
        s.part_size = setup.part_size;
        s.cache_bytes = setup.cache_bytes;
        s.prefetch_lookahead_steps = 3;
    });
    let dir = mount.path().join("ds");
    let layout = DatasetLayout::discover(&dir, DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let mut sampler = if hints {
        Sampler::new(&layout, order, Shard::single(), Workers::single()).unwrap()
    } else {
        Sampler::without_hints(&layout, order, Shard::single(), Workers::single()).unwrap()
    };
    assert_eq!(sampler.hints_active(), hints);
    let reader = MappedRows::open(&dir);
    let mut rows = sampler.epoch(0);
    let first_step_rows = rows.share()[0].rows;
    let steps = rows.share().len();
    let mut after_first_step = None;
    let mut read = 0;
    while let Some(batch) = rows.next_minibatch() {
        for &row in &batch {
            assert_eq!(reader.row(row), setup.spec.row(row), "row {row}");
        }
        std::thread::sleep(Duration::from_micros(40 * batch.len() as u64));
        read += batch.len() as u64;
        if after_first_step.is_none() && read >= first_step_rows {
            after_first_step = Some(mount.status().counters);
        }
    }
    drop(rows);
    assert!(sampler.take_hint_error().is_none());
    Epoch {
        layout,
        after_first_step: after_first_step.unwrap(),
        at_end: mount.status().counters,
        steps,
    }
}

/// The same epoch read with hints and without, side by side.
pub struct HintsCompared {
    pub with: Epoch,
    pub without: Epoch,
}

impl HintsCompared {
    /// Runs both epochs and prints what they waited for, under the name `what`.
    pub fn run(what: &str, setup: &EpochSetup, order: Order) -> Self {
        let compared = HintsCompared {
            with: run_epoch(setup, order, true),
            without: run_epoch(setup, order, false),
        };
        let (with, without) = (&compared.with, &compared.without);
        eprintln!(
            "{what}: {} steps; after the first step, reads that waited: {} with hints, {} \
             without; parts no prefetch foresaw: {} with, {} without; fetched {} bytes \
             with hints; prefetch hits {}",
            with.steps,
            with.waits_after_first_step(),
            without.waits_after_first_step(),
            with.unforeseen_after_first_step(),
            without.unforeseen_after_first_step(),
            with.at_end.bytes_fetched,
            with.at_end.prefetch_hits
        );
        compared
    }

    /// Parts the reader asked for itself after the first step: (with hints, without).
    pub fn unforeseen(&self) -> (u64, u64) {
        (
            self.with.unforeseen_after_first_step(),
            self.without.unforeseen_after_first_step(),
        )
    }
}
