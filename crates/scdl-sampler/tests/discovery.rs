//! Specification of layout discovery: the three kinds of dataset directory, told apart
//! by their headers alone, and clear refusals of the ones that do not add up.

mod common;

use std::fs;
use std::num::NonZeroU64;

use common::*;
use scdl_format::layout::CHUNKED_DIR;
use scdl_format::layout::HEADER_FILE;
use scdl_sampler::{
    ChunkLayout, DatasetKind, DatasetLayout, LayoutError, DEFAULT_VIRTUAL_CHUNK_SIZE,
};

fn discover(dir: &std::path::Path) -> Result<DatasetLayout, LayoutError> {
    DatasetLayout::discover(dir, DEFAULT_VIRTUAL_CHUNK_SIZE)
}

#[test]
fn a_chunked_header_at_the_top_is_the_raw_view() {
    let dir = raw_dataset(25_382, 1000, false);
    let layout = discover(dir.path()).unwrap();
    assert_eq!(layout.kind, DatasetKind::RawView);
    assert_eq!(layout.dir, dir.path());
    assert_eq!(layout.chunks, ChunkLayout::new(25_382, 1000).unwrap());
    assert_eq!(layout.chunks.num_chunks(), 26);
    assert_eq!(layout.chunks.chunk_rows(25), 25_000..25_382);
}

#[test]
fn a_monolithic_header_over_a_chunked_original_is_the_flat_view() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(700));
    write_header(&dir.path().join(CHUNKED_DIR), &chunked_header(700, 64));
    let layout = discover(dir.path()).unwrap();
    assert_eq!(layout.kind, DatasetKind::FlatView);
    assert_eq!(layout.chunks, ChunkLayout::new(700, 64).unwrap());
    assert_eq!(layout.chunks.num_chunks(), 11);
}

#[test]
fn a_plain_monolithic_directory_gets_virtual_chunks() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(5000));
    let layout = discover(dir.path()).unwrap();
    assert_eq!(layout.kind, DatasetKind::PlainMonolithic);
    assert_eq!(layout.chunks, ChunkLayout::new(5000, 1024).unwrap());

    let custom = DatasetLayout::discover(dir.path(), NonZeroU64::new(100).unwrap()).unwrap();
    assert_eq!(custom.chunks.num_chunks(), 50);
}

#[test]
fn a_monolithic_dataset_on_a_mount_takes_the_chunks_its_hint_file_announces() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(5000));
    let hints = dir.path().join(scdl_format::hint::HINT_FILE);
    fs::write(
        &hints,
        scdl_format::hint::Announcement::new(300, []).to_string(),
    )
    .unwrap();
    let layout = DatasetLayout::discover(dir.path(), NonZeroU64::new(100).unwrap()).unwrap();
    assert_eq!(layout.kind, DatasetKind::MountedMonolithic);
    assert_eq!(
        layout.chunks,
        ChunkLayout::new(5000, 300).unwrap(),
        "the daemon's size, not the caller's"
    );

    fs::write(&hints, "").unwrap();
    let err = discover(dir.path()).unwrap_err();
    assert!(
        matches!(err, LayoutError::BadAnnouncement { ref path } if path == &hints),
        "{err}"
    );
}

#[test]
fn a_directory_without_a_header_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = discover(dir.path()).unwrap_err();
    assert!(
        matches!(err, LayoutError::Read { ref path, .. } if path == &dir.path().join(HEADER_FILE))
    );
    assert!(err.to_string().contains("header.sch"), "{err}");
}

#[test]
fn a_header_that_does_not_decode_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(HEADER_FILE), b"NOT A HEADER").unwrap();
    assert!(matches!(
        discover(dir.path()),
        Err(LayoutError::Header { .. })
    ));
}

#[test]
fn a_flat_view_whose_original_is_not_chunked_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(700));
    write_header(&dir.path().join(CHUNKED_DIR), &monolithic_header(700));
    let err = discover(dir.path()).unwrap_err();
    assert!(matches!(err, LayoutError::NotChunked { .. }));
    assert!(err.to_string().contains(".chunked/header.sch"), "{err}");
}

#[test]
fn a_flat_view_without_its_original_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(700));
    fs::create_dir(dir.path().join(CHUNKED_DIR)).unwrap();
    assert!(matches!(
        discover(dir.path()),
        Err(LayoutError::Read { .. })
    ));
}

#[test]
fn views_that_disagree_on_the_row_count_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(700));
    write_header(&dir.path().join(CHUNKED_DIR), &chunked_header(699, 64));
    assert!(matches!(
        discover(dir.path()),
        Err(LayoutError::ViewsDisagree {
            flat_rows: 700,
            chunked_rows: 699
        })
    ));
}

#[test]
fn a_chunk_description_that_contradicts_itself_is_refused() {
    let mut wrong_count = chunked_header(1000, 100);
    wrong_count.chunked.as_mut().unwrap().num_chunks = 11;
    let mut wrong_rows = chunked_header(1000, 100);
    wrong_rows.chunked.as_mut().unwrap().total_rows = 990;
    let mut zero_size = chunked_header(1000, 100);
    zero_size.chunked.as_mut().unwrap().chunk_size = 0;
    for header in [wrong_count, wrong_rows, zero_size] {
        let dir = tempfile::tempdir().unwrap();
        write_header(dir.path(), &header);
        let err = discover(dir.path()).unwrap_err();
        assert!(matches!(err, LayoutError::Inconsistent { .. }), "{err}");
    }
}

#[test]
fn a_row_index_without_its_final_offset_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut header = monolithic_header(0);
    header.arrays[2].length = 0;
    write_header(dir.path(), &header);
    assert!(matches!(
        discover(dir.path()),
        Err(LayoutError::Inconsistent { .. })
    ));
}

#[test]
fn chunk_ids_must_fit_the_hint_protocol() {
    assert!(matches!(
        ChunkLayout::new(10, 0),
        Err(LayoutError::ZeroChunkSize)
    ));
    assert!(ChunkLayout::new(u32::MAX as u64, 1).is_ok());
    assert!(matches!(
        ChunkLayout::new(u32::MAX as u64 + 1, 1),
        Err(LayoutError::TooManyChunks { .. })
    ));
}
