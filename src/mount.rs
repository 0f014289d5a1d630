//! Assembling and running one mount: store → cache → fetcher → read path → prefetcher
//! → FUSE session, on a runtime of its own, plus the checks that make mounting fail
//! early and clearly (unreachable store, missing bucket, bad or stale mountpoint).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use object_store::path::Path as ObjectPath;
use object_store::{GetResult, ListResult, ObjectStore};
use scdl_format::ArrayKind;

use crate::cache::{CacheOwner, DiskCache};
use crate::catalog::{DirMode, ListingTimes, ObjectRegistry, Tree, LISTING_DEADLINES};
use crate::fetch::{listed_object, FetchLimits, Fetcher};
use crate::fs::fuse::KernelPageCache;
use crate::fs::read_around::ReadAround;
use crate::fs::{read_ahead, CoreComponents, FsCore, MountedSource, Ownership, ScdlFs};
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::planner_wake::PlannerWake;
use crate::prefetch::{PrefetchConfig, Prefetcher};
use crate::read::ReadPath;
use crate::row_offset_check::RowOffsetCheck;
use crate::status::{Observer, Status};
use crate::store::wrapper::{GetRequest, HookedStore, StoreHook};
use crate::users::Users;
use crate::warm::Warmer;

/// The read-ahead the kernel gives a FUSE mount unless told otherwise.
const KERNEL_DEFAULT_READ_AHEAD: u64 = 128 << 10;

/// Everything that shapes a mount besides its store.
#[derive(Clone, Debug)]
pub struct MountSettings {
    /// Shown in the mount table.
    pub fs_name: String,
    /// The store's custom endpoint (`--endpoint-url`), credentials redacted: the cache
    /// directory records it with the source, so that it serves one store.
    pub endpoint: Option<String>,
    pub view: DirMode,
    pub cache_dir: PathBuf,
    /// Wipe a cache directory of another source or scdlfs version instead of refusing it.
    pub cache_reset: bool,
    pub cache_bytes: u64,
    pub max_cached_chunks: Option<usize>,
    pub part_size: u64,
    pub max_concurrent_requests: usize,
    /// Let other users in; the kernel then checks [`MountSettings::ownership`].
    pub allow_other: bool,
    /// Let root in besides the mounting user (without `allow_other`).
    pub allow_root: bool,
    pub ownership: Ownership,
    pub fuse_threads: usize,
    pub prefetch_lookahead_steps: usize,
    /// Every FUSE operation (a read, a lookup, a listing) is answered within this
    /// bound, with EIO past it ([`crate::store::NetworkBounds`], [`FsCore`]'s deadline);
    /// the root's listing before the mount appears fails the mount past it.
    pub read_timeout: Duration,
    /// The most bytes the fetcher holds at once ([`crate::fetch::memory`]).
    pub fetch_memory: u64,
    /// The kernel's read-ahead for the mount ([`crate::fs::read_ahead`]); `None` leaves
    /// the kernel's default.
    pub read_ahead: Option<u64>,
    /// The window a read served from the disk cache brings into the page cache
    /// ([`crate::fs::read_around`]); 0: off.
    pub cache_read_around: u64,
    /// How long a directory listing stands before the store is listed again
    /// ([`crate::catalog::tree`]); `None`: for the mount's life.
    pub metadata_ttl: Option<Duration>,
    /// The processes the mount lives for ([`crate::users`]), attached and left through
    /// the root's attribute.
    pub users: Arc<Users>,
    /// Whether the store lists keys in key order, a page at a time (S3, GCS,
    /// [`crate::store::Source::lists_in_key_order`]): a chunked dataset's objects are
    /// then listed in key ranges at once.
    pub keys_in_order: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mountpoint {0} does not exist")]
    MissingMountpoint(PathBuf),
    #[error("mountpoint {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("a previous mount at {0} is dead (its daemon was killed); clean it up with `scdlfs unmount {0}`")]
    StaleMount(PathBuf),
    #[error("{0} is already a mount point; unmount it first")]
    AlreadyMounted(PathBuf),
    #[error("cannot list {location}: {reason}")]
    StoreUnreachable { location: String, reason: String },
    #[error("cache: {0}")]
    Cache(io::Error),
    #[error(transparent)]
    UntrustedCacheDir(#[from] crate::cache_dir_check::UntrustedCacheDir),
    #[error("FUSE mount failed: {0}")]
    Fuse(io::Error),
    /// fuser, and fusermount3 after it (which opens the device with the user's own
    /// rights), could only fail with EACCES.
    #[error(
        "{DEV_FUSE} (mode {mode:04o}, owner uid {owner}) cannot be opened by this user (uid \
         {uid}): FUSE mounts by users other than root need it readable and writable by \
         them, as fuse3's udev rule makes it (mode 0666). Ask an administrator to run \
         `chmod 0666 {DEV_FUSE}` (in a container: pass the device with that mode), or \
         mount as root and share the mount with --allow-other"
    )]
    DevFuseDenied { mode: u32, owner: u32, uid: u32 },
    #[error("the mount did not answer within {0:?}")]
    NotReady(Duration),
}

/// The FUSE device, which a mount opens and serves.
const DEV_FUSE: &str = "/dev/fuse";

/// Fails with [`MountError::DevFuseDenied`] when this user may not open the FUSE
/// device: fuser would report a bare `Permission denied`.
fn check_dev_fuse_open_to_users() -> Result<(), MountError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEV_FUSE)
    {
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            let meta = std::fs::metadata(DEV_FUSE).map_err(MountError::Fuse)?;
            Err(MountError::DevFuseDenied {
                mode: meta.mode() & 0o7777,
                owner: meta.uid(),
                uid: rustix::process::geteuid().as_raw(),
            })
        }
        // A missing device, or any other failure, is fuser's to report.
        _ => Ok(()),
    }
}

/// A live mount. Dropping it unmounts.
pub struct Mount {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    observer: Observer,
    // Last: the runtime outlives the session that spawns onto it.
    runtime: tokio::runtime::Runtime,
}

/// Checks that `mountpoint` can take a mount: a directory, not a live or dead mount.
pub fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    let meta = match std::fs::metadata(mountpoint) {
        Ok(meta) => meta,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::StaleMount(mountpoint.to_owned()))
        }
        Err(_) => return Err(MountError::MissingMountpoint(mountpoint.to_owned())),
    };
    if !meta.is_dir() {
        return Err(MountError::NotADirectory(mountpoint.to_owned()));
    }
    let parent = mountpoint.parent().unwrap_or(Path::new("/"));
    if std::fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev()) {
        // The kernel answers stat from its attribute cache even when the daemon is
        // gone; listing the directory reaches the daemon.
        if std::fs::read_dir(mountpoint).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN)) {
            return Err(MountError::StaleMount(mountpoint.to_owned()));
        }
        return Err(MountError::AlreadyMounted(mountpoint.to_owned()));
    }
    Ok(())
}

/// Builds the filesystem core of `store` (under `prefix`): cache → fetcher → read path
/// → prefetcher → tree. Call it inside the runtime the mount will run on. The cache
/// directory is made if missing and refused if another user could have planted it or
/// could swap it away ([`crate::cache_dir_check`]).
pub fn assemble(
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    settings: &MountSettings,
    root_listing: Option<ListResult>,
) -> Result<(FsCore, Observer), MountError> {
    let metrics = Arc::new(Metrics::default());
    let cache = open_cache(settings, metrics.clone())?;
    let store: Arc<dyn ObjectStore> =
        Arc::new(HookedStore::new(store, TimeStoreGets(metrics.clone())));
    let registry = object_registry(&cache, settings, metrics.clone());
    // One bell for everything the prefetcher plans around: downloads ending, and
    // row-offset verdicts.
    let planner_wake = PlannerWake::default();
    let fetcher = Fetcher::new(
        store.clone(),
        cache.clone(),
        fetch_limits(settings),
        metrics.clone(),
        planner_wake.clone(),
    );
    let row_offset_check = RowOffsetCheck::new(fetcher.clone(), planner_wake.clone());
    let read_path = ReadPath::new(
        fetcher.clone(),
        cache.clone(),
        row_offset_check.clone(),
        metrics.clone(),
    );
    let prefetcher = Prefetcher::new(
        fetcher.clone(),
        cache.clone(),
        row_offset_check,
        planner_wake,
        metrics.clone(),
        prefetch_config(settings),
    );
    let tree = Arc::new(Tree::new(
        store,
        prefix,
        settings.view,
        registry,
        listing_times(settings),
        metrics.clone(),
        root_listing,
    ));
    let warmer = Warmer::new(fetcher.clone(), cache.clone());
    let observer = Observer::new(
        settings.fs_name.clone(),
        metrics.clone(),
        fetcher,
        cache.clone(),
        prefetcher.clone(),
    );
    let read_around = ReadAround::new(
        settings.cache_read_around,
        read_path.clone(),
        metrics.clone(),
    );
    prefetcher.connect_planned_pages(read_around.planned().clone());
    if read_around.reads_parts_ahead() {
        cache.leave_read_ahead_to_read_around();
    }
    let components = CoreComponents {
        shows: MountedSource {
            source: settings.fs_name.clone(),
            endpoint: settings.endpoint.clone(),
        },
        tree,
        cache,
        read_path,
        read_around,
        prefetcher,
        metrics,
        observer: observer.clone(),
        warmer,
        users: settings.users.clone(),
    };
    let core = FsCore::new(components, settings.ownership, settings.read_timeout);
    Ok((core, observer))
}

/// The disk cache of the mount, in its checked cache directory ([`crate::cache_dir_check`]),
/// counting into `metrics`; an earlier mount's part files are adopted in the background.
fn open_cache(
    settings: &MountSettings,
    metrics: Arc<Metrics>,
) -> Result<Arc<DiskCache>, MountError> {
    let cache_dir = crate::cache_dir_check::prepare(&settings.cache_dir)?;
    let owner = CacheOwner {
        source: settings.fs_name.clone(),
        endpoint: settings.endpoint.clone(),
        reset: settings.cache_reset,
    };
    let cache = Arc::new(
        DiskCache::open_counting_into(
            &cache_dir,
            &owner,
            settings.cache_bytes,
            settings.max_cached_chunks,
            metrics,
        )
        .map_err(MountError::Cache)?,
    );
    cache.adopt_in_background();
    Ok(cache)
}

/// The registry of the objects the catalog lists, which hands each to the cache to
/// adopt an earlier mount's parts of it.
fn object_registry(
    cache: &Arc<DiskCache>,
    settings: &MountSettings,
    metrics: Arc<Metrics>,
) -> ObjectRegistry {
    let (cache, part_size) = (cache.clone(), settings.part_size);
    let adopt_parts =
        Box::new(move |object: &ObjectInfo| cache.object_listed(listed_object(object), part_size));
    ObjectRegistry::new(adopt_parts, settings.metadata_ttl.is_some(), metrics)
}

fn fetch_limits(settings: &MountSettings) -> FetchLimits {
    FetchLimits {
        part_size: settings.part_size,
        max_concurrent_requests: settings.max_concurrent_requests,
        read_timeout: settings.read_timeout,
        memory_cap: settings.fetch_memory,
    }
}

fn prefetch_config(settings: &MountSettings) -> PrefetchConfig {
    PrefetchConfig {
        lookahead_steps: settings.prefetch_lookahead_steps,
        max_ahead_bytes: settings.cache_bytes / 2,
        max_sequential_window: 8 * settings.part_size,
        kernel_read_ahead: settings.read_ahead.unwrap_or(KERNEL_DEFAULT_READ_AHEAD),
        cache_bytes: settings.cache_bytes,
        shared_by_users: settings.allow_other || settings.allow_root,
    }
}

fn listing_times(settings: &MountSettings) -> ListingTimes {
    ListingTimes {
        metadata_ttl: settings.metadata_ttl,
        listing_timeout: settings.read_timeout * LISTING_DEADLINES,
        keys_in_order: settings.keys_in_order,
    }
}

/// Times every GET of the mount (the catalog's header reads and the fetcher's
/// downloads alike) into [`Metrics::store_get_seconds`]: the time until the store
/// answered, failures included, since a slow refusal is latency a reader waits too.
/// A GET given up before its answer (a read's deadline, a race its reader's other
/// request won) has no latency to count and is left out. It also counts the bytes of
/// row offsets the answers bring ([`Metrics::row_offset_bytes_fetched`]): every GET of
/// a `row_ptr.npy` passes here, whichever part of the daemon sent it.
struct TimeStoreGets(Arc<Metrics>);

impl std::fmt::Debug for TimeStoreGets {
    // The store's name in messages, not every figure of the mount.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Timed")
    }
}

#[async_trait]
impl StoreHook for TimeStoreGets {
    async fn get(&self, request: GetRequest<'_>) -> object_store::Result<GetResult> {
        // A HEAD (a GET of no body, as object_store asks it) brings no bytes.
        let row_offsets = !request.options.head
            && request.location.filename() == Some(ArrayKind::RowPtr.file_name());
        let started = Instant::now();
        let answer = request.send().await;
        self.0.store_get_seconds.record(started.elapsed());
        if let (true, Ok(answer)) = (row_offsets, &answer) {
            let bytes = answer.range.end - answer.range.start;
            Metrics::add(&self.0.row_offset_bytes_fetched, bytes);
        }
        answer
    }
}

impl Mount {
    /// Mounts `store` (under `prefix`) at `mountpoint` and returns once the mount
    /// answers.
    pub fn start(
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        mountpoint: &Path,
        settings: &MountSettings,
    ) -> Result<Mount, MountError> {
        check_mountpoint(mountpoint)?;
        let mountpoint = mountpoint.canonicalize().map_err(MountError::Fuse)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("scdlfs-io")
            .build()
            .map_err(MountError::Fuse)?;
        // Fail now, with the store's own words, rather than on the first `ls`; the
        // listing is then the root's first, so a reader's first lookup costs no round trip.
        // Bounded as any listing is, by `LISTING_DEADLINES` deadlines (not one: a root
        // slow to list but finite mounts, as a later `ls` of it would succeed): a store
        // that pages it without end or stalls would otherwise hang the mount before
        // there is a mount to unmount.
        let unreachable = |reason| MountError::StoreUnreachable {
            location: settings.fs_name.clone(),
            reason,
        };
        let root_listing = runtime
            .block_on(async {
                // The timer is made inside the runtime, whose clock drives it.
                tokio::time::timeout(
                    settings.read_timeout * LISTING_DEADLINES,
                    store.list_with_delimiter((!prefix.as_ref().is_empty()).then_some(&prefix)),
                )
                .await
            })
            .map_err(|_| {
                unreachable(format!(
                    "the listing did not end within {LISTING_DEADLINES} x --read-timeout {}",
                    humantime::format_duration(settings.read_timeout)
                ))
            })?
            .map_err(|error| unreachable(explain_store_error(&error)))?;
        let _entered = runtime.enter();
        let (core, observer) = assemble(store, prefix, settings, Some(root_listing))?;
        let core = Arc::new(core);
        let fs = ScdlFs::new(core.clone(), runtime.handle().clone());
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(settings.fs_name.clone()),
            MountOption::Subtype("scdlfs".into()),
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::NoAtime,
            // The kernel checks the modes and owners the files show, so they mean what
            // they say to the other users --allow-other lets in.
            MountOption::DefaultPermissions,
        ];
        if settings.allow_other {
            config.acl = SessionACL::All;
        } else if settings.allow_root {
            config.acl = SessionACL::RootAndOwner;
        }
        config.n_threads = Some(settings.fuse_threads.max(1));
        config.clone_fd = settings.fuse_threads > 1;
        if !rustix::process::geteuid().is_root() {
            check_dev_fuse_open_to_users()?;
        }
        let session = fuser::spawn_mount(fs, &mountpoint, &config).map_err(MountError::Fuse)?;
        core.read_around()
            .connect(Arc::new(KernelPageCache::new(session.notifier())));
        drop(_entered);
        let mount = Mount {
            session: Some(session),
            mountpoint,
            observer,
            runtime,
        };
        mount.wait_until_answering(Duration::from_secs(30))?;
        if let Some(bytes) = settings.read_ahead {
            // Before any file is opened: each open takes the value then in force.
            if let Err(error) = read_ahead::set(&mount.mountpoint, bytes) {
                tracing::warn!(%error, wanted = bytes, "cannot set the kernel's read-ahead for the mount; it stays at the default, and prefetch margins are larger than needed");
            }
        }
        Ok(mount)
    }

    /// Waits until the kernel routes the mountpoint to us and the root lists.
    fn wait_until_answering(&self, limit: Duration) -> Result<(), MountError> {
        let started = Instant::now();
        let parent_dev = std::fs::metadata(self.mountpoint.parent().unwrap_or(Path::new("/")))
            .map(|m| m.dev())
            .ok();
        while started.elapsed() < limit {
            let mounted =
                std::fs::metadata(&self.mountpoint).is_ok_and(|m| Some(m.dev()) != parent_dev);
            if mounted && std::fs::read_dir(&self.mountpoint).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(MountError::NotReady(limit))
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    pub fn status(&self) -> Status {
        self.observer.status()
    }

    /// Whether the session ended by itself (an external `umount`).
    pub fn has_ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// The runtime the mount's tasks run on, for callers that add their own.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }

    /// Unmounts (detaching lazily if files are still open) and waits for the session.
    pub fn unmount(mut self) -> io::Result<()> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if session.guard.is_finished() {
            return session.join();
        }
        if let Err(error) = crate::unmount::unmount(&self.mountpoint, false) {
            tracing::warn!(%error, "unmount failed; detaching lazily");
            crate::unmount::unmount(&self.mountpoint, true)?;
            // A detached mount's session ends when its last user lets go, with the
            // kernel aborting the connection: that is its end, not a failure (taken for
            // one, it kept the Python package's scratch directory after a Ctrl-C).
            return match session.join() {
                Err(error) if error.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
                ended => ended,
            };
        }
        session.join()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(error) = self.shut_down() {
            tracing::error!(mountpoint = %self.mountpoint.display(), %error, "unmount failed");
        }
    }
}

/// A store error for people: the missing bucket named as such, and the causes
/// (connection refused, DNS, TLS) that the error's own message leaves out. Every piece
/// is redacted: the errors name URLs with their credentials.
fn explain_store_error(error: &object_store::Error) -> String {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(crate::store::redact::redact(&cause.to_string()));
        source = cause.source();
    }
    let all = std::iter::once(crate::store::redact::redact(&error.to_string()))
        .chain(causes)
        .collect::<Vec<_>>();
    let text = all.join(": ");
    if text.contains("NoSuchBucket") {
        return "the bucket does not exist".into();
    }
    if text.contains("AccessDenied")
        || text.contains("InvalidAccessKeyId")
        || text.contains("SignatureDoesNotMatch")
    {
        return format!(
            "access denied; check the credentials ({})",
            all.last().unwrap()
        );
    }
    // The deepest cause says what happened; the first line says to what.
    let first_line = all[0].lines().next().unwrap_or_default();
    let what_happened = match all.last() {
        // A cause the first line already quotes (object_store's "Generic S3 error: ...")
        // would say it twice.
        Some(deepest)
            if all.len() > 1
                && !first_line.contains(deepest.lines().next().unwrap_or_default()) =>
        {
            format!(
                "{first_line} ({})",
                deepest.lines().next().unwrap_or_default()
            )
        }
        _ => first_line.to_owned(),
    };
    if text.contains("PROPFIND") {
        // object_store lists http(s):// sources with WebDAV; a static web server serves
        // the files but refuses (or misanswers) the listing.
        return format!(
            "the server does not list folders with WebDAV PROPFIND, which an http(s):// \
             source needs; serve the files with a WebDAV server (nginx with dav_ext, \
             Apache mod_dav, `rclone serve webdav`, WsgiDAV) or from an object store \
             [{what_happened}]"
        );
    }
    what_happened
}
