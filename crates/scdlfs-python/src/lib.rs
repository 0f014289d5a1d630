//! `scdlfs._native`: the `scdl-sampler` orders and hint writer for the Python package
//! `scdlfs` (python/scdlfs), which wraps them in the `torch.utils.data.Sampler`
//! protocol. Every order is computed here, by the same code the Rust callers use;
//! Python only resolves the distributed defaults and turns minibatches into rows.
//!
//! A DataLoader iterates its sampler in the main process and hands the indices to
//! worker processes, which do the reads. The hint handle therefore belongs to the
//! process that iterates: it is opened when that process starts an epoch, and a
//! process forked from it (a DataLoader worker under the `fork` start method) that
//! finds the handle of its parent drops its copy and, should it ever iterate, opens its
//! own, so that no two processes write one plan.

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeWarning, PyValueError};
use pyo3::prelude::*;
use scdl_format::hint::HINT_FILE;
use scdl_sampler::{
    BlockOrder, CachedChunks, ChunkWindowOrder, DatasetLayout, EpochCursor, EvenShares,
    GivenOrderHints, HintWriter, Order, RowSubset, RowWeights, Sampler, Shard, Workers,
    DEFAULT_VIRTUAL_CHUNK_SIZE,
};

create_exception!(
    _native,
    HintWarning,
    PyRuntimeWarning,
    "The mount did not take a sampler's read-ahead hints: its prefetch may stop; rows are unaffected."
);

create_exception!(
    _native,
    NotADatasetError,
    PyValueError,
    "The directory is not an SCDL dataset (no readable header.sch, or an inconsistent one)."
);

/// One order over one dataset for one rank.
#[pyclass(module = "scdlfs._native")]
struct NativeSampler {
    layout: DatasetLayout,
    /// Gives no hints: computes lengths, and iterates when hints are off.
    unhinted: Sampler,
    /// With hints on: the sampler of the process that last iterated, by process id,
    /// holding that process's hint handle.
    hinted: Option<(u32, Sampler)>,
    hints: bool,
    lookahead: NonZeroUsize,
    order: Order,
    shard: Shard,
    subset: Arc<RowSubset>,
    /// The weights rows are drawn by (a weighted block order), if any.
    weights: Option<Arc<RowWeights>>,
    /// The chunks the epochs started from now on read first (the cache-aware order).
    cached_first: Option<CachedChunks>,
    /// Whether this sampler has warned of a hint failure ([`HintWarning`]): once.
    warned_of_hints: bool,
}

/// A position in one epoch, advanced by [`NativeSampler::next_minibatch`].
#[pyclass(module = "scdlfs._native")]
struct NativeEpoch {
    cursor: EpochCursor,
}

#[pymethods]
impl NativeEpoch {
    /// Rows of the share handed out so far, counting those a resume skipped.
    #[getter]
    fn rows_done(&self) -> u64 {
        self.cursor.rows_done()
    }
}

/// A set of rows of a dataset for a sampler to visit instead of all of them
/// (`scdl_sampler::RowSubset`).
#[pyclass(module = "scdlfs._native", name = "RowSubset", frozen)]
struct PyRowSubset {
    subset: Arc<RowSubset>,
}

/// What unpickling calls to rebuild a subset: `RowSubset.from_ranges(ranges)`.
type Rebuild<'py> = (Bound<'py, PyAny>, (Vec<(u64, u64)>,));

#[pymethods]
impl PyRowSubset {
    /// The rows listed, in any order; a row listed twice counts once.
    #[staticmethod]
    fn from_rows(rows: Vec<u64>) -> PyRowSubset {
        PyRowSubset {
            subset: Arc::new(RowSubset::from_rows(rows)),
        }
    }

    /// The rows of the `(start, stop)` ranges, stop excluded.
    #[staticmethod]
    fn from_ranges(ranges: Vec<(u64, u64)>) -> PyRowSubset {
        PyRowSubset {
            subset: Arc::new(RowSubset::from_ranges(
                ranges.into_iter().map(|(a, b)| a..b),
            )),
        }
    }

    /// The subset as sorted, disjoint `(start, stop)` ranges.
    fn ranges(&self) -> Vec<(u64, u64)> {
        self.subset
            .ranges()
            .iter()
            .map(|r| (r.start, r.end))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.subset.len() as usize
    }

    fn __contains__(&self, row: u64) -> bool {
        self.subset.contains(row)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyRowSubset>()
            .is_ok_and(|o| o.get().subset == self.subset)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Rebuild<'py>> {
        let rebuild = slf.get_type().getattr("from_ranges")?;
        Ok((rebuild, (slf.get().ranges(),)))
    }

    fn __repr__(&self) -> String {
        format!(
            "RowSubset({} rows in {} ranges)",
            self.subset.len(),
            self.subset.ranges().len()
        )
    }
}

/// The chunks the scdlfs daemon announces it holds in its disk cache, as sorted
/// `(start, stop)` ranges of chunk ids, read now through a handle of this call's own;
/// None off a mount or from a daemon that does not say.
#[pyfunction]
fn read_cached_chunks(dataset_dir: PathBuf) -> PyResult<Option<Vec<(u32, u32)>>> {
    let held = CachedChunks::read_from(&dataset_dir)
        .map_err(|e| NotADatasetError::new_err(format!("{}: {e}", dataset_dir.display())))?;
    Ok(held.map(|set| set.ranges().iter().map(|r| (r.start, r.end)).collect()))
}

/// The dataset at `dataset_dir` split into parts of whole chunks in the proportions of
/// `fractions`, the chunks dealt at random by `seed`: disjoint parts that together hold
/// every row.
#[pyfunction]
fn split_by_chunk(
    dataset_dir: PathBuf,
    fractions: Vec<f64>,
    seed: i64,
) -> PyResult<Vec<PyRowSubset>> {
    let layout = discover(&dataset_dir)?;
    let parts = RowSubset::split_by_chunk(&layout.chunks, &fractions, seed_of(seed)?)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(parts
        .into_iter()
        .map(|subset| PyRowSubset {
            subset: Arc::new(subset),
        })
        .collect())
}

fn discover(dataset_dir: &std::path::Path) -> PyResult<DatasetLayout> {
    DatasetLayout::discover(dataset_dir, DEFAULT_VIRTUAL_CHUNK_SIZE).map_err(|e| {
        NotADatasetError::new_err(format!(
            "{} is not an SCDL dataset: {e}",
            dataset_dir.display()
        ))
    })
}

fn positive_u64(name: &str, value: i64) -> PyResult<NonZeroU64> {
    u64::try_from(value)
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| PyValueError::new_err(format!("{name} must be at least 1, got {value}")))
}

fn positive_u32(name: &str, value: i64) -> PyResult<NonZeroU32> {
    u32::try_from(value)
        .ok()
        .and_then(NonZeroU32::new)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{name} must be between 1 and {}, got {value}",
                u32::MAX
            ))
        })
}

fn seed_of(seed: i64) -> PyResult<u64> {
    u64::try_from(seed)
        .map_err(|_| PyValueError::new_err(format!("seed must not be negative, got {seed}")))
}

fn shard_of(rank: i64, world_size: i64, even: &str) -> PyResult<Shard> {
    let world_size = positive_u32("world_size", world_size)?;
    let even = match even {
        "pad" => EvenShares::Pad,
        "drop" => EvenShares::Drop,
        "uneven" => EvenShares::Uneven,
        other => {
            return Err(PyValueError::new_err(format!(
                "even must be 'pad', 'drop' or 'uneven', not {other:?}"
            )))
        }
    };
    let rank = u32::try_from(rank).map_err(|_| {
        PyValueError::new_err(format!(
            "rank {rank} does not exist among {world_size} ranks"
        ))
    })?;
    Shard::new(rank, world_size, even).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The weights of a weighted order: `weights` as given, or one over its class's size a
/// row for `labels`; None for neither.
fn row_weights(
    py: Python<'_>,
    weights: Option<PyBuffer<f64>>,
    labels: Option<PyBuffer<u64>>,
) -> PyResult<Option<Arc<RowWeights>>> {
    let weights = match (weights, labels) {
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err("give weights or labels, not both"))
        }
        (Some(weights), None) => RowWeights::new(&weights.to_vec(py)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
        (None, Some(labels)) => RowWeights::class_balanced(&labels.to_vec(py)?),
        (None, None) => return Ok(None),
    };
    Ok(Some(Arc::new(weights)))
}

/// Warns with [`HintWarning`] that the mount did not take the hints of `whose` (a
/// "sampler", a "plan"): an error where warnings are made errors.
fn warn_of_hint_failure(py: Python<'_>, whose: &str, error: &str) -> PyResult<()> {
    let message = format!(
        "the mount did not take this {whose}'s read-ahead hints, so its prefetch may stop (rows \
         are unaffected; take_hint_error() returns the failure): {error}"
    );
    let message =
        std::ffi::CString::new(message).map_err(|e| PyValueError::new_err(e.to_string()))?;
    PyErr::warn(py, py.get_type::<HintWarning>().as_any(), &message, 2)
}

impl NativeSampler {
    fn build(
        dataset_dir: PathBuf,
        order: Order,
        shard: Shard,
        hints: bool,
        lookahead: i64,
        subset: Option<&PyRowSubset>,
        weights: Option<Arc<RowWeights>>,
    ) -> PyResult<NativeSampler> {
        let lookahead = usize::try_from(lookahead)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "hint_lookahead must be at least 1, got {lookahead}"
                ))
            })?;
        let layout = discover(&dataset_dir)?;
        let subset = match subset {
            Some(s) => s.subset.clone(),
            None => Arc::new(RowSubset::all(layout.chunks.total_rows())),
        };
        let unhinted = Sampler::without_hints(&layout, order, shard, Workers::single())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let unhinted = match &weights {
            Some(weights) => unhinted
                .with_row_weights(weights.clone())
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            None => unhinted,
        }
        .restricted_to(subset.clone())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(NativeSampler {
            layout,
            unhinted,
            hinted: None,
            hints,
            lookahead,
            order,
            shard,
            subset,
            weights,
            cached_first: None,
            warned_of_hints: false,
        })
    }

    /// The sampler this process iterates with: with hints on, one holding a handle
    /// this process opened itself.
    fn sampler(&mut self) -> &mut Sampler {
        if !self.hints {
            return &mut self.unhinted;
        }
        let pid = std::process::id();
        if !matches!(&self.hinted, Some((owner, _)) if *owner == pid) {
            // Dropping an inherited sampler closes this process's copy of the handle
            // only; the parent's plan lives on.
            self.hinted = None;
            let mut sampler = Sampler::new(&self.layout, self.order, self.shard, Workers::single())
                .expect("the shard was checked against the order when the sampler was built");
            if let Some(weights) = &self.weights {
                sampler = sampler
                    .with_row_weights(weights.clone())
                    .expect("the weights were checked when the sampler was built");
            }
            let mut sampler = sampler
                .restricted_to(self.subset.clone())
                .expect("the subset was checked when the sampler was built")
                .with_hint_lookahead(self.lookahead);
            sampler.set_cache_aware_order(self.cached_first.clone());
            self.hinted = Some((pid, sampler));
        }
        &mut self.hinted.as_mut().expect("set just above").1
    }
}

#[pymethods]
impl NativeSampler {
    /// The chunk-window order over the dataset at `dataset_dir`, drawing rows by
    /// `weights` (one a row) or balancing the classes of `labels` (a class code a row)
    /// if either is given.
    #[staticmethod]
    #[pyo3(signature = (dataset_dir, *, chunks_per_window, seed, shuffle_chunks, shuffle_within_window, rank, world_size, even, hints, hint_lookahead, subset=None, weights=None, labels=None))]
    #[allow(clippy::too_many_arguments)]
    fn chunk_windows(
        dataset_dir: PathBuf,
        chunks_per_window: i64,
        seed: i64,
        shuffle_chunks: bool,
        shuffle_within_window: bool,
        rank: i64,
        world_size: i64,
        even: &str,
        hints: bool,
        hint_lookahead: i64,
        subset: Option<PyRef<'_, PyRowSubset>>,
        weights: Option<PyBuffer<f64>>,
        labels: Option<PyBuffer<u64>>,
        py: Python<'_>,
    ) -> PyResult<NativeSampler> {
        let weights = row_weights(py, weights, labels)?;
        let order = Order::ChunkWindows(ChunkWindowOrder {
            seed: seed_of(seed)?,
            chunks_per_window: positive_u32("chunks_per_window", chunks_per_window)?,
            shuffle_chunks,
            shuffle_within_window,
        });
        let shard = shard_of(rank, world_size, even)?;
        NativeSampler::build(
            dataset_dir,
            order,
            shard,
            hints,
            hint_lookahead,
            subset.as_deref(),
            weights,
        )
    }

    /// The scDataset block order over the dataset at `dataset_dir`, drawing rows by
    /// `weights` (one a row) or balancing the classes of `labels` (a class code a row)
    /// if either is given.
    #[staticmethod]
    #[pyo3(signature = (dataset_dir, *, block_size, batch_size, fetch_factor, seed, rank, world_size, even, hints, hint_lookahead, subset=None, weights=None, labels=None))]
    #[allow(clippy::too_many_arguments)]
    fn blocks(
        dataset_dir: PathBuf,
        block_size: i64,
        batch_size: i64,
        fetch_factor: i64,
        seed: i64,
        rank: i64,
        world_size: i64,
        even: &str,
        hints: bool,
        hint_lookahead: i64,
        subset: Option<PyRef<'_, PyRowSubset>>,
        weights: Option<PyBuffer<f64>>,
        labels: Option<PyBuffer<u64>>,
        py: Python<'_>,
    ) -> PyResult<NativeSampler> {
        let weights = row_weights(py, weights, labels)?;
        let order = Order::Blocks(BlockOrder {
            seed: seed_of(seed)?,
            block_size: positive_u64("block_size", block_size)?,
            batch_size: positive_u64("batch_size", batch_size)?,
            fetch_factor: positive_u64("fetch_factor", fetch_factor)?,
        });
        let shard = shard_of(rank, world_size, even)?;
        NativeSampler::build(
            dataset_dir,
            order,
            shard,
            hints,
            hint_lookahead,
            subset.as_deref(),
            weights,
        )
    }

    /// Starts epoch `epoch` in this process after this rank's first `rows_done` rows
    /// of it (0: from the beginning): announces the plan from there when hints are on.
    #[pyo3(signature = (epoch, rows_done=0))]
    fn start_epoch(&mut self, epoch: u64, rows_done: u64) -> PyResult<NativeEpoch> {
        let Some(cursor) = self.sampler().resume_epoch(epoch, rows_done) else {
            let share = self.unhinted.rows_in_epoch(epoch);
            return Err(PyValueError::new_err(format!(
                "cannot resume epoch {epoch} after {rows_done} rows: this rank's share of it has {share}"
            )));
        };
        Ok(NativeEpoch { cursor })
    }

    /// The rows up to the next minibatch boundary (a block-order minibatch, or the
    /// rest of a window), or None at the end of the epoch. The first hint failure is
    /// warned of ([`HintWarning`], once per sampler) as soon as the hint writer has
    /// met it, and at the latest at the end of the epoch; it stays for
    /// `take_hint_error`. With warnings made errors, the warning raises here.
    fn next_minibatch(
        &mut self,
        py: Python<'_>,
        mut epoch: PyRefMut<'_, NativeEpoch>,
    ) -> PyResult<Option<Vec<u64>>> {
        let minibatch = self.sampler().next_minibatch(&mut epoch.cursor);
        if self.hints && !self.warned_of_hints {
            let sampler = self.sampler();
            if minibatch.is_none() {
                sampler.flush_hints();
            }
            if let Some(error) = sampler.pending_hint_error() {
                self.warned_of_hints = true;
                warn_of_hint_failure(py, "sampler", &error)?;
            }
        }
        Ok(minibatch)
    }

    /// Makes the epochs started from now on read the chunks in `cached` (`(start,
    /// stop)` ranges of chunk ids) first, or, with None, follow the plain order.
    #[pyo3(signature = (cached))]
    fn set_cache_aware_order(&mut self, cached: Option<Vec<(u32, u32)>>) {
        let cached =
            cached.map(|ranges| CachedChunks::from_ranges(ranges.into_iter().map(|(a, b)| a..b)));
        self.unhinted.set_cache_aware_order(cached.clone());
        if let Some((_, sampler)) = &mut self.hinted {
            sampler.set_cache_aware_order(cached.clone());
        }
        self.cached_first = cached;
    }

    /// How many rows this rank visits in epoch `epoch`.
    fn rows_in_epoch(&self, epoch: u64) -> u64 {
        self.unhinted.rows_in_epoch(epoch)
    }

    /// How many minibatches of the block order this rank reads in epoch `epoch`: each
    /// fetch of its share cut into `batch_size` rows, the last one maybe shorter.
    fn minibatches_in_epoch(&self, epoch: u64) -> PyResult<u64> {
        let Some(batch) = self.order.batch_size() else {
            return Err(PyValueError::new_err(
                "the chunk-window order has no minibatches of its own: give a batch size",
            ));
        };
        Ok(self.unhinted.minibatches_in_epoch(epoch, batch))
    }

    /// Whether this process is telling the daemon its plan (opens the hint file if
    /// this process has not yet).
    fn hints_active(&mut self) -> bool {
        self.sampler().hints_active()
    }

    /// The first hint failure in this process since the last call, if any.
    fn take_hint_error(&mut self) -> Option<String> {
        self.sampler().take_hint_error().map(|e| e.to_string())
    }

    /// Drops a hint handle inherited from the parent process (called after a fork).
    fn forget_inherited_hints(&mut self) {
        if matches!(&self.hinted, Some((owner, _)) if *owner != std::process::id()) {
            self.hinted = None;
        }
    }

    #[getter]
    fn num_rows(&self) -> u64 {
        self.layout.chunks.total_rows()
    }

    #[getter]
    fn num_chunks(&self) -> u32 {
        self.layout.chunks.num_chunks()
    }

    /// What `dataset_dir` is: "flat view", "raw view" or "plain monolithic directory".
    #[getter]
    fn kind(&self) -> String {
        self.layout.kind.to_string()
    }
}

/// The plan of an order given from outside (`scdlfs.Planned`, the scDataset adapter):
/// steps handed over by the Python side as it reads the order ahead, written by
/// [`GivenOrderHints`] through this process's own hint handle.
#[pyclass(module = "scdlfs._native")]
struct NativePlan {
    dataset_dir: PathBuf,
    /// The rows per chunk the greeting states; None when the directory has no hint
    /// file (not on a mount) or hints are off: then nothing is ever opened.
    chunk_rows: Option<u64>,
    /// The hints of the process that last started a plan, by process id.
    hints: Option<(u32, GivenOrderHints)>,
    /// Whether this plan has warned of a hint failure ([`HintWarning`]): once.
    warned_of_hints: bool,
}

#[pymethods]
impl NativePlan {
    /// A plan of the dataset at `dataset_dir`. Off a mount (no hint file) it reads
    /// nothing of the directory: the wrapped order then costs nothing but a check.
    #[new]
    #[pyo3(signature = (dataset_dir, *, hints))]
    fn new(dataset_dir: PathBuf, hints: bool) -> PyResult<NativePlan> {
        let chunk_rows = match hints && dataset_dir.join(HINT_FILE).exists() {
            true => Some(discover(&dataset_dir)?.chunks.chunk_size()),
            false => None,
        };
        Ok(NativePlan {
            dataset_dir,
            chunk_rows,
            hints: None,
            warned_of_hints: false,
        })
    }

    /// Starts a new plan for `epoch` in this process (opening this process's hint
    /// handle the first time); whether the daemon is being told. A handle the mount
    /// would not open or greet is warned of here, once.
    fn start(&mut self, py: Python<'_>, epoch: u64) -> PyResult<bool> {
        let Some(hints) = self.own_hints() else {
            return Ok(false);
        };
        hints.start(epoch);
        let active = hints.is_active();
        self.warn_once(py)?;
        Ok(active)
    }

    /// Appends `steps` (each the rows of one step) to the plan, then says the reader is
    /// in step `reading` if given. Warns once of a hint failure met so far.
    #[pyo3(signature = (steps, reading=None))]
    fn advance(
        &mut self,
        py: Python<'_>,
        steps: Vec<Vec<u64>>,
        reading: Option<u64>,
    ) -> PyResult<()> {
        let Some(hints) = self.own_hints() else {
            return Ok(());
        };
        hints.advance(&steps, reading);
        self.warn_once(py)
    }

    /// Whether this process tells the daemon the plan (opens the hint file if this
    /// process has not yet).
    fn hints_active(&mut self) -> bool {
        self.own_hints().is_some_and(|h| h.is_active())
    }

    /// The first hint failure in this process since the last call, if any.
    fn take_hint_error(&mut self) -> Option<String> {
        self.own_hints()?.take_error().map(|e| e.to_string())
    }

    /// Drops a hint handle inherited from the parent process (called after a fork).
    fn forget_inherited_hints(&mut self) {
        if matches!(&self.hints, Some((owner, _)) if *owner != std::process::id()) {
            self.hints = None;
        }
    }
}

impl NativePlan {
    /// Warns of the first hint failure met so far in this process, if this plan has not
    /// warned yet.
    fn warn_once(&mut self, py: Python<'_>) -> PyResult<()> {
        let failure = self
            .hints
            .as_ref()
            .and_then(|(_, hints)| hints.pending_error());
        match failure {
            Some(error) if !self.warned_of_hints => {
                self.warned_of_hints = true;
                warn_of_hint_failure(py, "plan", &error)
            }
            _ => Ok(()),
        }
    }

    /// This process's hints, opened on first use in it; None off a mount.
    fn own_hints(&mut self) -> Option<&mut GivenOrderHints> {
        let chunk_rows = self.chunk_rows?;
        let pid = std::process::id();
        if !matches!(&self.hints, Some((owner, _)) if *owner == pid) {
            // Dropping an inherited writer closes this process's copy of the handle
            // only; the parent's plan lives on.
            let writer = HintWriter::open(&self.dataset_dir, chunk_rows);
            self.hints = Some((pid, GivenOrderHints::new(writer)));
        }
        self.hints.as_mut().map(|(_, hints)| hints)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeSampler>()?;
    m.add_class::<NativeEpoch>()?;
    m.add_class::<NativePlan>()?;
    m.add_class::<PyRowSubset>()?;
    m.add_function(wrap_pyfunction!(split_by_chunk, m)?)?;
    m.add_function(wrap_pyfunction!(read_cached_chunks, m)?)?;
    m.add("NotADatasetError", m.py().get_type::<NotADatasetError>())?;
    m.add("HintWarning", m.py().get_type::<HintWarning>())?;
    m.add(
        "DEFAULT_HINT_LOOKAHEAD",
        scdl_sampler::DEFAULT_HINT_LOOKAHEAD.get(),
    )?;
    Ok(())
}
