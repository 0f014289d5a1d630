//! Where the daemon's log goes and how it looks.
//!
//! - To standard error by default: colours only on a terminal; under systemd (stderr is
//!   the stream `JOURNAL_STREAM` names) without timestamps, which the journal adds, and
//!   with each line's priority as a `<N>` prefix, which the journal takes as the
//!   entry's priority (`journalctl -p warning`).
//! - To `--log-directory`: one file a day, `scdlfs.YYYY-MM-DD.log`, the oldest deleted
//!   beyond `--log-max-files` (tracing-appender's rolling appender).
//! - As text or, with `--log-format json`, one JSON object a line.
//!
//! Every line passes through [`Redacting`](crate::store::redact::Redacting): no URL credentials reach a log.

use std::fmt;
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::ValueEnum;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::store::redact::RedactingWriter;

#[derive(Clone, Copy, Debug, Default, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// What [`init`] sets up.
#[derive(Clone, Debug)]
pub struct LogSettings {
    /// A tracing filter: a level (`info`) or directives (`info,scdlfs::fetch=debug`).
    pub filter: String,
    /// Debug level for scdlfs and fuser, on top of `filter`.
    pub debug: bool,
    pub format: LogFormat,
    /// Daily files in this directory instead of standard error, and how many to keep.
    pub directory: Option<(PathBuf, usize)>,
}

impl LogSettings {
    /// Plain text at `filter` on standard error.
    pub fn stderr(filter: &str) -> LogSettings {
        LogSettings {
            filter: filter.to_owned(),
            debug: false,
            format: LogFormat::Text,
            directory: None,
        }
    }

    fn filter(&self) -> EnvFilter {
        let mut directives = self.filter.clone();
        if self.debug {
            directives.push_str(",scdlfs=debug,fuser=debug");
        }
        // fuser warns when its own unmount-on-drop finds the mount already gone, which
        // is how every clean shutdown here ends.
        directives.push_str(",fuser::mnt=error");
        EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info"))
    }
}

/// Installs the process's logger (once; later calls change nothing).
pub fn init(settings: &LogSettings) -> anyhow::Result<()> {
    let (writer, ansi, journal) = match &settings.directory {
        Some((directory, max_files)) => {
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o750,
            )
            .create(directory)
            .with_context(|| format!("cannot create log directory {}", directory.display()))?;
            let files = tracing_appender::rolling::Builder::new()
                .rotation(tracing_appender::rolling::Rotation::DAILY)
                .filename_prefix("scdlfs")
                .filename_suffix("log")
                .max_log_files((*max_files).max(1))
                .build(directory)
                .with_context(|| format!("cannot log to {}", directory.display()))?;
            (BoxMakeWriter::new(RedactingWriter(files)), false, false)
        }
        None => (
            BoxMakeWriter::new(RedactingWriter(std::io::stderr)),
            std::io::stderr().is_terminal(),
            stderr_is_journal(),
        ),
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    let layer: Box<dyn Layer<Registry> + Send + Sync> = match (settings.format, journal) {
        (LogFormat::Text, false) => layer.boxed(),
        (LogFormat::Text, true) => layer
            .event_format(JournalPriority(
                tracing_subscriber::fmt::format().without_time(),
            ))
            .boxed(),
        (LogFormat::Json, false) => layer.json().boxed(),
        (LogFormat::Json, true) => layer
            .event_format(JournalPriority(
                tracing_subscriber::fmt::format().json().without_time(),
            ))
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(settings.filter()))
        .try_init();
    Ok(())
}

/// Whether standard error is connected to the journal: systemd sets `JOURNAL_STREAM`
/// to the device and inode of the stream it gave the service, which a child that
/// redirected its stderr elsewhere still inherits.
fn stderr_is_journal() -> bool {
    let Some((device, inode)) = std::env::var("JOURNAL_STREAM").ok().and_then(|value| {
        let (device, inode) = value.split_once(':')?;
        Some((device.parse::<u64>().ok()?, inode.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    rustix::fs::fstat(std::io::stderr())
        .is_ok_and(|stat| stat.st_dev == device && stat.st_ino == inode)
}

/// Prefixes each event with its syslog priority, `<3>` (error) to `<7>` (debug), which
/// journald strips and records as the entry's priority.
struct JournalPriority<F>(F);

impl<S, N, F> FormatEvent<S, N> for JournalPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(context, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_raises_scdlfs_and_fuser_over_the_level() {
        let mut settings = LogSettings::stderr("warn");
        settings.debug = true;
        let filter = settings.filter().to_string();
        for directive in ["warn", "scdlfs=debug", "fuser=debug", "fuser::mnt=error"] {
            assert!(filter.contains(directive), "{directive} not in {filter}");
        }
        assert!(!LogSettings::stderr("warn")
            .filter()
            .to_string()
            .contains("scdlfs=debug"));
    }

    #[test]
    fn journal_lines_carry_their_priority_and_no_timestamp() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .event_format(JournalPriority(
                tracing_subscriber::fmt::format().without_time(),
            ))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!("cache disk full");
            tracing::info!("mounted");
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert!(
            lines[0].starts_with("<4>") && lines[0].contains("cache disk full"),
            "{log}"
        );
        assert!(
            lines[1].starts_with("<6>") && lines[1].contains("mounted"),
            "{log}"
        );
        // No timestamp: the line goes from the priority straight to the level.
        assert!(lines[1].starts_with("<6> INFO"), "{log}");
    }
}
