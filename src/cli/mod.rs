//! The command line: `mount`, `unmount`, `status`, `warm`, `chunk`, `manifest` and
//! `demo`, and `man` and `completions`, generated from the definitions here.

use anyhow::Context;
mod chunk_cmd;
mod daemon;
mod demo;
mod generated;
mod lifetime;
mod logging;
mod manifest_cmd;
mod mount_cmd;
mod mount_flags;
mod notify;
mod spellings;
mod status_cmd;
mod warm_cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use std::ffi::OsString;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

pub use logging::LogFormat;

use crate::fs::Ownership;
use crate::store::ClientSettings;
use crate::units::parse_size;

#[derive(Parser, Debug)]
#[command(
    name = "scdlfs",
    version,
    about = "Mount a remote chunked SCDL dataset as a local directory"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Mount SOURCE (s3://, gs://, http(s)://, file:// or a local folder) at MOUNTPOINT.
    Mount(Box<MountArgs>),
    /// Unmount a scdlfs mount (also one left behind by a killed daemon).
    Unmount {
        mountpoint: PathBuf,
        /// Detach now even if files are open; the mount goes when they close.
        #[arg(long)]
        lazy: bool,
    },
    /// Print a mount's counters: downloads, waits, cache, prefetch plans.
    Status {
        mountpoint: PathBuf,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
        /// Refresh every SECONDS until interrupted.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<f64>,
    },
    /// Fetch parts of a dataset (MOUNTPOINT/DATASET) into the cache of its running
    /// mount, within the cache budget, e.g. before a job starts.
    Warm(warm_cmd::WarmArgs),
    /// Partition a monolithic SCDL archive (a local folder or any store) into the chunked
    /// layout at any store, streaming, resumable, header published last.
    Chunk(Box<chunk_cmd::ChunkArgs>),
    /// Write the manifest of a chunked dataset that another tool chunked (every object
    /// with its size and ETag, in one object beside header.sch), so that a mount opens
    /// it with one GET instead of listing it; `chunk` writes one itself.
    Manifest(Box<manifest_cmd::ManifestArgs>),
    /// Make a synthetic chunked dataset, mount it from a local folder, read one epoch
    /// through the mount in shuffled chunk-window order, check every row, and report.
    Demo(demo::DemoArgs),
    /// Print the manual page (roff; e.g. `scdlfs man | man -l -`), or write one per
    /// command into a directory.
    Man(generated::ManArgs),
    /// Print the shell completion script for SHELL.
    Completions(generated::CompletionsArgs),
    /// Print the mount command's flags as JSON (for the Python package).
    #[command(hide = true)]
    MountFlags,
}

/// How to reach an object store; shared by every command that talks to one.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Custom endpoint: S3-compatible (MinIO, Ceph, a test server; path-style requests)
    /// or, for gs://, a GCS emulator or private endpoint.
    #[arg(long, value_name = "URL", help_heading = "Object store")]
    pub endpoint_url: Option<String>,
    /// S3 bucket region [default: AWS_REGION or the profile's, else asked from S3 (not
    /// with --endpoint-url), else us-east-1].
    #[arg(long, help_heading = "Object store")]
    pub region: Option<String>,
    /// Send unsigned requests (public buckets).
    #[arg(long, help_heading = "Object store")]
    pub no_sign_request: bool,
    /// S3: the profile of ~/.aws/config and ~/.aws/credentials to take credentials
    /// (keys, credential_process, SSO, assume-role, web identity) and region from; its
    /// credentials win over AWS_ACCESS_KEY_ID [default: AWS_PROFILE, else the SDK's
    /// chain: environment, default profile, web identity, ECS, instance metadata].
    #[arg(long, help_heading = "Object store")]
    pub profile: Option<String>,
    /// S3: the requester pays for requests and downloads (x-amz-request-payer).
    #[arg(long, help_heading = "Object store")]
    pub requester_pays: bool,
    /// S3: path-style URLs (https://s3.REGION.amazonaws.com/BUCKET/KEY); always on with
    /// --endpoint-url.
    // The doc comment is the flag's --help text, where a bare URL reads right.
    #[allow(rustdoc::bare_urls)]
    #[arg(long, help_heading = "Object store")]
    pub force_path_style: bool,
    /// S3: the account ID that must own the bucket. Not supported yet: the mount
    /// refuses to start with it rather than ignore it.
    #[arg(long, value_name = "ACCOUNT_ID", help_heading = "Object store")]
    pub expected_bucket_owner: Option<String>,
    /// GCS: a service-account key file (JSON) [default: GOOGLE_SERVICE_ACCOUNT, else
    /// application default credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's file,
    /// the metadata server].
    #[arg(long, value_name = "FILE", help_heading = "Object store")]
    pub key_file: Option<PathBuf>,
    /// GCS: the project billed for requests to a requester-pays bucket
    /// (x-goog-user-project).
    #[arg(long, value_name = "PROJECT", help_heading = "Object store")]
    pub billing_project: Option<String>,
    /// Longest one HTTP attempt may take, headers and body (e.g. 10s, 1m).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "10s", help_heading = "Object store")]
    pub request_timeout: Duration,
    /// An attempt that receives no byte for this long is abandoned and retried.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "5s", help_heading = "Object store")]
    pub stall_timeout: Duration,
    /// Tries per request (the first included) for errors that can heal: 5xx, 429,
    /// timeouts, broken connections. 403, 404, 412 and 416 are never retried.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Object store")]
    pub max_attempts: u32,
    /// Every FUSE operation is answered within this bound, however the store
    /// misbehaves: a read gets its bytes, a lookup or directory listing its entries
    /// (however many pages the listing takes), or EIO (a read(2) that fails within
    /// twice this: the kernel retries once).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "15s", help_heading = "Performance")]
    pub read_timeout: Duration,
}

impl StoreArgs {
    pub fn client_settings(&self) -> ClientSettings {
        ClientSettings {
            endpoint_url: self.endpoint_url.clone(),
            region: self.region.clone(),
            no_sign_request: self.no_sign_request,
            profile: self.profile.clone(),
            requester_pays: self.requester_pays,
            force_path_style: self.force_path_style,
            expected_bucket_owner: self.expected_bucket_owner.clone(),
            key_file: self.key_file.clone(),
            billing_project: self.billing_project.clone(),
            bounds: crate::store::NetworkBounds {
                request_timeout: self.request_timeout,
                stall_timeout: self.stall_timeout,
                max_attempts: self.max_attempts,
                read_timeout: self.read_timeout,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum View {
    /// Chunked datasets appear as monolithic archives (what released readers open).
    Flat,
    /// The bucket exactly as stored.
    Raw,
}

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, http(s)://HOST/PREFIX, file:///PATH or a
    /// path; or env:VAR to read it from the variable VAR, so that a source with a
    /// password is on no command line (which every local user can read).
    pub source: String,
    pub mountpoint: PathBuf,

    /// How chunked datasets are shown.
    #[arg(long, value_enum, default_value_t = View::Flat, help_heading = "View")]
    pub view: View,
    /// For buckets that grow or change while mounted: a directory listed this long ago
    /// (e.g. 5m) is listed again at its next lookup, so new datasets and objects appear,
    /// vanished ones go, and changed ones open as their new version (files open already
    /// keep the version they opened) [default: listings stand for the mount's life].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, help_heading = "View")]
    pub metadata_ttl: Option<Duration>,

    /// Directory for cached parts (one mount per directory). It outlives the mount: a
    /// later mount of the same source adopts the parts whose objects are unchanged.
    #[arg(long, value_name = "DIR", help_heading = "Cache")]
    pub cache_dir: Option<PathBuf>,
    /// Wipe a --cache-dir that holds the cache of another source or scdlfs version
    /// (without it, such a directory is refused).
    #[arg(long, help_heading = "Cache")]
    pub cache_reset: bool,
    /// Cache budget, e.g. 20GiB [default: half the free space of the cache's filesystem,
    /// at least 256MiB]; refused if that filesystem cannot hold it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Cache")]
    pub cache_size: Option<u64>,
    /// Also keep at most this many SCDL chunks cached (the Python loader's knob).
    #[arg(long, value_name = "N", help_heading = "Cache")]
    pub max_cached_chunks: Option<usize>,
    /// A read the cache serves also brings the window of this size around it into the
    /// page cache, from cached parts only (never a download), as a read of the cache's
    /// disk would; 0: off [default: the read-ahead of the cache directory's disk, at
    /// most 16MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Cache")]
    pub cache_read_around: Option<u64>,

    #[command(flatten)]
    pub store: StoreArgs,

    /// Bytes per ranged GET and per cached part.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "8MiB", help_heading = "Performance")]
    pub read_part_size: u64,
    /// Downloads in flight at once, over all files; prefetches take at most three
    /// quarters of them, the rest waits for readers.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 16,
        help_heading = "Performance"
    )]
    pub max_concurrent_requests: usize,
    /// Steps of an announced plan kept fetching ahead of the reader.
    #[arg(
        long,
        value_name = "STEPS",
        default_value_t = 4,
        help_heading = "Performance"
    )]
    pub prefetch_lookahead: usize,
    /// The most memory downloads may hold at once: the blocks of bodies not yet in
    /// their cache files, whole bodies the cache cannot take, parts kept because the
    /// cache is full. At least one part.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "512MiB", help_heading = "Performance")]
    pub max_fetch_memory: u64,
    /// Threads reading FUSE requests from the kernel.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 4,
        help_heading = "Performance"
    )]
    pub fuse_threads: usize,
    /// The kernel's read-ahead for the mount: the most a memory-map fault or an
    /// in-order reader asks for at once (unset: the kernel's 128KiB). A larger window
    /// speeds readers that take whole chunks in order, but every random fault in a map
    /// then reads half of it on either side: ranks reading interleaved shares fetch
    /// bytes of each other's rows. Setting it needs root; otherwise the default stays,
    /// with a warning.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Performance")]
    pub read_ahead: Option<u64>,

    /// Mount options in fstab spelling, e.g. `-o allow_other,cache_size=20GiB`: each is
    /// the flag of that name (underscores read as dashes); mount(8)'s own (ro, nodev,
    /// nofail, _netdev, x-systemd.*, ...) are ignored. Every flag can also be given as
    /// an SCDLFS_<FLAG> environment variable, as shown.
    // The doc comment is the flag's --help text, where <FLAG> is a placeholder.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(
        short = 'o',
        long = "options",
        value_name = "OPTS",
        help_heading = "Mount"
    )]
    pub options: Vec<String>,
    /// Let users other than the mounting one use the mount, as the files' owner and
    /// modes allow (checked by the kernel).
    #[arg(long, help_heading = "Mount")]
    pub allow_other: bool,
    /// Let root use the mount besides the mounting user.
    #[arg(long, help_heading = "Mount", conflicts_with = "allow_other")]
    pub allow_root: bool,
    /// Owner of the files and directories [default: the mounting user].
    #[arg(long, value_name = "UID", help_heading = "Mount")]
    pub uid: Option<u32>,
    /// Group of the files and directories [default: the mounting user's].
    #[arg(long, value_name = "GID", help_heading = "Mount")]
    pub gid: Option<u32>,
    /// Mode of the files, in octal. The released SCDL reader opens files read-write, so
    /// users who run it need write bits (every write still fails with EROFS); the hint
    /// files are writable by exactly those who may read [default: 0644; 0666 with
    /// --allow-other, so that the other users it lets in can run the reader].
    #[arg(long, value_name = "MODE", value_parser = parse_mode, help_heading = "Mount")]
    pub file_mode: Option<u16>,
    /// Mode of the directories, in octal.
    #[arg(long, value_name = "MODE", value_parser = parse_mode, default_value = "0755", help_heading = "Mount")]
    pub dir_mode: u16,
    /// Stay in the foreground instead of detaching.
    #[arg(long, short = 'f', help_heading = "Mount")]
    pub foreground: bool,

    /// error, warn, info, debug or trace (or a tracing filter).
    #[arg(long, default_value = "info", help_heading = "Logging")]
    pub log_level: String,
    /// Debug logs of scdlfs and the FUSE session, whatever --log-level says.
    #[arg(short = 'd', long, help_heading = "Logging")]
    pub debug: bool,
    /// text, or json: one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, help_heading = "Logging")]
    pub log_format: LogFormat,
    /// Log to daily files DIR/scdlfs.YYYY-MM-DD.log instead of standard error.
    #[arg(long, value_name = "DIR", help_heading = "Logging")]
    pub log_directory: Option<PathBuf>,
    /// Daily files kept in --log-directory; older ones are deleted.
    #[arg(long, value_name = "N", default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Logging")]
    pub log_max_files: u32,
    /// Where a detached daemon's standard error goes: its log, unless --log-directory
    /// [default: CACHE_DIR/scdlfs.log].
    #[arg(long, value_name = "FILE", help_heading = "Logging")]
    pub log_file: Option<PathBuf>,

    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464. No
    /// authentication: keep it on loopback [default: off].
    #[arg(long, value_name = "ADDR", help_heading = "Monitoring")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Unmount and exit once this process has exited, however it ended (killed
    /// included), or with several, once all of them have; one gone already counts as
    /// exited. More can attach later (`+PID` into the root's user.scdlfs.users
    /// attribute) and leave (`-PID`). Files still open keep the detached mount served
    /// until they close, as at any stop. For a mount started on a program's behalf (the
    /// Python package's).
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..), help_heading = "Lifetime")]
    pub exit_with_pid: Vec<i32>,
    /// A directory made for this mount alone (e.g. by mktemp -d) that holds the
    /// mountpoint, and maybe the cache and the log: removed with all it holds once the
    /// daemon has unmounted. Refused if it holds any other directory.
    #[arg(long, value_name = "DIR", help_heading = "Lifetime")]
    pub scratch_dir: Option<PathBuf>,
}

impl MountArgs {
    pub fn log_settings(&self) -> logging::LogSettings {
        logging::LogSettings {
            filter: self.log_level.clone(),
            debug: self.debug,
            format: self.log_format,
            directory: self
                .log_directory
                .clone()
                .map(|directory| (directory, self.log_max_files as usize)),
        }
    }

    pub fn ownership(&self) -> Ownership {
        let user = Ownership::of_mounting_user();
        Ownership {
            uid: self.uid.unwrap_or(user.uid),
            gid: self.gid.unwrap_or(user.gid),
            file_mode: self.file_mode.unwrap_or(if self.allow_other {
                ALLOW_OTHER_FILE_MODE
            } else {
                OWNER_FILE_MODE
            }),
            dir_mode: self.dir_mode,
        }
    }
}

/// Files' mode when only the mounting user (and maybe root) uses the mount.
const OWNER_FILE_MODE: u16 = 0o644;
/// Files' mode with `--allow-other`: the users it lets in open the files read-write, as
/// the released SCDL reader does (writes still fail with EROFS).
const ALLOW_OTHER_FILE_MODE: u16 = 0o666;

/// A permission mode in octal (`0644`, `644` or `0o644`).
fn parse_mode(text: &str) -> Result<u16, NotAMode> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let not_a_mode = |source| NotAMode {
        text: text.to_owned(),
        source,
    };
    match u16::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        Ok(_) => Err(not_a_mode(None)),
        Err(error) => Err(not_a_mode(Some(error))),
    }
}

/// A `--file-mode` or `--dir-mode` that [`parse_mode`] cannot read.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not an octal mode between 0 and 0777")]
struct NotAMode {
    text: String,
    /// Why the digits are not a number; `None` for a number above 0777.
    source: Option<std::num::ParseIntError>,
}

/// How a SOURCE (or chunk TARGET) names a variable that holds it: `env:VAR`.
pub const SOURCE_FROM_ENVIRONMENT: &str = "env:";

/// The store a SOURCE names: itself, or with `env:VAR` the value of the variable VAR,
/// so that one with credentials (`https://user:password@host/x`) need not be on a
/// command line, which every local user can read in /proc/PID/cmdline. Its secrets are
/// registered for redaction.
fn resolve_source(source: &str) -> anyhow::Result<String> {
    let text = match source.strip_prefix(SOURCE_FROM_ENVIRONMENT) {
        Some(name) => std::env::var(name)
            .ok()
            .filter(|value| !value.trim().is_empty())
            .with_context(|| format!("{source}: the variable {name} is not set"))?
            .trim()
            .to_owned(),
        None => source.to_owned(),
    };
    crate::store::redact::register_url_secrets(&text);
    Ok(text)
}

/// Parses a command line, with the other spellings of its flags ([`spellings`]).
pub(crate) fn parse_from(argv: impl IntoIterator<Item = OsString>) -> Result<Cli, clap::Error> {
    let argv: Vec<OsString> = argv.into_iter().collect();
    let command = spellings::with_environment(Cli::command());
    let cli = Cli::from_arg_matches(&command.clone().try_get_matches_from(&argv)?)?;
    match &cli.command {
        Command::Mount(args) if !args.options.is_empty() => {
            let expanded = spellings::expand_options(argv);
            Cli::from_arg_matches(&command.try_get_matches_from(expanded)?)
        }
        _ => Ok(cli),
    }
}

pub fn main() -> ExitCode {
    // Before anything can print them: the secrets this process was given.
    for arg in std::env::args_os() {
        crate::store::redact::register_url_secrets(&arg.to_string_lossy());
    }
    crate::store::redact::register_environment_secrets();
    let cli = parse_from(std::env::args_os()).unwrap_or_else(|error| error.exit());
    let result = match cli.command {
        Command::Mount(args) => mount_cmd::run(*args),
        Command::Unmount { mountpoint, lazy } => {
            crate::unmount::unmount(&mountpoint, lazy).map_err(anyhow::Error::from)
        }
        Command::Status {
            mountpoint,
            json,
            watch,
        } => status_cmd::run(&mountpoint, json, watch),
        // Its exit status says more than success or failure.
        Command::Warm(args) => match warm_cmd::run(args) {
            Ok(code) => return code,
            Err(error) => Err(error),
        },
        Command::Chunk(args) => chunk_cmd::run(*args),
        Command::Manifest(args) => manifest_cmd::run(*args),
        Command::Demo(args) => demo::run(args),
        Command::Man(args) => generated::man(args),
        Command::Completions(args) => generated::completions(args),
        Command::MountFlags => mount_flags::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "scdlfs: {}",
                crate::store::redact::redact(&format!("{error:#}"))
            );
            ExitCode::FAILURE
        }
    }
}
