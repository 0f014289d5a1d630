//! Strategies and fixtures shared by the specification tests.

#![allow(dead_code)] // each test file uses its own part of this module

use std::fs;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::Path;

use proptest::prelude::*;
use scdl_format::hint::{HintDecoder, HintLine, HINT_FILE};
use scdl_format::layout::HEADER_FILE;
use scdl_format::{ArrayInfo, Backend, ChunkedInfo, Dtype, FeatureIndexInfo, Header};
use scdl_sampler::{BlockOrder, ChunkLayout, ChunkWindowOrder, Order};

pub fn chunk_layouts() -> impl Strategy<Value = ChunkLayout> {
    (0u64..1500, 1u64..200).prop_map(|(rows, size)| ChunkLayout::new(rows, size).unwrap())
}

pub fn window_orders() -> impl Strategy<Value = Order> {
    (any::<u64>(), 1u32..6, any::<bool>(), any::<bool>()).prop_map(
        |(seed, per_window, shuffle_chunks, shuffle_within_window)| {
            Order::ChunkWindows(ChunkWindowOrder {
                seed,
                chunks_per_window: NonZeroU32::new(per_window).unwrap(),
                shuffle_chunks,
                shuffle_within_window,
            })
        },
    )
}

pub fn block_orders() -> impl Strategy<Value = Order> {
    (any::<u64>(), 1u64..40, 1u64..50, 1u64..6).prop_map(|(seed, block, batch, factor)| {
        Order::Blocks(BlockOrder {
            seed,
            block_size: NonZeroU64::new(block).unwrap(),
            batch_size: NonZeroU64::new(batch).unwrap(),
            fetch_factor: NonZeroU64::new(factor).unwrap(),
        })
    })
}

pub fn orders() -> impl Strategy<Value = Order> {
    prop_oneof![window_orders(), block_orders()]
}

pub fn window_order(seed: u64, chunks_per_window: u32) -> Order {
    Order::ChunkWindows(ChunkWindowOrder {
        seed,
        chunks_per_window: NonZeroU32::new(chunks_per_window).unwrap(),
        shuffle_chunks: true,
        shuffle_within_window: true,
    })
}

pub fn block_order(seed: u64, block_size: u64, batch_size: u64, fetch_factor: u64) -> Order {
    Order::Blocks(BlockOrder {
        seed,
        block_size: NonZeroU64::new(block_size).unwrap(),
        batch_size: NonZeroU64::new(batch_size).unwrap(),
        fetch_factor: NonZeroU64::new(fetch_factor).unwrap(),
    })
}

pub fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// The header of a monolithic archive of `rows` rows.
pub fn monolithic_header(rows: u64) -> Header {
    let array = |name: &str, length, dtype| ArrayInfo {
        name: name.into(),
        length,
        dtype,
        shape: None,
    };
    Header {
        version: (0, 1, 0),
        endianness: 1,
        backend: Backend::Monolithic,
        arrays: vec![
            array("DATA", rows * 3, Dtype::F32),
            array("COLPTR", rows * 3, Dtype::U16),
            array("ROWPTR", rows + 1, Dtype::U64),
        ],
        feature_indices: vec![FeatureIndexInfo {
            name: "var_features".into(),
            length: 100,
            dtype: Dtype::String,
            files: vec!["dataframe_00.parquet".into()],
            shape: None,
        }],
        chunked: None,
    }
}

/// The header of the chunked archive of `rows` rows in chunks of `chunk_size`.
pub fn chunked_header(rows: u64, chunk_size: u32) -> Header {
    Header {
        backend: Backend::Chunked,
        chunked: Some(ChunkedInfo {
            chunk_size,
            num_chunks: rows.div_ceil(chunk_size as u64) as u32,
            total_rows: rows,
        }),
        ..monolithic_header(rows)
    }
}

pub fn write_header(dir: &Path, header: &Header) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(HEADER_FILE), header.encode()).unwrap();
}

/// A temporary raw-view dataset; with an (empty, regular) hint file if `hints`.
pub fn raw_dataset(rows: u64, chunk_size: u32, hints: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &chunked_header(rows, chunk_size));
    if hints {
        fs::write(dir.path().join(HINT_FILE), b"").unwrap();
    }
    dir
}

/// Everything written to the dataset's hint file, decoded as the daemon decodes it.
pub fn hint_lines(dataset: &Path) -> Vec<HintLine> {
    let bytes = fs::read(dataset.join(HINT_FILE)).unwrap();
    HintDecoder::default().feed(&bytes).unwrap()
}
