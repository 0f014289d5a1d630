//! `scdlfs warm MOUNTPOINT/DATASET`: asks the running mount to fetch parts of a
//! dataset into its cache ([`crate::warm`]), shows the job's progress, and stops the
//! job on Ctrl-C (a second Ctrl-C leaves at once; the job then stops by itself when
//! its lease runs out).
//!
//! Exit status: 0 when every part that fits the budget is cached (a selection larger
//! than the budget is warmed as far as it fits, and says so), 1 on errors (a part
//! that failed, a refused request), 130 when interrupted.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context};
use clap::{ArgGroup, Args};
use rustix::io::Errno;

use crate::progress::Progress;
use crate::units::format_size;
use crate::warm::{Selection, WarmProgress, WarmRequest, WarmState, WARM_XATTR};

/// How often the progress is read.
const POLL: Duration = Duration::from_millis(200);

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("what").required(true).args(["chunks", "rows", "all"])))]
pub struct WarmArgs {
    /// A dataset directory of a running scdlfs mount (MOUNTPOINT/DATASET).
    pub dataset: PathBuf,
    /// Chunks A..B (B excluded; A..=B includes it; A.. to the end). A monolithic
    /// dataset's chunks are virtual, of the rows its hint file announces.
    #[arg(long, value_name = "A..B", value_parser = parse_range)]
    pub chunks: Option<Range<u64>>,
    /// Rows A..B; a chunked dataset warms the whole chunks that hold them.
    #[arg(long, value_name = "A..B", value_parser = parse_range)]
    pub rows: Option<Range<u64>>,
    /// The whole dataset (as far as the cache budget allows).
    #[arg(long)]
    pub all: bool,
    /// Print only the summary and errors.
    #[arg(long)]
    pub quiet: bool,
}

/// `A..B`, `A..=B`, `A..`, `..B` or a single `N`.
fn parse_range(text: &str) -> Result<Range<u64>, BadRange> {
    let number = |word: &str, default: u64| -> Result<u64, BadRange> {
        if word.is_empty() {
            return Ok(default);
        }
        word.parse().map_err(|source| BadRange::NotANumber {
            word: word.to_owned(),
            source,
        })
    };
    let range = if let Some((start, end)) = text.split_once("..=") {
        number(start, 0)?..number(end, u64::MAX - 1)? + 1
    } else if let Some((start, end)) = text.split_once("..") {
        number(start, 0)?..number(end, u64::MAX)?
    } else {
        let n = number(text, 0)?;
        n..n + 1
    };
    if range.is_empty() {
        return Err(BadRange::Empty(text.to_owned()));
    }
    Ok(range)
}

/// A `--chunks` or `--rows` that [`parse_range`] cannot read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum BadRange {
    #[error("{word:?} is not a non-negative integer")]
    NotANumber {
        word: String,
        source: std::num::ParseIntError,
    },
    #[error("{0:?} is an empty range")]
    Empty(String),
}

pub fn run(args: WarmArgs) -> anyhow::Result<ExitCode> {
    let selection = match (&args.chunks, &args.rows) {
        (Some(chunks), _) => Selection::Chunks(chunks.clone()),
        (_, Some(rows)) => Selection::Rows(rows.clone()),
        _ => Selection::All,
    };
    let dataset = args.dataset.as_path();
    let hints = dataset.join(scdl_format::hint::HINT_FILE);
    if !hints.exists() {
        bail!(
            "{} is not a dataset directory of a scdlfs mount (it has no {})",
            dataset.display(),
            scdl_format::hint::HINT_FILE
        );
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let token = format!("{}-{nanos}", std::process::id());
    send(
        dataset,
        &WarmRequest::Start {
            token: token.clone(),
            selection,
        },
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    runtime.block_on(follow(dataset, &token, args.quiet))
}

/// Reads the job's progress until it ends, showing it; stops it on Ctrl-C.
async fn follow(dataset: &Path, token: &str, quiet: bool) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupts = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut interrupted = false;
    let mut shown: Option<Progress> = None;
    loop {
        let progress = read_progress(dataset)?;
        if progress.token != token {
            bail!(
                "another `scdlfs warm` of {} replaced this one",
                dataset.display()
            );
        }
        if progress.state != WarmState::Resolving {
            let bar = shown.get_or_insert_with(|| {
                Progress::new(
                    "warm",
                    "parts",
                    progress.bytes_total,
                    progress.parts_total,
                    quiet,
                )
            });
            bar.set(
                progress.bytes_done(),
                progress.parts_already_cached + progress.parts_fetched,
            );
        }
        if progress.state.is_final() {
            if let Some(bar) = &shown {
                bar.finish();
            }
            return Ok(report(dataset, &progress, interrupted));
        }
        tokio::select! {
            _ = interrupts.recv() => {
                if interrupted {
                    eprintln!("scdlfs warm: interrupted again; leaving the job to stop by itself");
                    return Ok(ExitCode::from(130));
                }
                interrupted = true;
                eprintln!("scdlfs warm: stopping (the parts under way finish first; Ctrl-C again to leave now)");
                send(dataset, &WarmRequest::Stop { token: token.to_owned() })?;
            }
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Prints what the job did and returns the exit status it calls for.
fn report(dataset: &Path, p: &WarmProgress, interrupted: bool) -> ExitCode {
    println!(
        "warm {}: {} parts ({}) cached of {} within the budget: {} were cached already ({}), {} fetched ({}){}{}",
        dataset.display(),
        p.parts_already_cached + p.parts_fetched,
        format_size(p.bytes_done()),
        p.parts_total,
        p.parts_already_cached,
        format_size(p.bytes_already_cached),
        p.parts_fetched,
        format_size(p.bytes_fetched),
        if p.parts_not_kept > 0 {
            format!("; {} fetched but not kept (pinned data filled the cache)", p.parts_not_kept)
        } else {
            String::new()
        },
        if p.parts_failed > 0 {
            format!("; {} FAILED", p.parts_failed)
        } else {
            String::new()
        },
    );
    if p.parts_over_budget > 0 {
        eprintln!(
            "scdlfs warm: the selection is larger than the cache budget ({}): {} more parts ({}) were not warmed",
            format_size(p.budget_bytes),
            p.parts_over_budget,
            format_size(p.bytes_over_budget)
        );
    }
    match p.state {
        WarmState::Done if p.parts_failed == 0 => ExitCode::SUCCESS,
        WarmState::Stopped if interrupted => {
            eprintln!("scdlfs warm: stopped");
            ExitCode::from(130)
        }
        _ => {
            eprintln!(
                "scdlfs warm: {}",
                p.message
                    .as_deref()
                    .unwrap_or("some parts could not be fetched")
            );
            ExitCode::FAILURE
        }
    }
}

fn send(dataset: &Path, request: &WarmRequest) -> anyhow::Result<()> {
    rustix::fs::setxattr(
        dataset,
        WARM_XATTR,
        request.encode().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|errno| match errno {
        Errno::BUSY => anyhow!(
            "{} is being warmed already by another `scdlfs warm`",
            dataset.display()
        ),
        Errno::NOTSUP | Errno::NODATA => anyhow!(
            "{} is not a dataset of a scdlfs mount that can warm (an older daemon?)",
            dataset.display()
        ),
        Errno::ACCESS | Errno::PERM => anyhow!(
            "warming {} needs write permission on it: run as the mount's owner or root",
            dataset.display()
        ),
        Errno::INVAL => anyhow!("the mount refused the request (see its log)"),
        other => anyhow!(
            "cannot ask the mount to warm {}: {other}",
            dataset.display()
        ),
    })
}

fn read_progress(dataset: &Path) -> anyhow::Result<WarmProgress> {
    let mut buf = vec![0u8; 64 << 10];
    let len = rustix::fs::getxattr(dataset, WARM_XATTR, &mut buf[..]).map_err(|errno| {
        anyhow!(
            "cannot read the warm progress of {}: {errno}",
            dataset.display()
        )
    })?;
    buf.truncate(len);
    serde_json::from_slice(&buf).context("unreadable warm progress")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_rust_writes_them() {
        assert_eq!(parse_range("2..5"), Ok(2..5));
        assert_eq!(parse_range("2..=5"), Ok(2..6));
        assert_eq!(parse_range("7"), Ok(7..8));
        assert_eq!(parse_range("..3"), Ok(0..3));
        assert_eq!(parse_range("4.."), Ok(4..u64::MAX));
        assert!(parse_range("5..5").is_err());
        assert!(parse_range("a..b").is_err());
    }
}
