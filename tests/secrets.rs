//! Secrets never leave the process in text: a password in an http(s) source URL and the
//! AWS keys and session token a mount signs with appear in no message of the real
//! `scdlfs` binary: not on standard error, not in the daemon's log file, at no log
//! level (`--log-level trace`, `-d`), also when the mount fails.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::process::{scdlfs_command, PATIENCE};
use common::s3::moto;

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
