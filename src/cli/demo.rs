//! `scdlfs demo`: the whole path on one machine with no cloud account. A synthetic
//! chunked dataset is written to a local folder standing in for a bucket, mounted with
//! a cache smaller than the dataset, and read for one epoch through the flat view's
//! memory maps in shuffled chunk-window order, with hints, exactly as a training loop
//! would; every row is checked against its source and the figures are printed.

use anyhow::{anyhow, Context};
use std::fs::File;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use memmap2::Mmap;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use scdl_format::layout::HEADER_FILE;
use scdl_format::{ArrayKind, Dtype, Header};
use scdl_sampler::{
    ChunkWindowOrder, DatasetLayout, Order, Sampler, Shard, Workers, DEFAULT_VIRTUAL_CHUNK_SIZE,
};

use crate::catalog::DirMode;
use crate::mount::{Mount, MountSettings};
use crate::status::Status;
use crate::synthetic::SyntheticDataset;
use crate::units::format_size;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Rows in the synthetic dataset.
    #[arg(long, default_value_t = 60_000)]
    rows: u64,
    /// Rows per chunk.
    #[arg(long, default_value_t = 2048)]
    chunk_rows: u32,
    /// Chunks per window of the chunk-window order.
    #[arg(long, default_value_t = 2)]
    chunks_per_window: u32,
    /// Working directory (bucket folder, mountpoint, cache) [default: a temporary one].
    #[arg(long)]
    workdir: Option<PathBuf>,
}

const DATASET: &str = "demo_dataset";

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    super::logging::init(&super::logging::LogSettings::stderr("warn"))?;
    let (_temp, workdir) = match &args.workdir {
        Some(dir) => (None, dir.clone()),
        None => {
            let temp = tempfile::tempdir().map_err(anyhow::Error::msg)?;
            let path = temp.path().to_owned();
            (Some(temp), path)
        }
    };
    let (bucket, mountpoint, cache_dir) = (
        workdir.join("bucket"),
        workdir.join("mnt"),
        workdir.join("cache"),
    );
    for dir in [&bucket, &mountpoint, &cache_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    }
    let spec = SyntheticDataset {
        rows: args.rows,
        genes: 20_000,
        chunk_rows: args.chunk_rows,
        mean_values: 300,
        seed: 2026,
    };
    let dataset_bytes = write_dataset(&spec, &bucket.join(DATASET))?;

    let part_size = 1 << 20;
    let cache_bytes = (dataset_bytes * 2 / 5).max(16 * part_size);
    let store = Arc::new(LocalFileSystem::new_with_prefix(&bucket).map_err(anyhow::Error::msg)?);
    let settings = settings(&bucket, &cache_dir, cache_bytes, part_size);
    let mount = Mount::start(store, ObjectPath::default(), &mountpoint, &settings)
        .map_err(anyhow::Error::msg)?;
    println!(
        "mounted {} at {} with a {} cache (less than the dataset)",
        settings.fs_name,
        mountpoint.display(),
        format_size(cache_bytes)
    );
    let outcome = read_epoch(&mountpoint.join(DATASET), &spec, args.chunks_per_window);
    let status = mount.status();
    mount.unmount().context("unmount")?;
    print_figures(&outcome?, &status);
    Ok(())
}

/// Writes `spec` as a chunked dataset at `dir`; its bytes.
fn write_dataset(spec: &SyntheticDataset, dir: &Path) -> anyhow::Result<u64> {
    let started = Instant::now();
    spec.write_chunked(dir).map_err(anyhow::Error::msg)?;
    let dataset_bytes = crate::synthetic::stored_bytes(dir);
    println!(
        "wrote a chunked dataset: {} rows, {} values, {} in {} chunks ({:.1} s)",
        spec.rows,
        spec.total_values(),
        format_size(dataset_bytes),
        spec.rows.div_ceil(spec.chunk_rows as u64),
        started.elapsed().as_secs_f64()
    );
    Ok(dataset_bytes)
}

/// The demo's mount of the folder `bucket`, with a cache of `cache_bytes` in
/// `cache_dir`.
fn settings(bucket: &Path, cache_dir: &Path, cache_bytes: u64, part_size: u64) -> MountSettings {
    MountSettings {
        fs_name: format!("file://{}", bucket.display()),
        endpoint: None,
        view: DirMode::Discover,
        cache_dir: cache_dir.to_owned(),
        cache_reset: false,
        cache_bytes,
        max_cached_chunks: None,
        part_size,
        max_concurrent_requests: 8,
        allow_other: false,
        allow_root: false,
        ownership: crate::fs::Ownership::of_mounting_user(),
        fuse_threads: 4,
        prefetch_lookahead_steps: 2,
        read_timeout: crate::store::NetworkBounds::default().read_timeout,
        fetch_memory: 64 * part_size,
        read_ahead: None,
        cache_read_around: super::mount_cmd::default_read_around(cache_dir),
        metadata_ttl: None,
        users: Arc::new(crate::users::Users::unwatched()),
        keys_in_order: false,
    }
}

/// The epoch's figures and the mount's, as the demo prints them.
fn print_figures(epoch: &Epoch, status: &Status) {
    let c = &status.counters;
    println!(
        "read one epoch in shuffled chunk-window order: {} rows in {:.2} s = {:.0} rows/s, {}/s; first row after {:.1} ms",
        epoch.rows,
        epoch.seconds,
        epoch.rows as f64 / epoch.seconds,
        format_size((epoch.bytes as f64 / epoch.seconds) as u64),
        epoch.first_row_ms
    );
    println!(
        "every row matched its source ({} values checked)",
        epoch.values
    );
    println!(
        "network: {} fetched in {} parts; {} reads waited ({:.1} ms mean), {} prefetch hits",
        format_size(c.bytes_fetched),
        c.parts_fetched,
        c.demand_wait_seconds.count,
        1000.0 * c.demand_wait_seconds.mean(),
        c.prefetch_hits
    );
    println!(
        "cache: {} of {} held at the end, {} parts evicted, {} not cached for lack of room; unmounted cleanly",
        format_size(status.cache.cached_bytes),
        format_size(status.cache.budget_bytes),
        status.cache.evicted_parts,
        status.cache.parts_not_cached_for_lack_of_room
    );
}

struct Epoch {
    rows: u64,
    values: u64,
    bytes: u64,
    seconds: f64,
    first_row_ms: f64,
}

/// Reads every row of one epoch through memory maps of the flat view, as the released
/// SCDL reader does, checking each against the generator.
fn read_epoch(
    dataset: &Path,
    spec: &SyntheticDataset,
    chunks_per_window: u32,
) -> anyhow::Result<Epoch> {
    let header_bytes = std::fs::read(dataset.join(HEADER_FILE)).map_err(anyhow::Error::msg)?;
    let header = Header::decode(&header_bytes).map_err(anyhow::Error::msg)?;
    let [data_info, row_info, col_info] = header.csr_arrays().map_err(anyhow::Error::msg)?;
    let map = |kind: ArrayKind| -> anyhow::Result<Mmap> {
        let file = File::open(dataset.join(kind.file_name())).map_err(anyhow::Error::msg)?;
        // SAFETY: the mount's files are immutable while it is mounted.
        Ok(unsafe { Mmap::map(&file) }?)
    };
    let (data, row_ptr, col_ptr) = (
        map(ArrayKind::Data)?,
        map(ArrayKind::RowPtr)?,
        map(ArrayKind::ColPtr)?,
    );
    if data_info.dtype != Dtype::F32 {
        return Err(anyhow!("unexpected value type {}", data_info.dtype));
    }
    let layout =
        DatasetLayout::discover(dataset, DEFAULT_VIRTUAL_CHUNK_SIZE).map_err(anyhow::Error::msg)?;
    let order = Order::ChunkWindows(ChunkWindowOrder {
        seed: 1,
        chunks_per_window: NonZeroU32::new(chunks_per_window.max(1)).unwrap(),
        shuffle_chunks: true,
        shuffle_within_window: true,
    });
    let mut sampler = Sampler::new(&layout, order, Shard::single(), Workers::single())
        .map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    let mut first_row_ms = None;
    let (mut rows, mut values) = (0u64, 0u64);
    let col_width = col_info.dtype.size().unwrap() as usize;
    for row in sampler.epoch(0) {
        let start = row_info.dtype.read_uint(&row_ptr, row as usize) as usize;
        let end = row_info.dtype.read_uint(&row_ptr, row as usize + 1) as usize;
        let got_values: Vec<f32> = data[start * 4..end * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got_columns: Vec<u32> = (start..end)
            .map(|i| col_info.dtype.read_uint(&col_ptr[..end * col_width], i) as u32)
            .collect();
        let want = spec.row(row);
        if got_values != want.values || got_columns != want.columns {
            return Err(anyhow!(
                "row {row} read through the mount differs from its source"
            ));
        }
        first_row_ms.get_or_insert_with(|| started.elapsed().as_secs_f64() * 1000.0);
        rows += 1;
        values += (end - start) as u64;
    }
    if rows != spec.rows {
        return Err(anyhow!("the epoch visited {rows} rows, not {}", spec.rows));
    }
    if let Some(error) = sampler.take_hint_error() {
        return Err(anyhow!("hints were refused: {error}"));
    }
    Ok(Epoch {
        rows,
        values,
        bytes: values * (4 + col_width as u64),
        seconds: started.elapsed().as_secs_f64(),
        first_row_ms: first_row_ms.unwrap_or(0.0),
    })
}
