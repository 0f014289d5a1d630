//! Bad input gets a clear error and never wrong bytes, and the mount keeps serving
//! everything else:
//! - a chunked dataset whose objects disagree with each other or with its header is not
//!   presented flat: its directory shows the objects exactly as stored, and the daemon
//!   logs an error naming the object;
//! - corrupt row offsets inside a chunk fail the reads that touch that chunk with EIO,
//!   while reads of the other chunks return the right bytes;
//! - an object that changes, shrinks or fails in the store after it was listed fails
//!   its reads with EIO (never short or zero-filled data), and a fault that goes away
//!   is not remembered;
//! - garbage written to a hint file fails that write with EINVAL and nothing else.

use crate::common;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use common::s3::{moto, unique_bucket};
use common::*;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use scdl_format::hint::HINT_FILE;
use scdl_format::layout::{CHUNKED_DIR, HEADER_FILE};
use scdl_format::{ArrayKind, Backend, Dtype, Header};
use scdlfs::store::faulty::{Fault, InjectFaults};
use scdlfs::store::wrapper::HookedStore;
use scdlfs::synthetic::SyntheticDataset;

// ---------------------------------------------------------------------------------------
// Harness: the daemon's log, reads that report errors, sources with damage.

/// Everything the daemon logs in this test binary (tests tell their lines apart by the
/// dataset and object names, which are unique per test).
fn logs() -> String {
    struct Writer(Arc<Mutex<Vec<u8>>>);
    impl Write for Writer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    // Installed inside the once-cell, so no test mounts before the subscriber is there.
    let log = LOG.get_or_init(|| {
        let log = Arc::<Mutex<Vec<u8>>>::default();
        let sink = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || Writer(sink.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        log
    });
    String::from_utf8_lossy(&log.lock().unwrap()).into_owned()
}

/// Starts capturing the daemon's log; call before mounting.
fn capture_logs() {
    logs();
}

/// Asserts that one line of the log is an ERROR containing every one of `needles`.
fn assert_logged_error(needles: &[&str]) {
    let log = logs();
    assert!(
        log.lines()
            .any(|line| line.contains("ERROR") && needles.iter().all(|n| line.contains(n))),
        "no ERROR line mentions all of {needles:?}; the errors logged:\n{}",
        log.lines()
            .filter(|l| l.contains("ERROR"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn errno<T>(result: io::Result<T>) -> Option<i32> {
    result.err().and_then(|e| e.raw_os_error())
}

/// `want[offset..offset + len]`, clamped to its end.
fn slice(want: &[u8], offset: u64, len: usize) -> &[u8] {
    let start = (offset as usize).min(want.len());
    &want[start..(start + len).min(want.len())]
}

/// Compares two file trees by name and bytes, without printing megabytes on failure.
#[track_caller]
fn assert_same_files(
    got: &BTreeMap<String, Vec<u8>>,
    want: &BTreeMap<String, Vec<u8>>,
    what: &str,
) {
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}: file names");
    for (name, bytes) in want {
        assert!(
            got[name] == *bytes,
            "{what}: {name} differs from the stored object"
        );
    }
}

fn write_dataset(root: &Path, name: &str, spec: &SyntheticDataset) {
    spec.write_chunked(&root.join(name)).unwrap();
}

/// A source folder with the plain files of the harness and a healthy dataset `good`.
fn source_with_good_dataset() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &plain_files());
    write_dataset(dir.path(), "good", &small_dataset());
    dir
}

/// The healthy parts of the mount still serve the right bytes: the plain files and the
/// flat view of `good`.
fn assert_the_rest_still_serves(mnt: &Path) {
    for (name, want) in plain_files() {
        assert!(std::fs::read(mnt.join(&name)).unwrap() == want, "{name}");
    }
    assert_good_still_serves(mnt);
}

fn assert_good_still_serves(mnt: &Path) {
    let mono = Monolithic::of(&small_dataset());
    for kind in ArrayKind::ALL {
        let got = std::fs::read(mnt.join("good").join(kind.file_name())).unwrap();
        assert!(got == mono.array(kind), "good/{}", kind.file_name());
    }
    let header =
        Header::decode(&std::fs::read(mnt.join("good").join(HEADER_FILE)).unwrap()).unwrap();
    assert_eq!(header.backend, Backend::Monolithic);
}

/// The dataset directory `name` is not presented flat: it shows exactly the objects
/// stored under it, byte for byte, with no flat arrays, no `.chunked/` and no hint file.
#[track_caller]
fn assert_shown_as_stored(mnt: &Path, src: &Path, name: &str) {
    let shown_dir = mnt.join(name);
    let entries: Vec<String> = std::fs::read_dir(&shown_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for virtual_entry in [
        "data.npy",
        "row_ptr.npy",
        "col_ptr.npy",
        CHUNKED_DIR,
        HINT_FILE,
    ] {
        assert!(
            !entries.iter().any(|e| e == virtual_entry),
            "{name}/{virtual_entry} is shown: {entries:?}"
        );
        assert_eq!(
            errno(std::fs::metadata(shown_dir.join(virtual_entry))),
            Some(libc::ENOENT),
            "{name}/{virtual_entry}"
        );
    }
    assert_same_files(&snapshot(&shown_dir), &snapshot(&src.join(name)), name);
}

fn edit_header(dir: &Path, edit: impl FnOnce(&mut Header)) {
    let path = dir.join(HEADER_FILE);
    let mut header = Header::decode(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut header);
    std::fs::write(&path, header.encode()).unwrap();
}

fn array_length<'a>(header: &'a mut Header, name: &str) -> &'a mut u64 {
    &mut header
        .arrays
        .iter_mut()
        .find(|a| a.name == name)
        .unwrap()
        .length
}

fn cut_file(path: &Path, bytes: u64) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(len - bytes).unwrap();
}

// ---------------------------------------------------------------------------------------
// Inconsistent datasets are shown as stored.

#[test]
fn a_chunk_array_shorter_than_its_partners_leaves_the_dataset_as_stored() {
    capture_logs();
    let src = source_with_good_dataset();
    // One value short: whole elements, but fewer values than col_ptr.npy holds.
    write_dataset(src.path(), "short_values", &small_dataset());
    cut_file(&src.path().join("short_values/chunk_00001/data.npy"), 4);
    // A torn upload: not even a whole number of elements.
    write_dataset(src.path(), "torn_columns", &small_dataset());
    cut_file(&src.path().join("torn_columns/chunk_00004/col_ptr.npy"), 1);
    // Row offsets for one row too few.
    write_dataset(src.path(), "short_offsets", &small_dataset());
    let width = Dtype::smallest_uint_for(small_dataset().total_values())
        .size()
        .unwrap();
    cut_file(
        &src.path().join("short_offsets/chunk_00002/row_ptr.npy"),
        width,
    );

    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    for name in ["short_values", "torn_columns", "short_offsets"] {
        assert_shown_as_stored(&mnt, src.path(), name);
        let header =
            Header::decode(&std::fs::read(mnt.join(name).join(HEADER_FILE)).unwrap()).unwrap();
        assert_eq!(
            header.backend,
            Backend::Chunked,
            "{name}: the header shown is the stored, chunked one"
        );
    }
    assert_logged_error(&["inconsistent", "short_values/chunk_00001/data.npy"]);
    assert_logged_error(&[
        "inconsistent",
        "torn_columns/chunk_00004/col_ptr.npy",
        "whole number",
    ]);
    assert_logged_error(&[
        "inconsistent",
        "short_offsets/chunk_00002/row_ptr.npy",
        "entries",
    ]);
    assert_the_rest_still_serves(&mnt);
}

#[test]
fn a_missing_chunk_leaves_the_dataset_as_stored() {
    capture_logs();
    let src = source_with_good_dataset();
    write_dataset(src.path(), "missing_chunk", &small_dataset());
    std::fs::remove_dir_all(src.path().join("missing_chunk/chunk_00003")).unwrap();
    write_dataset(src.path(), "missing_array", &small_dataset());
    std::fs::remove_file(src.path().join("missing_array/chunk_00008/col_ptr.npy")).unwrap();
    // A chunk beyond those the header declares is as wrong as a missing one.
    write_dataset(src.path(), "extra_chunk", &small_dataset());
    let extra = src.path().join("extra_chunk/chunk_00009");
    std::fs::create_dir(&extra).unwrap();
    for kind in ArrayKind::ALL {
        let from = src
            .path()
            .join("extra_chunk/chunk_00008")
            .join(kind.file_name());
        std::fs::copy(from, extra.join(kind.file_name())).unwrap();
    }

    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    for name in ["missing_chunk", "missing_array", "extra_chunk"] {
        assert_shown_as_stored(&mnt, src.path(), name);
    }
    assert_logged_error(&["dataset=missing_chunk", "chunk_00003/data.npy is missing"]);
    assert_logged_error(&[
        "dataset=missing_array",
        "chunk_00008/col_ptr.npy is missing",
    ]);
    assert_logged_error(&["dataset=extra_chunk", "chunk_00009/", "beyond"]);
    assert_the_rest_still_serves(&mnt);
}

#[test]
fn header_lengths_that_disagree_with_the_chunks_leave_the_dataset_as_stored() {
    capture_logs();
    let src = source_with_good_dataset();
    let spec = small_dataset();
    // One value more than the chunks hold (DATA and COLPTR agree with each other).
    write_dataset(src.path(), "more_values", &spec);
    edit_header(&src.path().join("more_values"), |h| {
        *array_length(h, "DATA") += 1;
        *array_length(h, "COLPTR") += 1;
    });
    // DATA and COLPTR disagree.
    write_dataset(src.path(), "split_lengths", &spec);
    edit_header(&src.path().join("split_lengths"), |h| {
        *array_length(h, "COLPTR") -= 1
    });
    // One row more than the chunks hold: the last chunk's row offsets come up short.
    write_dataset(src.path(), "more_rows", &spec);
    edit_header(&src.path().join("more_rows"), |h| {
        *array_length(h, "ROWPTR") += 1;
        h.chunked.as_mut().unwrap().total_rows += 1;
    });
    // A chunk count that does not follow from the rows and the chunk size.
    write_dataset(src.path(), "wrong_count", &spec);
    edit_header(&src.path().join("wrong_count"), |h| {
        h.chunked.as_mut().unwrap().num_chunks -= 1
    });
    // ROWPTR length that is not rows + 1.
    write_dataset(src.path(), "wrong_offsets", &spec);
    edit_header(&src.path().join("wrong_offsets"), |h| {
        *array_length(h, "ROWPTR") += 7
    });

    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    for name in [
        "more_values",
        "split_lengths",
        "more_rows",
        "wrong_count",
        "wrong_offsets",
    ] {
        assert_shown_as_stored(&mnt, src.path(), name);
    }
    let total = spec.total_values();
    assert_logged_error(&[
        "dataset=more_values",
        &format!(
            "chunks hold {total} values in all; the header says {}",
            total + 1
        ),
    ]);
    assert_logged_error(&["dataset=split_lengths", "DATA", "COLPTR"]);
    assert_logged_error(&["dataset=more_rows", "more_rows/chunk_00008/row_ptr.npy"]);
    assert_logged_error(&["dataset=wrong_count", "chunks"]);
    assert_logged_error(&["dataset=wrong_offsets", "ROWPTR"]);
    assert_the_rest_still_serves(&mnt);
}

#[test]
fn a_garbage_header_leaves_the_directory_as_stored() {
    capture_logs();
    let src = source_with_good_dataset();
    write_dataset(src.path(), "garbage_header", &small_dataset());
    std::fs::write(
        src.path().join("garbage_header").join(HEADER_FILE),
        pattern(99, 300),
    )
    .unwrap();
    // Right magic, then cut off in the middle of the array list.
    write_dataset(src.path(), "cut_header", &small_dataset());
    let header = src.path().join("cut_header").join(HEADER_FILE);
    let bytes = std::fs::read(&header).unwrap();
    std::fs::write(&header, &bytes[..bytes.len() / 2]).unwrap();
    // An empty header.
    write_dataset(src.path(), "empty_header", &small_dataset());
    std::fs::write(src.path().join("empty_header").join(HEADER_FILE), b"").unwrap();

    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    for name in ["garbage_header", "cut_header", "empty_header"] {
        assert_shown_as_stored(&mnt, src.path(), name);
    }
    assert_logged_error(&["garbage_header/header.sch", "not a valid SCDL header"]);
    assert_logged_error(&["cut_header/header.sch", "not a valid SCDL header"]);
    assert_logged_error(&["empty_header/header.sch", "not a valid SCDL header"]);
    assert_the_rest_still_serves(&mnt);
}

#[test]
fn headers_and_chunks_too_large_to_check_leave_the_dataset_as_stored() {
    capture_logs();
    let src = source_with_good_dataset();
    // A header.sch larger than any SCDL header is not read at all.
    write_dataset(src.path(), "huge_header", &small_dataset());
    std::fs::write(
        src.path().join("huge_header").join(HEADER_FILE),
        pattern(7, scdl_format::header::MAX_HEADER_BYTES as usize + 1),
    )
    .unwrap();
    // One chunk of 4 Gi rows would need gigabytes of row offsets checked in memory.
    write_dataset(src.path(), "huge_chunks", &small_dataset());
    edit_header(&src.path().join("huge_chunks"), |header| {
        let chunked = header.chunked.as_mut().unwrap();
        chunked.chunk_size = u32::MAX;
        chunked.num_chunks = 1;
    });

    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    for name in ["huge_header", "huge_chunks"] {
        assert_shown_as_stored(&mnt, src.path(), name);
    }
    assert_logged_error(&["huge_header/header.sch", "larger than any SCDL header"]);
    assert_logged_error(&["huge_chunks", "bytes of row offsets each"]);
    assert_the_rest_still_serves(&mnt);
}

// ---------------------------------------------------------------------------------------
// Corrupt row offsets: EIO for their chunk, correct bytes for the others.

/// Three chunks whose flat row offsets span 160 KB each, more than the kernel's
/// read-ahead, so that a read of one chunk cannot reach into the next.
fn wide_chunks() -> SyntheticDataset {
    SyntheticDataset {
        rows: 3 * 40_000 - 123,
        genes: 200,
        chunk_rows: 40_000,
        mean_values: 2,
        seed: 5,
    }
}

/// Mounts `wide_chunks` with chunk 1's row offsets changed by `corrupt` (same size),
/// and checks that exactly the reads touching chunk 1 fail.
fn corrupt_row_offsets_of_chunk_1(
    name: &str,
    corrupt: impl FnOnce(Dtype, &mut [u8]),
    log_words: &[&str],
) {
    capture_logs();
    let src = source_with_good_dataset();
    let spec = wide_chunks();
    write_dataset(src.path(), name, &spec);
    let row_dtype = Dtype::smallest_uint_for(spec.total_values());
    let bad_object = src.path().join(name).join("chunk_00001/row_ptr.npy");
    let mut stored = std::fs::read(&bad_object).unwrap();
    let original_len = stored.len();
    corrupt(row_dtype, &mut stored);
    assert_eq!(stored.len(), original_len, "the corruption keeps the size");
    std::fs::write(&bad_object, &stored).unwrap();

    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    let dataset = mnt.join(name);
    let mono = Monolithic::of(&spec);
    let w = row_dtype.size().unwrap();
    let col_width = spec.column_dtype().size().unwrap();
    let rows = |chunk: u64| {
        chunk * spec.chunk_rows as u64..((chunk + 1) * spec.chunk_rows as u64).min(spec.rows)
    };
    // Byte ranges of each chunk in the flat row_ptr.npy and data.npy.
    let offsets_of = |chunk: u64| rows(chunk).start * w..rows(chunk).end * w;
    let value_at = |row: u64| row_dtype.read_uint(&mono.row_ptr, row as usize);
    let values_of = |chunk: u64| value_at(rows(chunk).start) * 4..value_at(rows(chunk).end) * 4;

    // Reads touching chunk 1 fail, however they are cut and however often.
    let row_ptr = open_random(&dataset.join("row_ptr.npy"));
    let data = open_random(&dataset.join("data.npy"));
    let col_ptr = open_random(&dataset.join("col_ptr.npy"));
    for _ in 0..2 {
        assert_eio(
            read_at(&row_ptr, offsets_of(1).start + 4096, 100),
            "row_ptr inside chunk 1",
        );
        assert_eio(
            read_at(&row_ptr, offsets_of(0).end - 8, 16),
            "row_ptr across chunks 0 and 1",
        );
        assert_eio(
            read_at(&data, values_of(1).start + 8192, 4),
            "data inside chunk 1",
        );
        let last_column = (values_of(1).end / 4 - 1) * col_width;
        assert_eio(
            read_at(&col_ptr, last_column, 1),
            "col_ptr, last value of chunk 1",
        );
    }
    assert_eio(
        std::fs::read(dataset.join("row_ptr.npy")),
        "whole row_ptr.npy",
    );
    assert_eio(std::fs::read(dataset.join("data.npy")), "whole data.npy");

    // Reads of chunks 0 and 2 return the right bytes: at their starts, in the last
    // page entirely before chunk 1, right after it, and at the very end.
    for kind in [ArrayKind::RowPtr, ArrayKind::Data] {
        let file = if kind == ArrayKind::RowPtr {
            &row_ptr
        } else {
            &data
        };
        let want = mono.array(kind);
        let (chunk0, chunk2) = if kind == ArrayKind::RowPtr {
            (offsets_of(0), offsets_of(2))
        } else {
            (values_of(0), values_of(2))
        };
        let last_clean_page = (chunk0.end / 4096 - 1) * 4096;
        let first_clean_page = chunk2.start.div_ceil(4096) * 4096;
        for (offset, len) in [
            (0, 4096),
            (1000, 3),
            (last_clean_page, 4096),
            (first_clean_page, 4096),
            (first_clean_page + 40_000, 12_345),
            (want.len() as u64 - 4096, 4096),
            (want.len() as u64 - 5, 5000),
        ] {
            let got = read_at(file, offset, len)
                .unwrap_or_else(|e| panic!("{kind:?} at {offset}+{len}: {e}"));
            assert!(
                got == slice(want, offset, len),
                "{kind:?} at {offset}+{len}: wrong bytes"
            );
        }
    }
    // The stored object itself stays readable as stored, under .chunked/.
    assert!(
        std::fs::read(dataset.join(CHUNKED_DIR).join("chunk_00001/row_ptr.npy")).unwrap() == stored
    );
    let mut needles = vec!["corrupt row offsets"];
    let key = format!("{name}/chunk_00001/row_ptr.npy");
    needles.push(&key);
    needles.extend_from_slice(log_words);
    assert_logged_error(&needles);
    assert_the_rest_still_serves(&mnt);
}

#[test]
fn row_offsets_that_go_backwards_fail_reads_of_their_chunk_only() {
    corrupt_row_offsets_of_chunk_1(
        "backwards",
        |dtype, bytes| {
            let (a, b) = (dtype.read_uint(bytes, 1000), dtype.read_uint(bytes, 2000));
            assert!(a < b);
            dtype.write_uint(bytes, 1000, b);
            dtype.write_uint(bytes, 2000, a);
        },
        &["below entry"],
    );
}

#[test]
fn a_last_row_offset_other_than_the_value_count_fails_reads_of_its_chunk_only() {
    corrupt_row_offsets_of_chunk_1(
        "bad_last",
        |dtype, bytes| {
            let last = bytes.len() / dtype.size().unwrap() as usize - 1;
            let nnz = dtype.read_uint(bytes, last);
            dtype.write_uint(bytes, last, nnz + 5);
        },
        &["last entry"],
    );
}

#[test]
fn a_first_row_offset_other_than_zero_fails_reads_of_its_chunk_only() {
    corrupt_row_offsets_of_chunk_1(
        "bad_first",
        |dtype, bytes| assert!(dtype.write_uint(bytes, 0, 1)),
        &["first entry"],
    );
}

// ---------------------------------------------------------------------------------------
// Objects that change or fail after the mount listed them.

#[test]
fn an_object_replaced_or_truncated_after_listing_fails_with_eio() {
    capture_logs();
    let src = tempfile::tempdir().unwrap();
    let files = plain_files();
    write_files(src.path(), &files);
    write_dataset(src.path(), "changing", &small_dataset());
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    // The mount lists (and pins) everything before anything changes; nothing is read.
    for name in files.keys() {
        assert_eq!(
            std::fs::metadata(mnt.join(name)).unwrap().len(),
            files[name].len() as u64
        );
    }
    let data_len = std::fs::metadata(mnt.join("changing/data.npy"))
        .unwrap()
        .len();

    // Rewritten in place with other bytes of the same size.
    std::fs::write(
        src.path().join("nested/big.bin"),
        pattern(1234, files["nested/big.bin"].len()),
    )
    .unwrap();
    // Replaced by a rename, the way a sync tool uploads.
    let replacement = src.path().join("replacement.tmp");
    std::fs::write(&replacement, pattern(4321, files["one_part.bin"].len())).unwrap();
    std::fs::rename(&replacement, src.path().join("one_part.bin")).unwrap();
    // Truncated.
    cut_file(&src.path().join("nested/deeper/three_parts.bin"), 70_000);
    // A chunk array of the flat dataset rewritten, same size.
    let chunk_data = src.path().join("changing/chunk_00003/data.npy");
    let len = std::fs::metadata(&chunk_data).unwrap().len() as usize;
    std::fs::write(&chunk_data, pattern(77, len)).unwrap();

    for name in [
        "nested/big.bin",
        "one_part.bin",
        "nested/deeper/three_parts.bin",
    ] {
        assert_eio(std::fs::read(mnt.join(name)), name);
        let file = File::open(mnt.join(name)).unwrap();
        assert_eio(read_at(&file, 0, 10), name);
        // Where the truncated object has no bytes any more: still an error, not zeros
        // and not a short read.
        assert_eio(read_at(&file, files[name].len() as u64 - 10, 10), name);
        assert_eq!(
            std::fs::metadata(mnt.join(name)).unwrap().len(),
            files[name].len() as u64
        );
    }
    let spec = small_dataset();
    let mono = Monolithic::of(&spec);
    let row_dtype = Dtype::smallest_uint_for(spec.total_values());
    let chunk3_values =
        row_dtype.read_uint(&mono.row_ptr, 900) * 4..row_dtype.read_uint(&mono.row_ptr, 1200) * 4;
    let data = open_random(&mnt.join("changing/data.npy"));
    assert_eio(
        read_at(&data, chunk3_values.start + 100, 8),
        "flat data.npy in the changed chunk",
    );
    assert_eio(
        std::fs::read(mnt.join("changing/data.npy")),
        "whole flat data.npy",
    );
    // The errors say what happened and to which object.
    assert_logged_error(&["nested/big.bin", "changed in the store"]);
    assert_logged_error(&["one_part.bin", "changed in the store"]);
    assert_logged_error(&["nested/deeper/three_parts.bin", "changed in the store"]);
    assert_logged_error(&["changing/chunk_00003/data.npy", "changed in the store"]);

    // Everything unchanged still reads back exactly.
    for name in ["tiny.txt", "one_part_plus_one.bin", "empty.bin"] {
        assert!(
            std::fs::read(mnt.join(name)).unwrap() == files[name],
            "{name}"
        );
    }
    assert_eq!(read_at(&data, 0, 4096).unwrap(), &mono.data[..4096]);
    assert_eq!(
        std::fs::read(mnt.join("changing/row_ptr.npy")).unwrap(),
        mono.row_ptr
    );
    assert_eq!(data_len, mono.data.len() as u64);
}

#[test]
fn an_object_overwritten_in_an_s3_bucket_after_listing_fails_with_eio() {
    capture_logs();
    let src = source_with_good_dataset();
    let files = plain_files();
    let server = moto();
    let bucket = unique_bucket("overwritten");
    server.create_bucket(&bucket);
    server.upload(&bucket, "p", src.path());
    let mount = TestMount::start(server.store(&bucket), "p", |_| {});
    let mnt = mount.path();
    assert_eq!(
        std::fs::metadata(mnt.join("nested/big.bin")).unwrap().len(),
        files["nested/big.bin"].len() as u64
    );
    assert_eq!(
        std::fs::metadata(mnt.join("good/data.npy")).unwrap().len(),
        Monolithic::of(&small_dataset()).data.len() as u64
    );

    // Another writer replaces two objects in the bucket, same sizes, other bytes.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = server.store(&bucket);
        let big = PutPayload::from(pattern(555, files["nested/big.bin"].len()));
        store
            .put(&ObjectPath::from("p/nested/big.bin"), big)
            .await
            .unwrap();
        let chunk = ObjectPath::from("p/good/chunk_00004/col_ptr.npy");
        let len = store.head(&chunk).await.unwrap().size as usize;
        store
            .put(&chunk, PutPayload::from(pattern(556, len)))
            .await
            .unwrap();
    });

    assert_eio(
        std::fs::read(mnt.join("nested/big.bin")),
        "overwritten big.bin",
    );
    assert_eio(
        std::fs::read(mnt.join("good/col_ptr.npy")),
        "flat col_ptr.npy over an overwritten chunk",
    );
    assert_logged_error(&["p/nested/big.bin", "changed in the store"]);
    assert_logged_error(&["p/good/chunk_00004/col_ptr.npy", "changed in the store"]);
    // The flat arrays that do not involve the overwritten object read back exactly.
    let mono = Monolithic::of(&small_dataset());
    assert!(std::fs::read(mnt.join("good/data.npy")).unwrap() == mono.data);
    assert!(std::fs::read(mnt.join("good/row_ptr.npy")).unwrap() == mono.row_ptr);
    for (name, want) in &files {
        if name != "nested/big.bin" {
            assert!(std::fs::read(mnt.join(name)).unwrap() == *want, "{name}");
        }
    }
}

/// A local store whose reads of the objects in `broken` fail with `fault` while `on`.
fn faulty_store(
    root: &Path,
    broken: &'static [&'static str],
    fault: Fault,
    on: Arc<AtomicBool>,
) -> Arc<dyn ObjectStore> {
    let rule = InjectFaults::new(move |path, _options| {
        (on.load(Ordering::SeqCst) && broken.contains(&path.as_ref())).then(|| fault.clone())
    });
    Arc::new(HookedStore::new(local_store(root), rule))
}

#[test]
fn truncated_bodies_fail_with_eio_until_the_store_recovers() {
    capture_logs();
    let src = source_with_good_dataset();
    let files = plain_files();
    let broken = Arc::new(AtomicBool::new(true));
    const BROKEN: &[&str] = &[
        "nested/big.bin",
        "good/chunk_00002/data.npy",
        "good/chunk_00005/row_ptr.npy",
    ];
    let store = faulty_store(src.path(), BROKEN, Fault::Truncate(1000), broken.clone());
    let mount = TestMount::start(store, "", |_| {});
    let mnt = mount.path();
    let spec = small_dataset();
    let mono = Monolithic::of(&spec);
    let row_dtype = Dtype::smallest_uint_for(spec.total_values());
    let w = row_dtype.size().unwrap();
    let value_at = |row: u64| row_dtype.read_uint(&mono.row_ptr, row as usize);
    let chunk2_values = value_at(600) * 4..value_at(900) * 4;
    let chunk5_offsets = 1500 * w..1800 * w;

    let big = File::open(mnt.join("nested/big.bin")).unwrap();
    let data = open_random(&mnt.join("good/data.npy"));
    let row_ptr = open_random(&mnt.join("good/row_ptr.npy"));
    let errors_before = mount.status().counters.fetch_errors;
    for _ in 0..2 {
        assert_eio(read_at(&big, 0, 10), "big.bin, first part");
        assert_eio(
            read_at(&big, 5 * 65_536 + 100, 100),
            "big.bin, a middle part",
        );
        assert_eio(
            read_at(&data, chunk2_values.start + 4, 4),
            "flat data.npy in chunk 2",
        );
        // The row-offset check of chunk 5 cannot download its object: no verdict, EIO.
        assert_eio(
            read_at(&row_ptr, chunk5_offsets.start + 8, 8),
            "flat row_ptr.npy in chunk 5",
        );
    }
    assert_eio(std::fs::read(mnt.join("nested/big.bin")), "whole big.bin");
    assert!(mount.status().counters.fetch_errors > errors_before);
    assert_logged_error(&["nested/big.bin", "truncated"]);
    assert_logged_error(&["good/chunk_00002/data.npy", "truncated"]);
    // Other objects are not affected.
    assert!(
        std::fs::read(mnt.join("nested/deeper/three_parts.bin")).unwrap()
            == files["nested/deeper/three_parts.bin"]
    );
    assert_eq!(read_at(&data, 0, 4096).unwrap(), &mono.data[..4096]);

    // The store recovers: the same reads now return the right bytes. Neither the
    // failures nor a verdict on chunk 5 were kept.
    broken.store(false, Ordering::SeqCst);
    assert_eq!(
        read_at(&big, 0, 10).unwrap(),
        &files["nested/big.bin"][..10]
    );
    assert!(std::fs::read(mnt.join("nested/big.bin")).unwrap() == files["nested/big.bin"]);
    let offset = chunk2_values.start + 4;
    assert_eq!(
        read_at(&data, offset, 4).unwrap(),
        slice(&mono.data, offset, 4)
    );
    let offset = chunk5_offsets.start + 8;
    assert_eq!(
        read_at(&row_ptr, offset, 8).unwrap(),
        slice(&mono.row_ptr, offset, 8)
    );
    assert_the_rest_still_serves(&mnt);
}

#[test]
fn a_failing_object_fails_its_file_only_and_recovers() {
    capture_logs();
    let src = source_with_good_dataset();
    let files = plain_files();
    let failing = Arc::new(AtomicBool::new(true));
    let store = faulty_store(
        src.path(),
        &["one_part_plus_one.bin"],
        Fault::Fail,
        failing.clone(),
    );
    let mount = TestMount::start(store, "", |_| {});
    let mnt = mount.path();
    assert_eq!(
        std::fs::metadata(mnt.join("one_part_plus_one.bin"))
            .unwrap()
            .len(),
        65_537
    );
    assert_eio(
        std::fs::read(mnt.join("one_part_plus_one.bin")),
        "one_part_plus_one.bin",
    );
    let file = File::open(mnt.join("one_part_plus_one.bin")).unwrap();
    assert_eio(
        read_at(&file, 65_536, 1),
        "one_part_plus_one.bin, last byte",
    );
    assert_logged_error(&["one_part_plus_one.bin", "injected failure"]);
    for (name, want) in &files {
        if name != "one_part_plus_one.bin" {
            assert!(std::fs::read(mnt.join(name)).unwrap() == *want, "{name}");
        }
    }
    assert_good_still_serves(&mnt);
    failing.store(false, Ordering::SeqCst);
    assert!(
        std::fs::read(mnt.join("one_part_plus_one.bin")).unwrap() == files["one_part_plus_one.bin"]
    );
}

// ---------------------------------------------------------------------------------------
// Garbage in hint files.

fn open_hints(dataset: &Path) -> File {
    OpenOptions::new()
        .write(true)
        .open(dataset.join(HINT_FILE))
        .unwrap()
}

const VALID_HINTS: &[u8] = b"scdlfs-hints 1\nplan 0\nwindow 0 1\n";

#[track_caller]
fn assert_einval(result: io::Result<usize>, what: &str) {
    match result {
        Ok(n) => panic!("{what}: the write was accepted ({n} bytes)"),
        Err(error) => assert_eq!(error.raw_os_error(), Some(libc::EINVAL), "{what}: {error}"),
    }
}

#[test]
fn garbage_hint_writes_get_einval_and_the_mount_keeps_serving() {
    capture_logs();
    let src = source_with_good_dataset();
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    let dataset = mnt.join("good");
    let chunks = 9; // 2 500 rows in chunks of 300
    let rows = small_dataset().rows;

    // Each refused write comes first on a handle, or after a valid greeting; after it,
    // a valid write on the same handle is accepted.
    let mut binary = b"\xff\xfe\x00\x01garbage".to_vec();
    binary.extend(pattern(5, 500).into_iter().filter(|&b| b != b'\n'));
    binary.push(b'\n');
    let cases: Vec<(&str, bool, Vec<u8>)> = vec![
        (
            "a greeting of another version",
            false,
            b"scdlfs-hints 5\n".to_vec(),
        ),
        (
            "a step part on a handle of version 1",
            true,
            b"plan 0\nrows+ 0 1\nrows 5 6\n".to_vec(),
        ),
        ("a step before the greeting", false, b"window 0\n".to_vec()),
        ("not a greeting at all", false, b"hello\n".to_vec()),
        ("an unknown keyword", true, b"launch 3\n".to_vec()),
        (
            "a chunk id past the last chunk",
            true,
            format!("plan 0\nwindow 0 {chunks}\n").into_bytes(),
        ),
        ("a huge chunk id", true, b"window 4294967295\n".to_vec()),
        (
            "a chunk id beyond u32",
            true,
            b"window 99999999999\n".to_vec(),
        ),
        ("a negative chunk id", true, b"window -1\n".to_vec()),
        (
            "rows past the end",
            true,
            format!("rows {} {}\n", rows - 10, rows + 1).into_bytes(),
        ),
        ("rows backwards", true, b"rows 20 10\n".to_vec()),
        ("binary garbage", false, binary.clone()),
        ("binary garbage after the greeting", true, binary),
        (
            "an unfinished binary line",
            true,
            b"window 1 \xc3\xa9".to_vec(),
        ),
    ];
    for (what, greet_first, bytes) in &cases {
        let mut hints = open_hints(&dataset);
        if *greet_first {
            assert_eq!(
                hints.write(b"scdlfs-hints 1\n").unwrap(),
                15,
                "{what}: greeting"
            );
        }
        assert_einval(hints.write(&bytes[..]), what);
        assert_eq!(
            hints.write(VALID_HINTS).unwrap(),
            VALID_HINTS.len(),
            "{what}: a valid write after it"
        );
        let plans = mount.status().active_plans;
        assert!(
            plans.iter().any(|p| p.dataset == "good" && p.steps == 1),
            "{what}: {plans:?}"
        );
    }
    assert!(logs().contains("hint write refused with EINVAL"));

    // A line that grows past 64 KiB without a newline, in one write or in several.
    let mut hints = open_hints(&dataset);
    hints.write_all(b"scdlfs-hints 1\n").unwrap();
    let long = vec![b'7'; 70_000];
    assert_einval(write_once(&mut hints, &long), "a 70 000-byte partial line");
    let mut hints = open_hints(&dataset);
    hints.write_all(b"scdlfs-hints 1\nwindow ").unwrap();
    assert_eq!(
        hints.write(&long[..40_000]).unwrap(),
        40_000,
        "a partial line under the limit"
    );
    assert_einval(
        hints.write(&long[..40_000]),
        "the same line, now past 64 KiB",
    );
    drop(hints);
    // The refusals took nothing from anyone else: a fresh handle is served, and reads
    // of the dataset are exact.
    let mut hints = open_hints(&dataset);
    hints.write_all(VALID_HINTS).unwrap();
    assert!(mount
        .status()
        .active_plans
        .iter()
        .any(|p| p.dataset == "good" && p.steps == 1));
    assert_the_rest_still_serves(&mnt);
    drop(hints);
}

/// One write(2), however much it is.
fn write_once(file: &mut File, bytes: &[u8]) -> io::Result<usize> {
    file.write(bytes)
}
