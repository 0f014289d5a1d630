//! The filesystem core: what the mount does, as typed operations with no FUSE in them.
//!
//! [`FsCore`] answers lookups, attribute queries, directory listings, opens, reads,
//! hint writes and closes with [`FsResult`]s; [`fuse`] is the thin adapter that turns
//! kernel requests into these calls and their results into replies (errno from
//! [`errno::errno`] only). Tests drive the core in-process, without a mount.
//!
//! The mount is read-only in effect but not in name: files open O_RDWR (the released
//! SCDL reader insists) and map shared and writable, while every write and every change
//! of the tree fails with EROFS. The one writable file is each dataset's hint file,
//! whose lines go to the prefetcher; read, it gives the daemon's announcement
//! ([`announce`]). Open handles live in one [`handles::HandleTable`].
//!
//! A read has one deadline as a whole, `--read-timeout` ([`FsCore::within_deadline`]):
//! however many requests it makes (a corrupt part fetched again), it answers within
//! it, with EIO past it. A lookup or a listing waits for the directory's listing as
//! long as that advances (the pages of a large dataset's discovery keep coming), and
//! fails with EIO once it brought nothing for `--read-timeout`; the listing itself ends
//! within [`crate::catalog::LISTING_DEADLINES`] deadlines, so no wait is unbounded
//! ([`Tree::listing`]).
//!
//! Operations that a user's identity changes take the uid of the FUSE request: the hint
//! handles a user may hold and the work their plans may cause are bounded per user
//! ([`crate::prefetch::budget`]), and the status shows a user only their own plans
//! unless they are root or the mounting user.

pub(crate) mod announce;
pub mod errno;
pub(crate) mod fuse;
pub(crate) mod handles;
pub mod page_cache;
mod page_filler;
pub(crate) mod planned_pages;
pub mod read_ahead;
pub mod read_around;

use std::ffi::OsStr;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{FileAttr, FileType, INodeNo};
use scdl_format::hint::HintDecoder;

use crate::cache::DiskCache;
use crate::catalog::tree::{FileNode, Listing};
use crate::catalog::{Dataset, FileContent, Node, NodeKind, Tree};
use crate::error::{FsError, FsResult, HintRefused, PlanRefused};
use crate::metrics::Metrics;
use crate::prefetch::sequential::SequentialWindow;
use crate::prefetch::{Prefetcher, Viewer};
use crate::read::ReadPath;
use crate::status::{Observer, STATUS_XATTR};
use crate::users::{Users, USERS_XATTR};
use crate::view::plan_read;
use crate::warm::{Warmer, WARM_XATTR};
pub use fuse::ScdlFs;
use handles::{HandleState, HandleTable};
use read_around::ReadAround;

pub const BLOCK_SIZE: u32 = 128 * 1024;

/// An opened file: its handle id, and whether the kernel may cache its pages (data
/// files: immutable objects) or must send every read and write (hint files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub handle: u64,
    pub direct_io: bool,
}

/// An error whose answer waits: a refused hint write or open of a user refused often
/// lately ([`crate::prefetch::budget::refusal_delay`]). The FUSE adapter answers it
/// from a task after `answer_after`; in-process callers take the error at once.
#[derive(Debug)]
pub struct Late {
    pub error: FsError,
    pub answer_after: Duration,
}

impl From<FsError> for Late {
    fn from(error: FsError) -> Late {
        Late {
            error,
            answer_after: Duration::ZERO,
        }
    }
}

/// What a lookup found, and how long that holds: until the directory's listing is due
/// to be made again (`None`: for the mount's life).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub attr: FileAttr,
    pub valid_for: Option<Duration>,
}

/// One entry of a directory listing, with the offset that resumes after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub next_offset: u64,
    pub kind: FileType,
    pub name: String,
}

/// The cache's room, in blocks of [`BLOCK_SIZE`], as `statfs` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub blocks: u64,
    pub free_blocks: u64,
}

/// The core's components, each built once by `mount::assemble`, its one caller.
pub struct CoreComponents {
    /// What the mount shows, for [`SOURCE_XATTR`].
    pub shows: MountedSource,
    pub tree: Arc<Tree>,
    pub cache: Arc<DiskCache>,
    pub read_path: Arc<ReadPath>,
    pub read_around: Arc<ReadAround>,
    pub prefetcher: Arc<Prefetcher>,
    pub metrics: Arc<Metrics>,
    pub observer: Observer,
    pub warmer: Arc<Warmer>,
    pub users: Arc<Users>,
}

/// The root's attribute that says what the mount shows and for how long, as JSON:
/// `{"source": ..., "endpoint": ... or null, "daemon": PID, "lives_for_users": bool}`.
/// A process that wants a mount of a source (the Python package) finds by it a node's
/// own mount, one that lives until it is stopped (a service's, the CLI's), and uses it
/// instead of starting another. Source and endpoint as the mount table and the cache's
/// source record show them: credentials redacted.
pub const SOURCE_XATTR: &str = "user.scdlfs.source";

/// Which store and prefix a mount shows.
#[derive(Clone, Debug)]
pub struct MountedSource {
    pub source: String,
    pub endpoint: Option<String>,
}

pub struct FsCore {
    components: CoreComponents,
    handles: HandleTable,
    ownership: Ownership,
    /// The longest a read waits ([`FsCore::within_deadline`]), and the longest a
    /// listing may bring nothing before its waiters give up ([`Tree::listing`]).
    deadline: Duration,
    /// The daemon's own user, who sees every plan in the status as root does.
    mounting_uid: u32,
    announcements: announce::Announcements,
}

/// Who owns the mount's files and what their modes allow. The kernel enforces the
/// modes (`default_permissions`) once other users are let in with `--allow-other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    pub uid: u32,
    pub gid: u32,
    /// Mode of the files. The released SCDL reader opens its files O_RDWR, so users
    /// who run it need the write bits too; they grant nothing, every write is EROFS.
    pub file_mode: u16,
    pub dir_mode: u16,
}

impl Ownership {
    /// The mounting user's, files 0644 and directories 0755.
    pub fn of_mounting_user() -> Ownership {
        Ownership {
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            file_mode: 0o644,
            dir_mode: 0o755,
        }
    }

    /// The hint file steers the plan of whoever reads the dataset: it is writable by
    /// exactly the classes (owner, group, others) that may read the files.
    pub fn hint_file_mode(&self) -> u16 {
        let readers = self.file_mode & 0o444;
        readers | (readers >> 1)
    }
}

impl FsCore {
    pub fn new(components: CoreComponents, ownership: Ownership, deadline: Duration) -> FsCore {
        FsCore {
            components,
            handles: HandleTable::default(),
            ownership,
            deadline,
            mounting_uid: rustix::process::getuid().as_raw(),
            announcements: announce::Announcements::default(),
        }
    }

    /// `operation` (on `what`, named only if it times out), bounded as a whole by the
    /// mount's deadline: past it, what the operation waited for is dropped and it
    /// fails with [`FsError::TimedOut`]. An operation ready at once (a read from the
    /// disk cache) sets no timer.
    async fn within_deadline<T>(
        &self,
        what: impl FnOnce() -> String,
        operation: impl Future<Output = FsResult<T>>,
    ) -> FsResult<T> {
        tokio::time::timeout(self.deadline, operation)
            .await
            .unwrap_or_else(|_| {
                Err(FsError::TimedOut {
                    key: what(),
                    after: self.deadline,
                })
            })
    }

    /// The entry `name` of directory `parent`, once its listing is made: waited for
    /// while the listing advances ([`Tree::listing`]).
    pub async fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        let listing = self.components.tree.listing(parent, self.deadline).await?;
        let name = name.to_str().ok_or(FsError::NotFound)?;
        let ino = listing.get(name).ok_or(FsError::NotFound)?;
        Ok(Entry {
            attr: self.getattr(ino)?,
            valid_for: listing.valid_for(),
        })
    }

    /// The read-around from the disk cache, to connect to the kernel's page cache.
    pub fn read_around(&self) -> &Arc<ReadAround> {
        &self.components.read_around
    }

    pub fn getattr(&self, ino: u64) -> FsResult<FileAttr> {
        Ok(self.attr(&*self.components.tree.node(ino)?))
    }

    /// Attribute changes: only truncating a hint file to its size, 0, succeeds (opening
    /// it with O_TRUNC does that); everything else is refused.
    pub fn setattr(&self, ino: u64, size: Option<u64>, more_than_size: bool) -> FsResult<FileAttr> {
        let node = self.components.tree.node(ino)?;
        let is_hints =
            matches!(&node.kind, NodeKind::File(f) if matches!(f.content, FileContent::Hints(..)));
        if is_hints && !more_than_size && size.unwrap_or(0) == 0 {
            Ok(self.attr(&node))
        } else {
            Err(FsError::ReadOnly)
        }
    }

    /// The mount's prefetcher, for the tests.
    #[cfg(any(test, feature = "test-support"))]
    pub fn prefetcher(&self) -> &Arc<Prefetcher> {
        &self.components.prefetcher
    }

    /// Opens a file as the mounting user (in-process callers, which have no request).
    pub fn open(&self, ino: u64) -> FsResult<Opened> {
        self.open_as(ino, self.mounting_uid)
    }

    /// Opens a file for user `uid`; a hint handle counts against the hint handles one
    /// user may hold (EBUSY beyond them).
    pub fn open_as(&self, ino: u64, uid: u32) -> FsResult<Opened> {
        self.open_answered(ino, uid).map_err(|late| late.error)
    }

    /// [`FsCore::open_as`], with how long a refused hint open's answer waits.
    pub fn open_answered(&self, ino: u64, uid: u32) -> Result<Opened, Late> {
        let node = self.components.tree.node(ino)?;
        Ok(match &file_of(&node)?.content {
            FileContent::Hints(dataset, _) => {
                if let Err(refused) = self
                    .components
                    .prefetcher
                    .budget()
                    .open_handle(uid, Instant::now())
                {
                    let what = "hint open refused with EBUSY: the user holds the most hint handles one user may";
                    let answer_after = self.log_refusal(uid, dataset, &refused, what);
                    return Err(Late {
                        error: refused.into(),
                        answer_after,
                    });
                }
                Opened {
                    handle: self.handles.open(HandleState::Hints {
                        decoder: HintDecoder::default(),
                        dataset: dataset.clone(),
                        uid,
                        announced: None,
                    }),
                    direct_io: true,
                }
            }
            _ => {
                self.components.read_around.planned().opened(ino, &node);
                Opened {
                    handle: self.handles.open(HandleState::Data {
                        window: SequentialWindow::default(),
                        uid,
                    }),
                    direct_io: false,
                }
            }
        })
    }

    /// Reads `size` bytes at `offset`. Everything before the first wait runs in the
    /// caller's thread, so a read the disk cache can serve completes on first poll.
    pub async fn read(&self, ino: u64, handle: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let what = || format!("read of {size} bytes at {offset} of inode {ino}");
        self.within_deadline(what, self.read_unbounded(ino, handle, offset, size))
            .await
    }

    async fn read_unbounded(
        &self,
        ino: u64,
        handle: u64,
        offset: u64,
        size: u32,
    ) -> FsResult<Vec<u8>> {
        let node = self.components.tree.node(ino)?;
        let file = file_of(&node)?;
        // Hint files are read past the page cache (direct I/O): nothing to read around.
        if let FileContent::Hints(dataset, _) = &file.content {
            return Ok(self.read_announcement(handle, dataset, offset, size));
        }
        let plan = plan_read(&file.content, file.size, offset, size as u64);
        let asked = offset.min(file.size)..offset.saturating_add(size as u64).min(file.size);
        self.components
            .read_around
            .note_asked(ino, file.size, &asked);
        let jumped = {
            let state = self.handles.get(handle);
            let mut state = state.as_ref().map(|s| s.lock());
            // A read without an open handle is taken as the mounting user's.
            let (mut window, reader) = match state.as_deref_mut() {
                Some(HandleState::Data { window, uid }) => (Some(window), *uid),
                _ => (None, self.mounting_uid),
            };
            self.components.prefetcher.observe_read(
                window.as_deref_mut(),
                reader,
                &file.content,
                file.size,
                offset..offset + size as u64,
                &plan,
            );
            window.is_some_and(|w| w.last_read_jumped())
        };
        let result = match self.components.read_path.read_cached(&plan) {
            Some(result) => {
                if let Ok(bytes) = &result {
                    let read = offset..offset + bytes.len() as u64;
                    self.components.read_around.offer(ino, &node, read);
                }
                result
            }
            None => {
                if jumped {
                    self.components
                        .prefetcher
                        .fetch_companion(&file.content, offset, size as u64);
                }
                self.components.read_path.read(plan).await
            }
        };
        match &result {
            Ok(bytes) => {
                self.components
                    .prefetcher
                    .observe_served(&file.content, offset, bytes);
                Metrics::add(&self.components.metrics.reads, 1);
                Metrics::add(&self.components.metrics.bytes_read, bytes.len() as u64);
            }
            Err(_) => Metrics::add(&self.components.metrics.read_errors, 1),
        }
        result
    }

    /// Bytes of the announcement a hint handle reads: the one made at its first read
    /// (see [`announce`]). A hint file's reads bypass the page cache, so the kernel
    /// asks past the size the file shows, which is that of an empty cache.
    fn read_announcement(&self, handle: u64, dataset: &Dataset, offset: u64, size: u32) -> Vec<u8> {
        let make = || {
            let cache = &self.components.cache;
            self.announcements.get(dataset, cache.generation(), || {
                Metrics::add(&self.components.metrics.announcements_made, 1);
                announce::announce(dataset, cache, self.components.read_path.part_size())
            })
        };
        let announced = match self.handles.get(handle) {
            Some(state) => match &mut *state.lock() {
                HandleState::Hints { announced, .. } => announced.get_or_insert_with(make).clone(),
                HandleState::Data { .. } => make(),
            },
            None => make(),
        };
        let start = (offset as usize).min(announced.len());
        let end = start.saturating_add(size as usize).min(announced.len());
        Metrics::add(&self.components.metrics.reads, 1);
        Metrics::add(&self.components.metrics.bytes_read, (end - start) as u64);
        announced[start..end].to_vec()
    }

    /// Applies one write to a hint handle. A refused write changes nothing: neither the
    /// handle's decoder nor its plan. Handles of other files are read-only.
    pub fn write(&self, handle: u64, data: &[u8]) -> FsResult<u32> {
        self.write_answered(handle, data).map_err(|late| late.error)
    }

    /// [`FsCore::write`], with how long a refused hint write's answer waits.
    pub fn write_answered(&self, handle: u64, data: &[u8]) -> Result<u32, Late> {
        let state = self.handles.get(handle).ok_or(FsError::ReadOnly)?;
        let mut state = state.lock();
        let HandleState::Hints {
            decoder,
            dataset,
            uid,
            ..
        } = &mut *state
        else {
            return Err(FsError::ReadOnly.into());
        };
        let mut trial = decoder.clone();
        let applied = trial
            .feed(data)
            .map_err(HintRefused::from)
            .and_then(|lines| {
                self.components
                    .prefetcher
                    .apply(handle, *uid, dataset, &lines)
                    .map_err(HintRefused::from)
            });
        if let Err(reason) = applied {
            return Err(self.refuse_hint(*uid, dataset, reason));
        }
        *decoder = trial;
        Metrics::add(&self.components.metrics.hint_writes, 1);
        Ok(data.len() as u32)
    }

    /// Closes a handle; a hint handle's plan goes with it.
    pub fn release(&self, handle: u64) {
        if let Some(state) = self.handles.close(handle) {
            if let HandleState::Hints { uid, .. } = &*state.lock() {
                self.components.prefetcher.drop_plan(handle);
                self.components.prefetcher.budget().close_handle(*uid);
            }
        }
    }

    /// A directory's listing, waited for while it advances ([`Tree::listing`]);
    /// [`FsCore::dir_entries`] walks it.
    pub async fn readdir(&self, ino: u64) -> FsResult<Arc<Listing>> {
        self.components.tree.listing(ino, self.deadline).await
    }

    /// The entries of a listing from `offset` on, `.` and `..` first.
    pub fn dir_entries<'a>(
        &'a self,
        ino: u64,
        offset: u64,
        listing: &'a Listing,
    ) -> impl Iterator<Item = DirEntry> + 'a {
        let parent = self
            .components
            .tree
            .node(ino)
            .map(|n| n.parent)
            .unwrap_or(ino);
        let dots = [(".".to_owned(), ino), ("..".to_owned(), parent)];
        dots.into_iter()
            .chain(listing.entries.iter().cloned())
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (name, child))| DirEntry {
                ino: child,
                next_offset: i as u64 + 1,
                kind: match self
                    .components
                    .tree
                    .node(child)
                    .map(|n| matches!(n.kind, NodeKind::Dir(_)))
                {
                    Ok(true) => FileType::Directory,
                    _ => FileType::RegularFile,
                },
                name,
            })
    }

    pub fn statfs(&self) -> Capacity {
        let stats = self.components.cache.stats();
        let block = BLOCK_SIZE as u64;
        Capacity {
            blocks: stats.budget_bytes / block,
            free_blocks: stats.budget_bytes.saturating_sub(stats.cached_bytes) / block,
        }
    }

    /// The root carries the mount's status as JSON (as user `uid` may see it: their
    /// own plans, or all for root and the mounting user), its users
    /// ([`crate::users`]) and what it shows ([`SOURCE_XATTR`]), a dataset directory the progress of its warm job
    /// ([`crate::warm`]); nothing else has attributes.
    pub async fn getxattr(&self, ino: u64, name: &OsStr, uid: u32) -> FsResult<Vec<u8>> {
        if ino == INodeNo::ROOT.0 && name == USERS_XATTR {
            return Ok(self.components.users.describe());
        }
        if ino == INodeNo::ROOT.0 && name == SOURCE_XATTR {
            let shows = &self.components.shows;
            let note = serde_json::json!({
                "source": shows.source,
                "endpoint": shows.endpoint,
                "daemon": std::process::id(),
                "lives_for_users": self.components.users.takes_users(),
            });
            return Ok(serde_json::to_vec(&note).expect("strings, a number and a flag serialize"));
        }
        if ino == INodeNo::ROOT.0 && name == STATUS_XATTR {
            let viewer = if uid == 0 || uid == self.mounting_uid {
                Viewer::All
            } else {
                Viewer::User(uid)
            };
            let status = self.components.observer.status_seen_by(viewer);
            return Ok(serde_json::to_vec(&status).expect("status serializes"));
        }
        if name == WARM_XATTR {
            let dataset = self.dataset_of_dir(ino).await?;
            return self.components.warmer.progress(&dataset);
        }
        Err(FsError::NoSuchAttribute)
    }

    /// Writing a dataset directory's warm attribute starts or stops its warm job, the
    /// root's users attribute attaches or lets go a process; no other attribute can be
    /// set.
    pub async fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8]) -> FsResult<()> {
        if ino == INodeNo::ROOT.0 && name == USERS_XATTR {
            return self.components.users.request(value);
        }
        if name != WARM_XATTR {
            return Err(FsError::ReadOnly);
        }
        let dataset = self.dataset_of_dir(ino).await?;
        self.components.warmer.request(&dataset, value)
    }

    /// The dataset a directory holds, found as the content of its hint file (the
    /// directory's listing waited for while it advances).
    async fn dataset_of_dir(&self, ino: u64) -> FsResult<Dataset> {
        let listing = self.components.tree.listing(ino, self.deadline).await?;
        let hints = listing
            .get(scdl_format::hint::HINT_FILE)
            .ok_or(FsError::NoSuchAttribute)?;
        match &file_of(&*self.components.tree.node(hints)?)?.content {
            FileContent::Hints(dataset, _) => Ok(dataset.clone()),
            _ => Err(FsError::NoSuchAttribute),
        }
    }

    /// Extended attribute names, each NUL-terminated.
    pub fn listxattr(&self, ino: u64) -> Vec<u8> {
        if ino == INodeNo::ROOT.0 {
            format!("{STATUS_XATTR}\0{USERS_XATTR}\0{SOURCE_XATTR}\0").into_bytes()
        } else {
            Vec::new()
        }
    }

    fn attr(&self, node: &Node) -> FileAttr {
        let (kind, size, mtime, perm, nlink) = match &node.kind {
            NodeKind::Dir(_) => (
                FileType::Directory,
                0,
                self.components.tree.mount_time(),
                self.ownership.dir_mode,
                2,
            ),
            NodeKind::File(file) => {
                let perm = match file.content {
                    FileContent::Hints(..) => self.ownership.hint_file_mode(),
                    _ => self.ownership.file_mode,
                };
                (FileType::RegularFile, file.size, file.mtime, perm, 1)
            }
        };
        FileAttr {
            ino: INodeNo(node.ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: self.ownership.uid,
            gid: self.ownership.gid,
            rdev: 0,
            blksize: BLOCK_SIZE,
            flags: 0,
        }
    }
}

fn file_of(node: &Node) -> FsResult<&FileNode> {
    match &node.kind {
        NodeKind::File(file) => Ok(file),
        NodeKind::Dir(_) => Err(FsError::IsADirectory),
    }
}

impl FsCore {
    /// Counts a refused hint write of user `uid`'s, logs it (rate-limited per user),
    /// and gives the error the writer gets, answered as late as the user's refusals
    /// call for.
    fn refuse_hint(&self, uid: u32, dataset: &Dataset, reason: HintRefused) -> Late {
        let what = match reason {
            HintRefused::Plan(PlanRefused::StartsTooFast { .. }) => {
                "hint write refused with EAGAIN: the user started plans faster than one user may"
            }
            _ => "hint write refused with EINVAL",
        };
        let answer_after = self.log_refusal(uid, dataset, &reason, what);
        Late {
            error: FsError::InvalidHint(reason),
            answer_after,
        }
    }

    /// Counts and logs a refusal; how long its answer waits.
    fn log_refusal(
        &self,
        uid: u32,
        dataset: &Dataset,
        reason: &dyn std::fmt::Display,
        what: &'static str,
    ) -> Duration {
        let reason = reason.to_string();
        let budget = self.components.prefetcher.budget();
        let noted = budget.note_refusal(uid, &reason, Instant::now());
        if let Some(unlogged) = noted.log {
            tracing::warn!(
                dataset = %dataset.prefix(),
                uid,
                %reason,
                unlogged_since_last = unlogged,
                "{what}"
            );
        }
        if !noted.answer_after.is_zero() {
            Metrics::add(&self.components.metrics.hint_refusals_answered_late, 1);
        }
        noted.answer_after
    }
}
