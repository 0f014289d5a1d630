//! What a sampler costs before its first rows on an atlas-sized dataset: 10^8 rows in
//! chunks of 4096 (24,415 chunks, Tahoe-100M's size), rank 0 of 8, for each order and
//! block size, plain and cache-aware (every other chunk held, the most ranges a
//! cache can announce). For each case, in a process of its own: the time from building
//! the sampler to its first 10,000 indices, and how much the process's resident set
//! grew over it (current and peak). The dataset directory has a hint file (a regular
//! file, so the hints are encoded and written as on a mount, and nothing reads them),
//! and the time includes waiting until the hints of those indices are written. Run: `cargo run --release -p scdl-sampler
//! --example sampler_footprint`.
//!
//! Only the sampler's public interface is used, so that the same file measures an
//! older version of the crate too.
//!
//! `sampler_footprint write-header DIR` writes the header of such a dataset (a raw
//! view: the chunked `header.sch` alone, which is all a sampler reads) for
//! `bench/sampler_footprint.py`, which measures the Python samplers on it.

use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;
use std::time::Instant;

use scdl_format::{ArrayInfo, Backend, ChunkedInfo, Dtype, Header};
use scdl_sampler::{
    BlockOrder, CachedChunks, ChunkLayout, ChunkWindowOrder, DatasetKind, DatasetLayout,
    EvenShares, Order, Sampler, Shard, Workers,
};

const ROWS: u64 = 100_000_000;
const CHUNK_ROWS: u64 = 4096;
const WORLD_SIZE: u32 = 8;
const FIRST_INDICES: usize = 10_000;

fn orders() -> Vec<(&'static str, Order)> {
    let blocks = |block_size, batch_size, fetch_factor| {
        Order::Blocks(BlockOrder {
            seed: 0,
            block_size: NonZeroU64::new(block_size).unwrap(),
            batch_size: NonZeroU64::new(batch_size).unwrap(),
            fetch_factor: NonZeroU64::new(fetch_factor).unwrap(),
        })
    };
    vec![
        (
            "windows of 4 chunks",
            Order::ChunkWindows(ChunkWindowOrder {
                seed: 0,
                chunks_per_window: NonZeroU32::new(4).unwrap(),
                shuffle_chunks: true,
                shuffle_within_window: true,
            }),
        ),
        ("blocks of 32, batch 64 x fetch 16", blocks(32, 64, 16)),
        ("blocks of 1, batch 256 x fetch 16", blocks(1, 256, 16)),
        ("blocks of 1, batch 64 x fetch 16", blocks(1, 64, 16)),
    ]
}

/// Kilobytes of the process's resident set: now and at its peak.
fn resident_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn measure(case: usize, cache_aware: bool) {
    let (name, order) = orders()[case];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(scdl_format::hint::HINT_FILE), b"").unwrap();
    let layout = DatasetLayout {
        dir: dir.path().to_owned(),
        kind: DatasetKind::RawView,
        chunks: ChunkLayout::new(ROWS, CHUNK_ROWS).unwrap(),
    };
    let shard = Shard::new(0, NonZeroU32::new(WORLD_SIZE).unwrap(), EvenShares::Pad).unwrap();
    let (rss_before, peak_before) = resident_kib();
    let started = Instant::now();
    let mut sampler = Sampler::new(&layout, order, shard, Workers::single()).unwrap();
    if cache_aware {
        let every_other = (0..layout.chunks.num_chunks()).step_by(2).map(|c| c..c + 1);
        sampler.set_cache_aware_order(Some(CachedChunks::from_ranges(every_other)));
    }
    let epoch_rows = sampler.rows_in_epoch(0);
    let first: Vec<u64> = sampler.epoch(0).take(FIRST_INDICES).collect();
    sampler.flush_hints();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(sampler.take_hint_error().is_none());
    let hinted = std::fs::metadata(dir.path().join(scdl_format::hint::HINT_FILE)).unwrap();
    let (rss_after, peak_after) = resident_kib();
    assert_eq!(first.len(), FIRST_INDICES);
    println!(
        "| {name} | {} | {elapsed:.4} | {:+.1} | {:+.1} | {epoch_rows} | {:.1} |",
        if cache_aware {
            "half, every other chunk"
        } else {
            "no"
        },
        (rss_after as f64 - rss_before as f64) / 1024.0,
        (peak_after as f64 - peak_before as f64) / 1024.0,
        hinted.len() as f64 / 1024.0,
    );
}

/// The chunked header of the dataset measured: arrays of a few values per row.
fn atlas_header() -> Header {
    let array = |name: &str, length, dtype| ArrayInfo {
        name: name.into(),
        length,
        dtype,
        shape: None,
    };
    Header {
        version: (0, 1, 0),
        endianness: 1,
        backend: Backend::Chunked,
        arrays: vec![
            array("DATA", ROWS * 3, Dtype::F32),
            array("COLPTR", ROWS * 3, Dtype::U32),
            array("ROWPTR", ROWS + 1, Dtype::U64),
        ],
        feature_indices: Vec::new(),
        chunked: Some(ChunkedInfo {
            chunk_size: CHUNK_ROWS as u32,
            num_chunks: ROWS.div_ceil(CHUNK_ROWS) as u32,
            total_rows: ROWS,
        }),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.as_slice() {
        [_, write, dir] if write == "write-header" => {
            std::fs::create_dir_all(dir).unwrap();
            let path = PathBuf::from(dir).join(scdl_format::layout::HEADER_FILE);
            std::fs::write(path, atlas_header().encode()).unwrap();
            return;
        }
        [_, case, aware] => {
            measure(case.parse().unwrap(), aware == "aware");
            return;
        }
        _ => {}
    }
    println!(
        "{ROWS} rows in chunks of {CHUNK_ROWS}, rank 0 of {WORLD_SIZE}: building the sampler, its \
         rows in epoch 0 and its first {FIRST_INDICES} indices, each in a fresh process\n"
    );
    println!(
        "| order | cache-aware | seconds | resident MiB | peak resident MiB | rows of rank 0 | \
         hints written, KiB |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let me = std::env::current_exe().unwrap();
    for case in 0..orders().len() {
        for aware in ["plain", "aware"] {
            let status = std::process::Command::new(&me)
                .args([case.to_string(), aware.to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
}
