//! `scdlfs chunk` from a monolithic archive to a local folder and to S3 (moto_server on
//! 127.0.0.1): the result equals the chunked archive that the format's description
//! (shared/SCDL-FORMAT.md) makes of the monolithic one's bytes, computed here without
//! scdlfs' code, the mount reads it flat, an interrupted job resumes to the same bytes,
//! and bad input is refused with the target untouched.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{run_ok, scdlfs_command};
use common::s3::{moto, unique_bucket};
use common::{local_store, small_dataset, snapshot, Monolithic, TestMount};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use scdl_format::manifest::{Manifest, MANIFEST_FILE};
use scdl_format::ArrayKind;
use scdlfs::chunker::{relative_key, ChunkError, ChunkJob, ChunkOptions, Location};
use scdlfs::store::faulty::{Fault, InjectFaults};
use scdlfs::store::wrapper::HookedStore;
use scdlfs::synthetic::SyntheticDataset;
use tokio_util::sync::CancellationToken;

/// A bigger dataset than `small_dataset`, in many chunks, so a job can be cut midway.
fn many_chunks() -> SyntheticDataset {
    SyntheticDataset {
        rows: 6_000,
        genes: 2_000,
        chunk_rows: 97,
        mean_values: 40,
        seed: 5,
    }
}

/// Writes `spec` as a monolithic archive at `dir`, built without scdlfs' chunker, with
/// the global entries a released archive carries.
fn write_monolithic(spec: &SyntheticDataset, dir: &Path) {
    let arrays = Monolithic::of(spec);
    std::fs::create_dir_all(dir.join("var_features")).unwrap();
    for kind in ArrayKind::ALL {
        std::fs::write(dir.join(kind.file_name()), arrays.array(kind)).unwrap();
    }
    let header = spec.monolithic_header();
    std::fs::write(dir.join("header.sch"), header.encode()).unwrap();
    std::fs::write(dir.join("version.json"), "\"0.1.3\"").unwrap();
    std::fs::write(
        dir.join("metadata.json"),
        format!("{{\"num_rows\": {}}}", spec.rows),
    )
    .unwrap();
    std::fs::write(dir.join("var_features/names.bin"), common::pattern(3, 5000)).unwrap();
}

/// A temporary folder with `spec` as a monolithic archive in its `mono` folder.
fn monolithic_in_tempdir(spec: &SyntheticDataset) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mono = dir.path().join("mono");
    write_monolithic(spec, &mono);
    (dir, mono)
}

/// A new bucket on the test server, and a client for it.
fn new_bucket(name: &str) -> (String, Arc<dyn ObjectStore>) {
    let bucket = unique_bucket(name);
    moto().create_bucket(&bucket);
    let store = moto().store(&bucket);
    (bucket, store)
}

/// What the chunked archive must hold, worked out from the monolithic archive at `mono`
/// as the format describes it and with none of scdlfs' code: row `i` in chunk
/// `i / chunk_rows`; each chunk's `row_ptr.npy` rebased to 0 in the global dtype, its
/// `data.npy` and `col_ptr.npy` the slices of its rows' values (global column ids);
/// the header the monolithic one with backend 2 (CHUNKED_MEMMAP_V0) and the trailer
/// `u8 1, u32 chunk_rows, u32 num_chunks, u64 total_rows` (big-endian); the global
/// files copied once.
fn expected_chunked(mono: &Path, rows: u64, chunk_rows: u32) -> BTreeMap<String, Vec<u8>> {
    let read = |name: &str| std::fs::read(mono.join(name)).unwrap();
    let (row_ptr, data, col_ptr) = (read("row_ptr.npy"), read("data.npy"), read("col_ptr.npy"));
    // Raw little-endian arrays: each one's element width follows from its length.
    let row_width = row_ptr.len() / (rows as usize + 1);
    let offset = |row: u64| {
        let at = row as usize * row_width;
        let mut bytes = [0u8; 8];
        bytes[..row_width].copy_from_slice(&row_ptr[at..at + row_width]);
        u64::from_le_bytes(bytes)
    };
    let nnz = offset(rows) as usize;
    let (data_width, col_width) = (data.len() / nnz, col_ptr.len() / nnz);
    assert_eq!(
        (data_width * nnz, col_width * nnz),
        (data.len(), col_ptr.len())
    );

    let mut files = BTreeMap::new();
    let num_chunks = rows.div_ceil(chunk_rows as u64);
    for chunk in 0..num_chunks {
        let first = chunk * chunk_rows as u64;
        let end = (first + chunk_rows as u64).min(rows);
        let (start, stop) = (offset(first) as usize, offset(end) as usize);
        let rebased: Vec<u8> = (first..=end)
            .flat_map(|row| (offset(row) - offset(first)).to_le_bytes()[..row_width].to_vec())
            .collect();
        let dir = format!("chunk_{chunk:05}");
        files.insert(format!("{dir}/row_ptr.npy"), rebased);
        files.insert(
            format!("{dir}/data.npy"),
            data[start * data_width..stop * data_width].to_vec(),
        );
        files.insert(
            format!("{dir}/col_ptr.npy"),
            col_ptr[start * col_width..stop * col_width].to_vec(),
        );
    }
    // "SCDL", three version bytes and the endianness byte, then the u32 backend.
    let mut header = read("header.sch");
    header[8..12].copy_from_slice(&2u32.to_be_bytes());
    header.push(1);
    header.extend_from_slice(&chunk_rows.to_be_bytes());
    header.extend_from_slice(&(num_chunks as u32).to_be_bytes());
    header.extend_from_slice(&rows.to_be_bytes());
    files.insert("header.sch".into(), header);
    for global in ["version.json", "metadata.json", "var_features/names.bin"] {
        files.insert(global.into(), read(global));
    }
    files
}

/// Asserts that `got` holds exactly the files of `expected`, naming those that differ
/// (the files are too large to print), and a manifest that lists each of them but the
/// header, with its size.
#[track_caller]
fn assert_same_files(got: &BTreeMap<String, Vec<u8>>, expected: &BTreeMap<String, Vec<u8>>) {
    let mut got = got.clone();
    let manifest = got.remove(MANIFEST_FILE).expect("the job wrote a manifest");
    let manifest = Manifest::decode(&manifest).expect("the manifest decodes");
    let listed: BTreeMap<&str, u64> = manifest
        .objects
        .iter()
        .map(|object| (object.key.as_str(), object.size))
        .collect();
    let objects: BTreeMap<&str, u64> = expected
        .iter()
        .filter(|(key, _)| *key != "header.sch")
        .map(|(key, bytes)| (key.as_str(), bytes.len() as u64))
        .collect();
    assert_eq!(
        listed, objects,
        "the manifest lists every object but the header"
    );
    let differing: Vec<&String> = expected
        .keys()
        .chain(got.keys())
        .filter(|name| got.get(*name) != expected.get(*name))
        .collect();
    assert!(
        differing.is_empty(),
        "files missing, extra or different: {differing:?}"
    );
}

fn objects(store: &Arc<dyn ObjectStore>, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let prefix = ObjectPath::from(prefix);
        let listing: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
        let mut out = BTreeMap::new();
        for meta in listing {
            let key = relative_key(&meta.location, &prefix).unwrap();
            let bytes = store
                .get(&meta.location)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            out.insert(key, bytes.to_vec());
        }
        out
    })
}

fn keys(store: &Arc<dyn ObjectStore>, prefix: &str) -> std::collections::BTreeSet<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = ObjectPath::from(prefix);
    let listing: Vec<_> = runtime
        .block_on(store.list(Some(&prefix)).try_collect())
        .unwrap();
    listing
        .into_iter()
        .map(|meta| relative_key(&meta.location, &prefix).unwrap())
        .collect()
}

fn chunk_command(source: &Path, target: &str, chunk_rows: u32) -> Command {
    let mut command = scdlfs_command(["chunk", "--chunk-rows", &chunk_rows.to_string()]);
    command
        .arg(source)
        .arg(target)
        .args(["--endpoint-url", &moto().endpoint])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1");
    command
}

fn run_chunk(source: &Path, target: &str, chunk_rows: u32) -> (bool, String, String) {
    let output = chunk_command(source, target, chunk_rows)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_local_archive_chunks_into_a_local_folder_as_the_format_describes() {
    let spec = small_dataset();
    let (dir, mono) = monolithic_in_tempdir(&spec);
    let target = dir.path().join("out");
    let (ok, stdout, stderr) = run_chunk(&mono, target.to_str().unwrap(), spec.chunk_rows);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("header.sch published"), "{stdout}");
    let expected = expected_chunked(&mono, spec.rows, spec.chunk_rows);
    assert_same_files(&snapshot(&target), &expected);

    let (ok, stdout, stderr) = run_chunk(&mono, target.to_str().unwrap(), spec.chunk_rows);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("nothing to do"), "{stdout}");
    assert_same_files(&snapshot(&target), &expected);
}

/// Chunks whose values outgrow a 5 MiB part, so they stream through multipart uploads.
fn large_chunks() -> SyntheticDataset {
    SyntheticDataset {
        rows: 24_000,
        genes: 5_000,
        chunk_rows: 11_000,
        mean_values: 130,
        seed: 9,
    }
}

#[test]
fn an_archive_chunks_straight_into_s3_through_multipart_uploads_and_the_mount_reads_it_flat() {
    let spec = large_chunks();
    assert!(spec.chunk_rows as u64 * spec.mean_values as u64 * 4 > 5 << 20);
    let (_dir, mono) = monolithic_in_tempdir(&spec);
    let (bucket, store) = new_bucket("chunk-s3");
    let output = run_ok(
        chunk_command(&mono, &format!("s3://{bucket}/atlas/ds"), spec.chunk_rows).args([
            "--part-size",
            "5MiB",
            "--verify-data",
        ]),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("checksums of 12 read back"), "{stdout}");
    assert_same_files(
        &objects(&store, "atlas/ds"),
        &expected_chunked(&mono, spec.rows, spec.chunk_rows),
    );

    let mount = TestMount::start(store, "atlas", |_| {});
    let monolithic = Monolithic::of(&spec);
    for kind in ArrayKind::ALL {
        let flat = std::fs::read(mount.path().join("ds").join(kind.file_name())).unwrap();
        assert!(flat == monolithic.array(kind), "{kind:?} differs");
    }
}

/// A source whose reads fail from the `after`-th on: a network that goes away midway.
fn failing_source(root: &Path, after: usize) -> Location {
    let reads = Arc::new(AtomicUsize::new(0));
    let hook = InjectFaults::new(move |_, _| {
        (reads.fetch_add(1, Ordering::SeqCst) >= after).then_some(Fault::Fail)
    });
    Location {
        store: Arc::new(HookedStore::new(local_store(root), hook)),
        prefix: ObjectPath::default(),
    }
}

fn options() -> ChunkOptions {
    ChunkOptions {
        part_size: 5 << 20,
        objects_in_flight: 2,
        verify_data: true,
        quiet: true,
    }
}

#[test]
fn a_job_cut_twice_by_network_errors_resumes_to_the_same_bucket() {
    let spec = many_chunks();
    let (_dir, mono) = monolithic_in_tempdir(&spec);
    let target = Location {
        store: new_bucket("chunk-resume").1,
        prefix: ObjectPath::from("ds"),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let attempt = |after: usize| {
        runtime.block_on(async {
            let job = ChunkJob::prepare(failing_source(&mono, after), spec.chunk_rows)
                .await
                .expect("preparing reads the header and row offsets, a few reads");
            job.run(target.clone(), &options(), CancellationToken::new())
                .await
        })
    };
    let mut uploaded_before = 0;
    for after in [40, 140] {
        let error = attempt(after).expect_err("the source failed midway");
        assert!(matches!(error, ChunkError::Store { .. }), "{error}");
        assert!(error.resumable());
        let held = objects(&target.store, "ds");
        assert!(
            !held.contains_key("header.sch"),
            "published after a failure"
        );
        let data_objects = held.keys().filter(|k| k.ends_with("data.npy")).count();
        assert!(
            data_objects > uploaded_before,
            "the second attempt added nothing: {data_objects}"
        );
        uploaded_before = data_objects;

        // Meanwhile, a mount does not take the half-written dataset for a chunked one.
        let mount = TestMount::start(target.store.clone(), "", |_| {});
        assert!(!mount.path().join("ds/data.npy").exists());
        assert!(mount.path().join("ds/chunk_00000").is_dir());
    }
    let report = attempt(usize::MAX).expect("the last attempt completes");
    assert!(report.reused_objects > 0, "{report:?}");
    assert_eq!(
        report.reused_objects + report.uploaded_objects,
        report.objects
    );
    assert_eq!(report.read_back_objects, report.objects);
    assert_same_files(
        &objects(&target.store, "ds"),
        &expected_chunked(&mono, spec.rows, spec.chunk_rows),
    );
}

#[test]
fn kill_9_midway_then_the_same_command_finishes_the_job() {
    let spec = many_chunks();
    let (_dir, mono) = monolithic_in_tempdir(&spec);
    let (bucket, store) = new_bucket("chunk-kill");
    let url = format!("s3://{bucket}/ds");
    let total = spec.rows.div_ceil(spec.chunk_rows as u64) as usize * 3;

    for kill_at in [total / 8, total / 2] {
        let mut child = chunk_command(&mono, &url, spec.chunk_rows)
            .args(["--objects-in-flight", "1", "--quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        loop {
            let held = keys(&store, "ds");
            let chunk_objects = held.iter().filter(|k| k.starts_with("chunk_")).count();
            if chunk_objects >= kill_at {
                assert!(
                    !held.contains("header.sch"),
                    "the job ended before the kill"
                );
                break;
            }
            assert!(child.try_wait().unwrap().is_none(), "chunk ended early");
            assert!(started.elapsed() < Duration::from_secs(120), "no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!keys(&store, "ds").contains("header.sch"));
    }
    let (ok, stdout, stderr) = run_chunk(&mono, &url, spec.chunk_rows);
    assert!(ok, "{stderr}");
    let reused: usize = stdout
        .split("reused ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no reuse count in {stdout}"));
    assert!(
        reused >= total / 2 - 1,
        "only {reused} objects reused: {stdout}"
    );
    assert_same_files(
        &objects(&store, "ds"),
        &expected_chunked(&mono, spec.rows, spec.chunk_rows),
    );
}

/// Runs `scdlfs chunk` on a bad source or into an occupied target and checks the
/// message and that the target did not change.
fn refused(source: &Path, target: &Path, words: &[&str]) {
    let before = target.exists().then(|| snapshot(target));
    let (ok, _, stderr) = run_chunk(source, target.to_str().unwrap(), 300);
    assert!(!ok, "accepted; expected a refusal saying {words:?}");
    let said = stderr.to_lowercase();
    for word in words {
        assert!(
            said.contains(&word.to_lowercase()),
            "{word:?} not in: {stderr}"
        );
    }
    assert_eq!(
        target.exists().then(|| snapshot(target)),
        before,
        "{words:?}: target changed"
    );
}

#[test]
fn bad_sources_and_occupied_targets_are_refused_and_the_target_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_dataset();
    let good = dir.path().join("good");
    write_monolithic(&spec, &good);
    let variant = |name: &str, change: &dyn Fn(&Path)| {
        let path = dir.path().join(name);
        write_monolithic(&spec, &path);
        change(&path);
        path
    };
    let fresh = dir.path().join("fresh");

    let garbage = variant("garbage", &|p| {
        std::fs::write(p.join("header.sch"), b"not a header").unwrap()
    });
    refused(&garbage, &fresh, &["header.sch"]);
    let cut = variant("cut", &|p| {
        let bytes = std::fs::read(p.join("data.npy")).unwrap();
        std::fs::write(p.join("data.npy"), &bytes[..bytes.len() - 4]).unwrap();
    });
    refused(&cut, &fresh, &["data.npy", "bytes"]);
    let decreasing = variant("decreasing", &|p| {
        let mut bytes = std::fs::read(p.join("row_ptr.npy")).unwrap();
        let width = bytes.len() / (spec.rows as usize + 1);
        bytes[100 * width] = bytes[100 * width].wrapping_add(0x7f);
        std::fs::write(p.join("row_ptr.npy"), bytes).unwrap();
    });
    refused(&decreasing, &fresh, &["row_ptr.npy", "row offset"]);
    let no_data = variant("no_data", &|p| {
        std::fs::remove_file(p.join("data.npy")).unwrap()
    });
    refused(&no_data, &fresh, &["data.npy", "missing"]);
    assert!(!fresh.exists(), "a target folder was made for a bad source");

    let occupied = dir.path().join("occupied");
    std::fs::create_dir(&occupied).unwrap();
    std::fs::write(occupied.join("notes.txt"), b"mine").unwrap();
    // Named as given: a local folder is its store's root, whose prefix is empty.
    refused(
        &good,
        &occupied,
        &[
            &format!("{}: the target is not free", occupied.display()),
            "not empty",
            "notes.txt",
        ],
    );

    let other = dir.path().join("other");
    let (ok, _, stderr) = run_chunk(&good, other.to_str().unwrap(), 500);
    assert!(ok, "{stderr}");
    refused(
        &good,
        &other,
        &[
            &format!("{}: the target is not free", other.display()),
            "another dataset",
        ],
    );

    let interrupted = dir.path().join("interrupted");
    std::fs::create_dir_all(interrupted.join(".scdlfs-chunk")).unwrap();
    std::fs::write(
        interrupted.join(".scdlfs-chunk/job.json"),
        r#"{"format":1,"chunk_rows":123,"source_header_crc32c":1,"source_array_bytes":[1,2,3]}"#,
    )
    .unwrap();
    refused(
        &good,
        &interrupted,
        &["interrupted chunking of another source"],
    );
}
