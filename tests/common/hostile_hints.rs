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

const SCRIPT: &str = r#"
hints="$1"; seconds="$2"; rows="$3"
end=$((SECONDS + seconds))
# Plans on seven handles: a `plan` line and 100 steps of 16 ranges over every row.
exec 3>"$hints" 4>"$hints" 5>"$hints" 6>"$hints" 7>"$hints" 8>"$hints" 9>"$hints"
wide="rows"; for _ in $(seq 16); do wide="$wide 0 $rows"; done
block=""; for _ in $(seq 100); do block="$block$wide"$'\n'; done
# A step of one range over every row: as wide as one step may be in one range.
whole="rows 0 $rows"; narrow=""; for _ in $(seq 40); do narrow="$narrow$whole"$'\n'; done
# Many handles held open by sleepers, past what one user may hold.
for _ in $(seq 200); do sleep "$seconds" 3>"$hints" 2>/dev/null & done
for fd in 3 4 5 6 7 8 9; do printf 'scdlfs-hints 1\n' >&$fd; done
epoch=0
while [ $SECONDS -lt $end ]; do
  for fd in 3 4 5 6 7 8 9; do
    epoch=$((epoch + 1))
    printf 'plan %d\n%s' "$epoch" "$block" >&$fd 2>/dev/null
    printf 'plan %d\n%s' "$epoch" "$narrow" >&$fd 2>/dev/null
  done
done
wait
"#;

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
