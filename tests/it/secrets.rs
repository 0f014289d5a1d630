//! Secrets never leave the process in text: a password in an http(s) source URL and the
//! AWS keys and session token a mount signs with appear in no message of the real
//! `scdlfs` binary: not on standard error, not in the daemon's log file, at no log
//! level (`--log-level trace`, `-d`), also when the mount fails. Nor on a command line
//! (/proc/PID/cmdline, readable by every local user): the source can be given as
//! `env:VAR`, and the detached daemon gets it in its environment. A mount that works
//! shows it nowhere either: not in `status`, the metrics, the mount table or its log.

use crate::common;

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use common::process::{
    dies_with_test, run_ok, scdlfs_command, status_json, unmount, wait_for, Cleanup, PATIENCE,
};
use common::s3::moto;
use common::servers::Server;

/// A password no other text contains.
const PASSWORD: &str = "pw-Zq8vXk3T";
const ACCESS_KEY_ID: &str = "AKIDSECRETSTEST7";
const SECRET_KEY: &str = "sk-Wm4rPq9LuV2y";
const SESSION_TOKEN: &str = "tok-Hb6nJc1DfS0e";

/// Runs `command` (which must fail: nothing serves the source) within the test's patience.
#[track_caller]
fn failing(command: &mut Command) -> Output {
    let output = command.output().unwrap();
    assert!(!output.status.success(), "{command:?} succeeded");
    output
}

/// Asserts that none of `secrets` appears in `text`, naming where it was found.
#[track_caller]
fn assert_shows_none(text: &str, secrets: &[&str], what: &str) {
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what} shows the secret {secret}:\n{}",
            text.lines()
                .filter(|line| line.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_password_in_an_http_source_is_in_no_message_at_any_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let source = format!("https://reader:{PASSWORD}@127.0.0.1:1/x");
    let cache = dir.path().join("cache");

    // Detached, as users run it: the parent's error and the daemon's log file.
    let output = failing(
        scdlfs_command(["mount", &source])
            .arg(&mountpoint)
            .arg("--cache-dir")
            .arg(&cache),
    );
    let stderr = stderr_of(&output);
    assert!(stderr.contains("127.0.0.1:1"), "no error given: {stderr}");
    assert_shows_none(&stderr, &[PASSWORD], "the detaching command's stderr");
    let log = std::fs::read_to_string(cache.join("scdlfs.log")).unwrap();
    assert!(log.contains("cannot list"), "the log says nothing: {log}");
    assert_shows_none(&log, &[PASSWORD], "the daemon's log file");

    // In the foreground at every level, through both spellings of verbosity.
    for verbosity in [&["--log-level", "trace"][..], &["-d"][..]] {
        let output = failing(
            scdlfs_command(["mount", &source])
                .arg(&mountpoint)
                .args(["--foreground", "--cache-dir"])
                .arg(&cache)
                .args(verbosity),
        );
        let stderr = stderr_of(&output);
        assert!(stderr.contains("cannot list"), "{verbosity:?}: {stderr}");
        assert_shows_none(&stderr, &[PASSWORD], &format!("stderr with {verbosity:?}"));
    }
}

/// A foreground S3 mount at trace level that fails, with credentials from `env` and
/// `extra` flags; its stderr.
fn failing_s3_mount(dir: &Path, endpoint: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let mut command = scdlfs_command(["mount", "s3://no-such-bucket-secrets/x"]);
    command
        .arg(&mountpoint)
        .args([
            "--foreground",
            "--log-level",
            "trace",
            "--region",
            "us-east-1",
        ])
        .args(["--endpoint-url", endpoint, "--cache-dir"])
        .arg(dir.join("cache"))
        .args(extra)
        .envs(env.iter().copied());
    let started = std::time::Instant::now();
    let stderr = stderr_of(&failing(&mut command));
    assert!(
        started.elapsed() < PATIENCE,
        "the failing mount took too long"
    );
    stderr
}

#[test]
fn a_failing_s3_mount_with_a_session_token_shows_no_credential_at_trace_level() {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[reader]\naws_access_key_id = {ACCESS_KEY_ID}\naws_secret_access_key = {SECRET_KEY}\naws_session_token = {SESSION_TOKEN}\n"
        ),
    )
    .unwrap();
    let secrets = [ACCESS_KEY_ID, SECRET_KEY, SESSION_TOKEN];
    let credentials = credentials.to_string_lossy().into_owned();
    // Through the SDK's chain (a profile) and straight from the environment; against a
    // server that answers (the bucket does not exist) and an address that refuses.
    for endpoint in [moto().endpoint.as_str(), "http://127.0.0.1:1"] {
        let stderr = failing_s3_mount(
            dir.path(),
            endpoint,
            &["--profile", "reader"],
            &[("AWS_SHARED_CREDENTIALS_FILE", &credentials)],
        );
        assert!(stderr.contains("TRACE"), "no trace lines: {stderr}");
        assert_shows_none(&stderr, &secrets, &format!("a profile mount of {endpoint}"));
        let stderr = failing_s3_mount(
            dir.path(),
            endpoint,
            &[],
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                ("AWS_SESSION_TOKEN", SESSION_TOKEN),
            ],
        );
        assert_shows_none(
            &stderr,
            &secrets,
            &format!("an environment mount of {endpoint}"),
        );
    }
}

/// A server on 127.0.0.1 that records the head of every request and never answers,
/// so a mount of it stays in its first listing for a while.
struct SilentServer {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl SilentServer {
    fn start() -> SilentServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut stream in listener.incoming().flatten() {
                let mut buffer = [0u8; 4096];
                let n = stream.read(&mut buffer).unwrap_or(0);
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buffer[..n]).into_owned());
                held.push(stream);
            }
        });
        SilentServer { port, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// The processes whose command line holds `text`, with their command lines.
fn command_lines_holding(text: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.contains(text) {
            found.push((pid, line));
        }
    }
    found
}

/// The pids whose parent is `parent`.
fn children_of(parent: u32) -> Vec<i32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) in its parentheses.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        if after.split(' ').nth(1) == Some(&parent.to_string()) {
            children.push(pid);
        }
    }
    children
}

/// `scdlfs mount SOURCE_ARG MOUNTPOINT` (detaching) with `env`, against a server that
/// never answers; once the daemon has sent its first request, returns the request's
/// head and the daemon's pid, the processes left to `cleanup`.
fn mount_of_a_silent_server(
    source_arg: &str,
    env: &[(&str, &str)],
    server: &SilentServer,
    dir: &Path,
    cleanup: &mut Cleanup,
) -> (String, i32, u32) {
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let mut command = scdlfs_command(["mount", source_arg]);
    command
        .arg(&mountpoint)
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    dies_with_test(&mut command);
    let parent = cleanup.spawn(&mut command);
    let parent_pid = parent.id();
    wait_for("the daemon's first request", || {
        if let Some(status) = parent.try_wait().unwrap() {
            let mut stderr = String::new();
            parent
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            panic!("the mount ended ({status}) before reaching the server: {stderr}");
        }
        !server.heads().is_empty()
    });
    let daemon = children_of(parent_pid);
    assert_eq!(daemon.len(), 1, "not one daemon: {daemon:?}");
    cleanup.pids.push(daemon[0]);
    (server.heads()[0].clone(), daemon[0], parent_pid)
}

#[test]
fn a_password_in_the_source_is_on_no_command_line() {
    // Its own password: the other tests, running beside it, put theirs on command lines.
    const PASSWORD: &str = "pw-Cm7dLnQ2xR";
    let dir = tempfile::tempdir().unwrap();
    let server = SilentServer::start();
    let source = format!("http://reader:{PASSWORD}@127.0.0.1:{}/x", server.port);
    let mut cleanup = Cleanup::default();

    // Given in the environment (`env:VAR`): on no command line, the daemon's included.
    let (head, _, _) = mount_of_a_silent_server(
        "env:DATASET_SOURCE",
        &[("DATASET_SOURCE", &source)],
        &server,
        &dir.path().join("by-environment"),
        &mut cleanup,
    );
    assert!(
        head.starts_with("PROPFIND /x "),
        "the daemon did not list the source: {head}"
    );
    let holding = command_lines_holding(PASSWORD);
    assert!(
        holding.is_empty(),
        "command lines with the password: {holding:?}"
    );
    drop(cleanup);

    // Given on the command line, where the user put it: not passed on to the daemon.
    let server = SilentServer::start();
    let source = format!("http://reader:{PASSWORD}@127.0.0.1:{}/x", server.port);
    let mut cleanup = Cleanup::default();
    let (_, daemon, parent) = mount_of_a_silent_server(
        &source,
        &[],
        &server,
        &dir.path().join("by-argument"),
        &mut cleanup,
    );
    let holding: Vec<_> = command_lines_holding(PASSWORD)
        .into_iter()
        .filter(|(pid, _)| *pid != parent as i32)
        .collect();
    assert!(
        holding.is_empty(),
        "the daemon {daemon} got the password on its command line: {holding:?}"
    );
}

/// The body of `GET http://ADDRESS/metrics`.
fn metrics(address: &str) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn a_working_mount_of_a_source_with_a_password_shows_it_nowhere() {
    // Its own password: the other tests, running beside it, put theirs on command lines.
    const PASSWORD: &str = "pw-Wk5mTsH8vJ";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("served");
    let files = common::write_source(&root);
    let server = Server::webdav(&root);
    let address = server.url.trim_start_matches("http://");
    let port = address.rsplit(':').next().unwrap();
    let source = format!("http://reader:{PASSWORD}@{address}/");
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let cache = dir.path().join("cache");
    let metrics_address = {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    let mut cleanup = Cleanup::unmounting(mountpoint.clone());
    run_ok(
        scdlfs_command(["mount", "env:DATASET_SOURCE"])
            .arg(&mountpoint)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["--log-level", "trace", "--metrics-addr", &metrics_address])
            .env("DATASET_SOURCE", &source),
    );
    let (name, bytes) = files.iter().next().unwrap();
    assert_eq!(&std::fs::read(mountpoint.join(name)).unwrap(), bytes);

    let status = status_json(&mountpoint).to_string();
    assert!(status.contains(port), "status names no source: {status}");
    assert_shows_none(&status, &[PASSWORD], "status --json");
    let metrics = metrics(&metrics_address);
    assert!(metrics.contains("200 OK"), "{metrics}");
    assert_shows_none(&metrics, &[PASSWORD], "the metrics");
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_shows_none(&table, &[PASSWORD], "the mount table");
    let holding = command_lines_holding(PASSWORD);
    assert!(
        holding.is_empty(),
        "command lines with the password: {holding:?}"
    );
    unmount(&mountpoint);
    cleanup.mountpoints.clear();
    let log = std::fs::read_to_string(cache.join("scdlfs.log")).unwrap();
    assert!(log.contains("TRACE"), "the log has no trace lines");
    assert_shows_none(&log, &[PASSWORD], "the daemon's log");
}

#[test]
fn chunk_takes_its_source_and_target_from_the_environment_too() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (dir.path().join("mono"), dir.path().join("chunked"));
    common::write_monolithic(&common::small_dataset(), &source);
    let output = run_ok(
        scdlfs_command(["chunk", "--quiet", "env:CHUNK_SOURCE", "env:CHUNK_TARGET"])
            .env("CHUNK_SOURCE", &source)
            .env("CHUNK_TARGET", &target),
    );
    assert!(target.join("header.sch").exists(), "nothing published");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(&*target.to_string_lossy()), "{stdout}");
}
