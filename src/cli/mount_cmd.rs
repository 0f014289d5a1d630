//! `scdlfs mount`: resolve the options, detach unless `--foreground`, mount, then serve
//! until SIGINT/SIGTERM or an external unmount. Readiness and shutdown are reported to
//! the detaching parent and, under systemd (`Type=notify`), to systemd.

use anyhow::{anyhow, bail, Context};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::Signal;

use super::{daemon, lifetime, logging, notify, MountArgs, View};
use crate::catalog::DirMode;
use crate::metrics_http;
use crate::mount::{check_mountpoint, Mount, MountSettings};
use crate::store::Source;
use crate::units::format_size;
use crate::users::Users;

const MIN_DEFAULT_CACHE: u64 = 256 << 20;

pub fn run(args: MountArgs) -> anyhow::Result<()> {
    let source_text = super::resolve_source(&args.source)?;
    let source = Source::parse(&source_text).map_err(anyhow::Error::msg)?;
    let cache_dir = match &args.cache_dir {
        Some(dir) => dir.clone(),
        None => default_cache_dir(&args.mountpoint)?,
    };
    let scratch = args
        .scratch_dir
        .as_deref()
        .map(|dir| lifetime::Scratch::check(dir, &args.mountpoint, &cache_dir))
        .transpose()?;
    // Here too (`mount::assemble` checks every mount's), before the log file goes there.
    crate::cache_dir_check::prepare(&cache_dir)?;
    if !args.foreground {
        // Obvious mistakes are reported here, before anything detaches.
        check_mountpoint(&args.mountpoint).map_err(anyhow::Error::msg)?;
        let log_file = args
            .log_file
            .clone()
            .unwrap_or_else(|| cache_dir.join("scdlfs.log"));
        return daemon::spawn_and_wait(&log_file, &args.source, &source_text, &args.mountpoint);
    }
    crate::process_memory::limit_heap_arenas();
    let served =
        logging::init(&args.log_settings()).and_then(|()| serve(&args, &source, &cache_dir));
    if let Err(error) = &served {
        let message = format!("{error:#}");
        tracing::error!("{message}");
        daemon::report(&message);
    }
    // Only after an unmount: after a failure the log says why, and a mount that did
    // not start leaves its starter alive to clean up.
    if let (Ok(()), Some(scratch)) = (&served, scratch) {
        scratch.remove();
    }
    served
}

fn serve(args: &MountArgs, source: &Source, cache_dir: &Path) -> anyhow::Result<()> {
    let users = Arc::new(Users::watching(&args.exit_with_pid)?);
    check_part_size(args)?;
    let cache_bytes = cache_budget(args.cache_size, cache_dir, args.read_part_size)?;
    // The store's client outlives this runtime: opening it only reads the
    // configuration (and may ask S3 for the bucket's region).
    let (store, prefix) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start")?
        .block_on(source.open(&args.store.client_settings()))
        .map_err(anyhow::Error::msg)?;
    let metrics_listener = args
        .metrics_addr
        .map(|address| {
            metrics_http::bind(address)
                .with_context(|| format!("cannot serve metrics at {address}"))
        })
        .transpose()?;
    let settings = mount_settings(args, source, cache_dir, cache_bytes, users.clone());
    // Each resident part keeps its file open while the limit allows; the rest are
    // reopened when read, which a higher limit spares.
    let open_file_limit = crate::cache::open_files::raise_descriptor_limit();
    // From before the mount appears until the handlers below are in place: a stop sent
    // as soon as the mount is seen (a test, a service manager) would otherwise find the
    // default action and kill the daemon, leaving a dead mount.
    let stop_signals = StopSignalsHeld::hold();
    let mount =
        Mount::start(store, prefix, &args.mountpoint, &settings).map_err(anyhow::Error::msg)?;
    tracing::info!(
        source = %settings.fs_name,
        mountpoint = %mount.mountpoint().display(),
        cache = %format_size(cache_bytes),
        cache_dir = %cache_dir.display(),
        cache_read_around = %format_size(settings.cache_read_around),
        open_file_limit,
        "mounted"
    );
    // Before reporting ready: a stop that follows at once must find the handlers (the
    // default action would kill the daemon and leave a dead mount).
    let (interrupt, terminate) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _entered = mount.runtime().enter();
        (
            signal(SignalKind::interrupt()).context("SIGINT handler")?,
            signal(SignalKind::terminate()).context("SIGTERM handler")?,
        )
    };
    drop(stop_signals);
    if let Some(listener) = metrics_listener {
        let address = listener.local_addr().map_err(anyhow::Error::msg)?;
        metrics_http::serve(listener, mount.observer().clone(), mount.runtime().handle())
            .with_context(|| format!("cannot serve metrics at {address}"))?;
        tracing::info!(url = %format!("http://{address}/metrics"), "serving metrics");
    }
    daemon::report("ready");
    notify::ready(&format!(
        "Mounted {} at {}",
        settings.fs_name,
        mount.mountpoint().display()
    ));
    let stopped = wait_for_stop(&mount, &users, interrupt, terminate);
    match stopped {
        Some(reason) => {
            notify::stopping(&format!("Unmounting after {reason}"));
            tracing::info!(after = reason, "unmounting");
        }
        None => {
            notify::stopping("Unmounted from outside");
            tracing::info!("unmounted from outside; exiting");
        }
    }
    mount.unmount().context("unmount failed")
}

/// The part size is whole pages, and the fetcher's memory holds one part at least.
fn check_part_size(args: &MountArgs) -> anyhow::Result<()> {
    if args.read_part_size < 4096 || !args.read_part_size.is_multiple_of(4096) {
        bail!("--read-part-size must be a positive multiple of 4KiB");
    }
    if args.max_fetch_memory < args.read_part_size {
        return Err(anyhow!(
            "--max-fetch-memory {} is below one part of --read-part-size {}",
            format_size(args.max_fetch_memory),
            format_size(args.read_part_size)
        ));
    }
    Ok(())
}

/// What the mount is, from the command line: `cache_bytes` the budget checked against
/// the cache directory's disk, `users` the processes it lives for.
fn mount_settings(
    args: &MountArgs,
    source: &Source,
    cache_dir: &Path,
    cache_bytes: u64,
    users: Arc<Users>,
) -> MountSettings {
    MountSettings {
        fs_name: source.display_name(),
        // Only object stores are reached through --endpoint-url.
        endpoint: match source {
            Source::S3 { .. } | Source::Gcs { .. } => args
                .store
                .endpoint_url
                .as_deref()
                .map(crate::store::redact_urls),
            Source::Http { .. } | Source::Local { .. } => None,
        },
        view: match args.view {
            View::Flat => DirMode::Discover,
            View::Raw => DirMode::Raw,
        },
        cache_dir: cache_dir.to_owned(),
        cache_reset: args.cache_reset,
        cache_bytes,
        max_cached_chunks: args.max_cached_chunks,
        part_size: args.read_part_size,
        max_concurrent_requests: args.max_concurrent_requests.max(1),
        allow_other: args.allow_other,
        allow_root: args.allow_root,
        ownership: args.ownership(),
        fuse_threads: args.fuse_threads.max(1),
        prefetch_lookahead_steps: args.prefetch_lookahead,
        read_timeout: args.store.read_timeout,
        fetch_memory: args.max_fetch_memory,
        read_ahead: args.read_ahead,
        cache_read_around: args
            .cache_read_around
            .unwrap_or_else(|| default_read_around(cache_dir)),
        metadata_ttl: args.metadata_ttl,
        users,
        keys_in_order: source.lists_in_key_order(),
    }
}

/// Waits for a reason to stop: SIGINT, SIGTERM, or every process the mount lived for
/// gone (checked each 200 ms with the mount's end); `None` if the mount was unmounted
/// from outside.
fn wait_for_stop(
    mount: &Mount,
    users: &Users,
    mut interrupt: Signal,
    mut terminate: Signal,
) -> Option<&'static str> {
    mount.runtime().block_on(async {
        let mut interval = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = interrupt.recv() => return Some("SIGINT"),
                _ = terminate.recv() => return Some("SIGTERM"),
                _ = interval.tick() => {
                    if mount.has_ended() {
                        return None;
                    }
                    if users.all_gone() {
                        return Some("every process it lived for has gone");
                    }
                }
            }
        }
    })
}

/// SIGINT and SIGTERM held pending while alive: blocked in this thread, and in every
/// thread it starts meanwhile (the mount's runtime and FUSE threads inherit the mask,
/// and keep it, so these signals are taken by this thread alone). Unblocked on drop,
/// when a pending one is delivered to the handlers installed by then.
struct StopSignalsHeld(libc::sigset_t);

impl StopSignalsHeld {
    fn hold() -> StopSignalsHeld {
        // SAFETY: sigset_t is plain data that sigemptyset initialises; pthread_sigmask
        // only changes this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            StopSignalsHeld(set)
        }
    }
}

impl Drop for StopSignalsHeld {
    fn drop(&mut self) {
        // SAFETY: as in `hold`, with the set built there.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.0, std::ptr::null_mut()) };
    }
}

/// One cache directory per mountpoint, under the system's or the user's cache; never
/// in a directory shared with other users such as `/tmp`.
fn default_cache_dir(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let absolute = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_owned());
    let name: String = absolute
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let base = if rustix::process::geteuid().is_root() {
        PathBuf::from("/var/cache/scdlfs")
    } else {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .context("neither XDG_CACHE_HOME nor HOME is set: give the cache a private place with --cache-dir")?
            .join("scdlfs")
    };
    Ok(base.join(name))
}

/// Why a cache budget cannot be kept.
#[derive(Debug, thiserror::Error)]
enum CacheBudgetError {
    #[error("--cache-size {asked} is below two parts of --read-part-size {part}")]
    BelowTwoParts { asked: String, part: String },
    #[error(
        "--cache-size {asked} does not fit in the cache directory {dir}: its filesystem has \
         {usable} usable ({free} free, and {held} this cache holds already); give \
         --cache-size {usable} or less, or a --cache-dir on a filesystem with room"
    )]
    Exceeds {
        asked: String,
        dir: PathBuf,
        usable: String,
        free: String,
        held: String,
    },
    #[error(
        "the cache directory {dir} has {usable} usable, less than the default budget's \
         floor of {floor}; give a --cache-dir on a filesystem with room, or --cache-size \
         {usable} or less"
    )]
    BelowTheFloor {
        dir: PathBuf,
        usable: String,
        floor: String,
    },
    #[error("cannot tell the room in the cache directory {dir}: {source}")]
    Unknown {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// The cache's budget: `asked`, else half of what is free on the cache's filesystem
/// and at least [`MIN_DEFAULT_CACHE`]. Checked against that filesystem now: a budget it
/// cannot hold is found out only when the disk fills, and from then the cache is off
/// and every read goes to the store. The bytes the cache holds already (a cache a
/// restart adopts) count as usable.
fn cache_budget(
    asked: Option<u64>,
    cache_dir: &Path,
    part_size: u64,
) -> Result<u64, CacheBudgetError> {
    let unknown = |source| CacheBudgetError::Unknown {
        dir: cache_dir.to_owned(),
        source,
    };
    let stat = rustix::fs::statvfs(cache_dir).map_err(|error| unknown(error.into()))?;
    let free = stat.f_bavail * stat.f_frsize;
    let budget = asked.unwrap_or((free / 2).max(MIN_DEFAULT_CACHE));
    if budget < 2 * part_size {
        return Err(CacheBudgetError::BelowTwoParts {
            asked: format_size(budget),
            part: format_size(part_size),
        });
    }
    if budget <= free {
        return Ok(budget);
    }
    let held = allocated_bytes(cache_dir).map_err(unknown)?;
    let usable = free + held;
    if budget <= usable {
        return Ok(budget);
    }
    Err(match asked {
        Some(asked) => CacheBudgetError::Exceeds {
            asked: format_size(asked),
            dir: cache_dir.to_owned(),
            usable: format_size(usable),
            free: format_size(free),
            held: format_size(held),
        },
        None => CacheBudgetError::BelowTheFloor {
            dir: cache_dir.to_owned(),
            usable: format_size(usable),
            floor: format_size(MIN_DEFAULT_CACHE),
        },
    })
}

/// The disk space the files below `dir` take (their blocks, not their lengths).
fn allocated_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            allocated_bytes(&entry.path())?
        } else {
            meta.blocks() * 512
        };
    }
    Ok(total)
}

/// The read-ahead of the cache directory's disk; nothing past the kernel's own if it
/// cannot be read.
pub fn default_read_around(cache_dir: &Path) -> u64 {
    crate::fs::read_ahead::of_disk_holding(cache_dir).unwrap_or_else(|error| {
        tracing::info!(%error, cache_dir = %cache_dir.display(), "no read-ahead known for the cache's disk: no read-around");
        0
    })
}
