//! One epoch through a dataset directory, the same logic for every system: the order
//! comes from `scdl-sampler`, each row is read from memory maps of the arrays (the flat
//! view's monolithic arrays, or the chunk arrays of a chunked layout) and checked
//! against the generator's digest.

use std::fs::File;
use std::io::Write;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use memmap2::Mmap;
use scdl_format::layout::{chunk_dir_name, HEADER_FILE};
use scdl_format::{ArrayKind, Dtype, Header};
use scdl_sampler::{
    BlockOrder, CachedChunks, ChunkLayout, ChunkWindowOrder, DatasetKind, DatasetLayout,
    EvenShares, Order, Sampler, Shard, Workers, DEFAULT_VIRTUAL_CHUNK_SIZE,
};

use crate::lockstep::Lockstep;
use serde::Serialize;

use crate::gen::digest;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OrderKind {
    /// Shuffled windows of 4 chunks, rows shuffled inside each window.
    Windows,
    /// scDataset: blocks of 32 rows, 32 blocks per fetch, minibatches of 64.
    Blocks,
    /// True random: minibatches of 64 rows drawn uniformly (blocks of one row).
    Random,
}

/// Which epoch of which order: the arguments `read` and `order` share.
#[derive(Args)]
pub struct EpochArgs {
    #[arg(long, value_enum)]
    order: OrderKind,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Chunks per window of the windows order (the large-chunk case reads windows of 2).
    #[arg(long, default_value_t = 4)]
    chunks_per_window: u32,
    /// Minibatches per step of the random order (1: a step per minibatch; the
    /// small-cache case reads steps of 16, as scDataset's fetch factor).
    #[arg(long, default_value_t = 1)]
    random_fetch_factor: u64,
}

impl EpochArgs {
    fn order(&self) -> Result<Order, String> {
        let chunks_per_window = NonZeroU32::new(self.chunks_per_window)
            .ok_or("--chunks-per-window must be at least 1")?;
        let fetch_factor = NonZeroU64::new(self.random_fetch_factor)
            .ok_or("--random-fetch-factor must be at least 1")?;
        Ok(self.order.order(self.seed, chunks_per_window, fetch_factor))
    }
}

impl OrderKind {
    pub fn order(
        self,
        seed: u64,
        chunks_per_window: NonZeroU32,
        random_fetch_factor: NonZeroU64,
    ) -> Order {
        let n64 = |n| NonZeroU64::new(n).unwrap();
        match self {
            OrderKind::Windows => Order::ChunkWindows(ChunkWindowOrder {
                seed,
                chunks_per_window,
                shuffle_chunks: true,
                shuffle_within_window: true,
            }),
            OrderKind::Blocks => Order::Blocks(BlockOrder {
                seed,
                block_size: n64(32),
                batch_size: n64(64),
                fetch_factor: n64(32),
            }),
            OrderKind::Random => Order::Blocks(BlockOrder {
                seed,
                block_size: n64(1),
                batch_size: n64(64),
                fetch_factor: random_fetch_factor,
            }),
        }
    }
}

#[derive(Args)]
pub struct ReadArgs {
    /// The dataset directory (flat view, raw view, or a local chunked archive).
    #[arg(long)]
    dataset: PathBuf,
    /// The row digests written by `gen`.
    #[arg(long)]
    digests: PathBuf,
    #[command(flatten)]
    epoch: EpochArgs,
    #[command(flatten)]
    shard: ShardArgs,
    /// Do not announce the order, even where the directory has a hint file.
    #[arg(long)]
    no_hints: bool,
    /// Read the chunks the daemon announces it holds first (the cache-aware order).
    #[arg(long)]
    cache_aware: bool,
    /// Stop after this many seconds (the epoch is then reported as incomplete).
    #[arg(long)]
    time_limit: Option<f64>,
    /// A row read slower than this counts as a stall, in milliseconds.
    #[arg(long, default_value_t = 1.0)]
    stall_ms: f64,
    /// Read in lockstep with the other ranks, as DDP trains: they meet through this file
    /// (the world size × 8 zero bytes, made by the driver) every `--lockstep-rows` rows.
    #[arg(long)]
    lockstep: Option<PathBuf>,
    #[arg(long, default_value_t = 64)]
    lockstep_rows: u64,
}

#[derive(Serialize)]
struct EpochFigures {
    rows: u64,
    epoch_rows: u64,
    completed: bool,
    seconds: f64,
    rows_per_s: f64,
    first_row_s: f64,
    /// Of `first_row_s`, the first row's own read (the rest is the start: the
    /// dataset's discovery and opening, the sampler's plan).
    first_row_read_s: f64,
    stall_s: f64,
    /// The slowest row read, in seconds.
    slowest_row_s: f64,
    bytes_read: u64,
    hints: bool,
    view: String,
    /// Chunks announced as held, read first (the cache-aware order only).
    chunks_read_first: Option<u64>,
    /// In lockstep: the time this rank waited for the others at the steps.
    lockstep_waited_s: Option<f64>,
}

/// Monolithic arrays (flat view) or chunk arrays mapped as first touched.
enum Arrays {
    Flat {
        data: Mmap,
        row_ptr: Mmap,
        col_ptr: Mmap,
    },
    Chunked {
        dir: PathBuf,
        chunk_size: u64,
        chunks: Vec<OnceLock<[Mmap; 3]>>,
    },
}

struct Dataset {
    arrays: Arrays,
    row_dtype: Dtype,
    col_width: usize,
}

fn map(path: &Path) -> Result<Mmap, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: the benchmark's files are not modified while it reads them.
    unsafe { Mmap::map(&file) }.map_err(|e| format!("mmap {}: {e}", path.display()))
}

impl Dataset {
    fn open(layout: &DatasetLayout) -> Result<Dataset, String> {
        let dir = &layout.dir;
        let header_path = dir.join(HEADER_FILE);
        let header = Header::decode(&std::fs::read(&header_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let [data, rows, cols] = header.csr_arrays().map_err(|e| e.to_string())?;
        if data.dtype != Dtype::F32 {
            return Err(format!("unexpected value type {}", data.dtype));
        }
        let arrays = match layout.kind {
            DatasetKind::FlatView
            | DatasetKind::PlainMonolithic
            | DatasetKind::MountedMonolithic => Arrays::Flat {
                data: map(&dir.join(ArrayKind::Data.file_name()))?,
                row_ptr: map(&dir.join(ArrayKind::RowPtr.file_name()))?,
                col_ptr: map(&dir.join(ArrayKind::ColPtr.file_name()))?,
            },
            DatasetKind::RawView => Arrays::Chunked {
                dir: dir.clone(),
                chunk_size: layout.chunks.chunk_size(),
                chunks: (0..layout.chunks.num_chunks())
                    .map(|_| OnceLock::new())
                    .collect(),
            },
        };
        Ok(Dataset {
            arrays,
            row_dtype: rows.dtype,
            col_width: cols.dtype.size().unwrap() as usize,
        })
    }

    /// The bytes of a row's values and column ids.
    fn row(&self, row: u64) -> Result<(&[u8], &[u8]), String> {
        let (data, row_ptr, col_ptr, local) = match &self.arrays {
            Arrays::Flat {
                data,
                row_ptr,
                col_ptr,
            } => (data, row_ptr, col_ptr, row),
            Arrays::Chunked {
                dir,
                chunk_size,
                chunks,
            } => {
                let chunk = (row / chunk_size) as usize;
                let maps = match chunks[chunk].get() {
                    Some(maps) => maps,
                    None => {
                        let cdir = dir.join(chunk_dir_name(chunk as u32));
                        let maps = [
                            map(&cdir.join(ArrayKind::Data.file_name()))?,
                            map(&cdir.join(ArrayKind::RowPtr.file_name()))?,
                            map(&cdir.join(ArrayKind::ColPtr.file_name()))?,
                        ];
                        chunks[chunk].get_or_init(|| maps)
                    }
                };
                (&maps[0], &maps[1], &maps[2], row % chunk_size)
            }
        };
        let start = self.row_dtype.read_uint(row_ptr, local as usize) as usize;
        let end = self.row_dtype.read_uint(row_ptr, local as usize + 1) as usize;
        let w = self.col_width;
        if end < start || end * 4 > data.len() || end * w > col_ptr.len() {
            return Err(format!("row {row}: offsets {start}..{end} out of bounds"));
        }
        Ok((&data[start * 4..end * 4], &col_ptr[start * w..end * w]))
    }
}

pub fn run(args: ReadArgs) -> Result<(), String> {
    let started = Instant::now();
    let digests = std::fs::read(&args.digests).map_err(|e| e.to_string())?;
    let digest_of = |row: u64| {
        let at = row as usize * 8;
        u64::from_le_bytes(digests[at..at + 8].try_into().unwrap())
    };
    let layout = DatasetLayout::discover(&args.dataset, DEFAULT_VIRTUAL_CHUNK_SIZE)
        .map_err(|e| e.to_string())?;
    if layout.chunks.total_rows() * 8 != digests.len() as u64 {
        return Err(format!(
            "{} has {} rows but the digests are for {}",
            args.dataset.display(),
            layout.chunks.total_rows(),
            digests.len() / 8
        ));
    }
    let dataset = Dataset::open(&layout)?;
    let order = args.epoch.order()?;
    let shard = args.shard.shard()?;
    let sampler = if args.no_hints {
        Sampler::without_hints(&layout, order, shard, Workers::single())
    } else {
        Sampler::new(&layout, order, shard, Workers::single())
    };
    let mut sampler = sampler.map_err(|e| e.to_string())?;
    let mut chunks_read_first = None;
    if args.cache_aware {
        let held = CachedChunks::read_from(&args.dataset)
            .map_err(|e| e.to_string())?
            .ok_or("--cache-aware: the hint file announces no cache (not a mount?)")?;
        chunks_read_first = Some(
            held.ranges()
                .iter()
                .map(|r| u64::from(r.end - r.start))
                .sum(),
        );
        sampler.set_cache_aware_order(Some(held));
    }
    let hints = sampler.hints_active();
    let limit = args.time_limit.map(Duration::from_secs_f64);
    let stall_threshold = Duration::from_secs_f64(args.stall_ms / 1000.0);
    let (mut rows, mut bytes, mut stall, mut slowest) =
        (0u64, 0u64, Duration::ZERO, Duration::ZERO);
    let mut first_row = None;
    let mut out_of_time = false;
    let mut lockstep = match &args.lockstep {
        Some(path) => Some(Lockstep::join(
            path,
            args.shard.rank,
            args.shard.world_size,
        )?),
        None => None,
    };
    let mut iter = sampler.epoch(args.epoch.epoch);
    let epoch_rows = iter.len() as u64;
    'epoch: while let Some(batch) = iter.next_minibatch() {
        for row in batch {
            let t0 = Instant::now();
            let (values, columns) = dataset.row(row)?;
            if digest(values, columns) != digest_of(row) {
                return Err(format!(
                    "row {row} read from {} differs from the generator's",
                    args.dataset.display()
                ));
            }
            let took = t0.elapsed();
            slowest = slowest.max(took);
            if took > stall_threshold {
                stall += took;
            }
            first_row.get_or_insert_with(|| (started.elapsed(), took));
            rows += 1;
            bytes += (values.len() + columns.len()) as u64;
            if let Some(lockstep) = lockstep.as_mut() {
                if rows % args.lockstep_rows == 0 {
                    lockstep.step_done()?;
                }
            }
            if limit.is_some_and(|l| started.elapsed() >= l) {
                out_of_time = true;
                break 'epoch;
            }
        }
    }
    drop(iter);
    if let Some(lockstep) = &lockstep {
        lockstep.leave()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(error) = sampler.take_hint_error() {
        return Err(format!("hints were refused: {error}"));
    }
    if !out_of_time && rows != epoch_rows {
        return Err(format!("the epoch yielded {rows} rows, not {epoch_rows}"));
    }
    let figures = EpochFigures {
        rows,
        epoch_rows,
        completed: rows == epoch_rows,
        seconds,
        rows_per_s: rows as f64 / seconds,
        first_row_s: first_row.map_or(seconds, |(at, _)| at.as_secs_f64()),
        first_row_read_s: first_row.map_or(0.0, |(_, took)| took.as_secs_f64()),
        stall_s: stall.as_secs_f64(),
        slowest_row_s: slowest.as_secs_f64(),
        bytes_read: bytes,
        hints,
        view: layout.kind.to_string(),
        chunks_read_first,
        lockstep_waited_s: lockstep.map(|l| l.waited.as_secs_f64()),
    };
    println!("{}", serde_json::to_string(&figures).unwrap());
    Ok(())
}

#[derive(Args)]
pub struct OrderArgs {
    #[arg(long)]
    rows: u64,
    #[arg(long)]
    chunk_rows: u64,
    #[command(flatten)]
    epoch: EpochArgs,
    #[command(flatten)]
    shard: ShardArgs,
    /// Output: per step, its row count then its rows, all u64 little-endian.
    #[arg(long)]
    out: PathBuf,
    /// The cache-aware order, with chunks `[START, END)` announced as held (repeat
    /// for several ranges).
    #[arg(long, num_args = 2, value_names = ["START", "END"])]
    cached: Vec<u32>,
}

/// Which share of the epoch a process reads: rank `rank` of `world_size`, as the
/// samplers shard it (the Python package's tests compare shards; the bench's node
/// scenario runs one reader per rank on one mount).
#[derive(Args)]
pub struct ShardArgs {
    #[arg(long, default_value_t = 0)]
    rank: u32,
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    /// How the ranks' shares are evened out.
    #[arg(long, value_enum, default_value_t = Even::Uneven)]
    even: Even,
}

impl ShardArgs {
    fn shard(&self) -> Result<Shard, String> {
        let even = match self.even {
            Even::Uneven => EvenShares::Uneven,
            Even::Pad => EvenShares::Pad,
            Even::Drop => EvenShares::Drop,
        };
        let world_size =
            NonZeroU32::new(self.world_size).ok_or("--world-size must be at least 1")?;
        Shard::new(self.rank, world_size, even).map_err(|e| e.to_string())
    }
}

/// [`EvenShares`] on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Even {
    Uneven,
    Pad,
    Drop,
}

/// The epoch's steps exactly as `read` visits them, for readers outside Rust.
pub fn order(args: OrderArgs) -> Result<(), String> {
    let chunks = ChunkLayout::new(args.rows, args.chunk_rows).map_err(|e| e.to_string())?;
    let layout = DatasetLayout {
        dir: PathBuf::new(),
        kind: DatasetKind::RawView,
        chunks,
    };
    let shard = args.shard.shard()?;
    let mut sampler =
        Sampler::without_hints(&layout, args.epoch.order()?, shard, Workers::single())
            .map_err(|e| e.to_string())?;
    if !args.cached.is_empty() {
        let ranges = args.cached.chunks(2).map(|pair| pair[0]..pair[1]);
        sampler.set_cache_aware_order(Some(CachedChunks::from_ranges(ranges)));
    }
    let mut iter = sampler.epoch(args.epoch.epoch);
    let steps: Vec<u64> = iter.share().iter().map(|s| s.rows).collect();
    let mut out = Vec::new();
    for step_rows in steps {
        out.extend_from_slice(&step_rows.to_le_bytes());
        for _ in 0..step_rows {
            let row = iter.next().ok_or("the epoch ended early")?;
            out.extend_from_slice(&row.to_le_bytes());
        }
    }
    File::create(&args.out)
        .and_then(|mut f| f.write_all(&out))
        .map_err(|e| e.to_string())
}
