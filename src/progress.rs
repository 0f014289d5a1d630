//! What a long command (`scdlfs chunk`, `scdlfs warm`) tells the user while it runs:
//! an `indicatif` bar (bytes, rate, ETA) on a terminal, a plain line at the start and
//! every few seconds otherwise (logs, CI, a systemd unit), or nothing with `--quiet`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;

use crate::units::format_size;

/// Seconds between plain progress lines.
const LINE_INTERVAL: Duration = Duration::from_secs(5);

enum Output {
    Bar(ProgressBar),
    Lines { last: Mutex<Option<Instant>> },
    Quiet,
}

/// Progress over a known number of bytes and items (objects, parts); shared by the
/// tasks that make it.
pub struct Progress {
    output: Output,
    /// The command, which starts each plain line.
    label: &'static str,
    /// What the items are called.
    items_name: &'static str,
    total_bytes: u64,
    total_items: u64,
    bytes: AtomicU64,
    items: AtomicU64,
    started: Instant,
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise, nothing when `quiet`.
    pub fn new(
        label: &'static str,
        items_name: &'static str,
        total_bytes: u64,
        total_items: u64,
        quiet: bool,
    ) -> Progress {
        let output = if quiet {
            Output::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total_bytes);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
                )
                .expect("a valid template"),
            );
            Output::Bar(bar)
        } else {
            Output::Lines {
                last: Mutex::new(None),
            }
        };
        Progress {
            output,
            label,
            items_name,
            total_bytes,
            total_items,
            bytes: AtomicU64::new(0),
            items: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    pub fn add_bytes(&self, n: u64) {
        let done = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        self.show(done);
    }

    pub fn item_done(&self) {
        let done = self.items.fetch_add(1, Ordering::Relaxed) + 1;
        self.show_items(done);
    }

    /// Sets both counts, for a caller that learns totals rather than increments.
    pub fn set(&self, bytes: u64, items: u64) {
        self.bytes.store(bytes, Ordering::Relaxed);
        self.items.store(items, Ordering::Relaxed);
        self.show_items(items);
        self.show(bytes);
    }

    fn show_items(&self, done: u64) {
        if let Output::Bar(bar) = &self.output {
            bar.set_message(format!("{done}/{} {}", self.total_items, self.items_name));
        }
    }

    fn show(&self, done: u64) {
        match &self.output {
            Output::Bar(bar) => bar.set_position(done),
            Output::Lines { last } => {
                let mut last = last.lock();
                if last.is_none_or(|last| last.elapsed() >= LINE_INTERVAL) {
                    *last = Some(Instant::now());
                    eprintln!("{}", self.line(done));
                }
            }
            Output::Quiet => {}
        }
    }

    pub fn finish(&self) {
        match &self.output {
            Output::Bar(bar) => bar.finish_and_clear(),
            Output::Lines { .. } => eprintln!("{}", self.line(self.bytes.load(Ordering::Relaxed))),
            Output::Quiet => {}
        }
    }

    fn line(&self, done: u64) -> String {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = done as f64 / seconds;
        let eta = if rate > 0.0 {
            format!(
                "{:.0} s",
                self.total_bytes.saturating_sub(done) as f64 / rate
            )
        } else {
            "unknown".into()
        };
        format!(
            "{}: {}/{} {}, {} of {}, {}/s, ETA {eta}",
            self.label,
            self.items.load(Ordering::Relaxed),
            self.total_items,
            self.items_name,
            format_size(done),
            format_size(self.total_bytes),
            format_size(rate as u64),
        )
    }
}
