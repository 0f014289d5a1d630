//! A hostile hint writer: another user (`nobody`) who may write a dataset's hint file
//! and tries to make the daemon's work for it unbounded, while the tests check that
//! everyone else's reads go on.
//!
//! It runs in `bash` as uid 65534 and, until its time is up: holds many hint handles
//! open (more than one user may), writes on several of them plans of wide `rows` steps
//! (each range over the whole dataset, so one entry is a unit of work per chunk),
//! and restarts those plans as fast as it can.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `nobody` on Debian.
pub const HOSTILE_UID: u32 = 65534;

/// The writer itself, one implementation the benchmark runs too (bench/driver/hostile.py).
const SCRIPT: &str = include_str!("hostile_hints.sh");

/// Starts the hostile writer on the hint file `hints` of a dataset of `rows` rows, for
/// `duration`. The mount must let other users in (`--allow-other`) and reach them.
pub fn start(hints: &Path, rows: u64, duration: Duration) -> Child {
    Command::new("bash")
        .args(["-c", SCRIPT, "hostile"])
        .arg(hints)
        .arg(duration.as_secs().max(1).to_string())
        .arg(rows.to_string())
        .uid(HOSTILE_UID)
        .gid(HOSTILE_UID)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs as nobody")
}
