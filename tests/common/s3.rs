//! A real S3-compatible server for the tests: `moto_server` on 127.0.0.1, started once
//! per test binary and stopped with it. Found as `$SCDLFS_MOTO_SERVER`, else in the
//! repository's `.venv` (made by scripts/setup-python-venv), else on PATH.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload};

pub struct Moto {
    pub endpoint: String,
}

static MOTO: OnceLock<Moto> = OnceLock::new();

fn moto_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SCDLFS_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("moto_server")
}

/// The shared server, started on first use.
pub fn moto() -> &'static Moto {
    MOTO.get_or_init(|| {
        // moto_server cannot take a listening socket, so a port picked here could be
        // taken by another process before the server binds it: then the server exits,
        // and another port is tried.
        for _ in 0..5 {
            if let Some(moto) = start_moto() {
                return moto;
            }
        }
        panic!("moto_server did not start on any of 5 ports");
    })
}

fn start_moto() -> Option<Moto> {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = Command::new(moto_binary());
    command
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    super::process::dies_with_test(&mut command);
    // PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, and each
    // test runs on a thread of its own: fork from a thread that lives as long as the
    // test binary, so the server serves every test and dies with the binary.
    let (spawned, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        spawned.send(command.spawn()).unwrap();
        loop {
            std::thread::park();
        }
    });
    let mut server = result.recv().unwrap().unwrap_or_else(|e| {
        panic!("cannot start moto_server ({e}); run scripts/setup-python-venv or set SCDLFS_MOTO_SERVER")
    });
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if server.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "moto_server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Never waited for: PR_SET_PDEATHSIG ends it with the test binary.
    std::mem::forget(server);
    Some(Moto {
        endpoint: format!("http://127.0.0.1:{port}"),
    })
}

impl Moto {
    /// Creates a bucket (a plain PUT; moto needs no signature for it).
    pub fn create_bucket(&self, bucket: &str) {
        let address = self.endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).unwrap();
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "bucket creation failed: {response}"
        );
    }

    /// A client for `bucket` with explicit dummy keys: never the metadata service.
    pub fn store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        Arc::new(
            AmazonS3Builder::new()
                .with_bucket_name(bucket)
                .with_endpoint(&self.endpoint)
                .with_region("us-east-1")
                .with_access_key_id("test")
                .with_secret_access_key("test")
                .with_virtual_hosted_style_request(false)
                .with_client_options(ClientOptions::new().with_allow_http(true))
                .build()
                .unwrap(),
        )
    }

    /// Uploads every file under `root` to `bucket` under `prefix`.
    pub fn upload(&self, bucket: &str, prefix: &str, root: &std::path::Path) {
        let files = super::snapshot(root);
        self.change(
            bucket,
            files
                .into_iter()
                .map(|(name, bytes)| (format!("{prefix}/{name}"), Some(bytes))),
        );
    }

    /// Puts (`Some`) or deletes (`None`) objects of `bucket`, in order.
    pub fn change(
        &self,
        bucket: &str,
        objects: impl IntoIterator<Item = (String, Option<Vec<u8>>)>,
    ) {
        let store = self.store(bucket);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for (name, bytes) in objects {
                let key = ObjectPath::from(name);
                match bytes {
                    Some(bytes) => store.put(&key, PutPayload::from(bytes)).await.map(drop),
                    None => store.delete(&key).await,
                }
                .unwrap();
            }
        });
    }
}

/// A fresh bucket name per test, so tests sharing the server do not meet.
pub fn unique_bucket(name: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}
