//! The FUSE adapter: kernel requests in, [`FsCore`] calls, replies out, and nothing else.
//!
//! Each callback polls its core operation once in the FUSE thread, inside the runtime:
//! what memory or the disk cache can answer is answered there, and an operation that
//! has to wait (a listing, a download) moves, reply and all, into a task. No FUSE
//! thread ever waits on the network. Errors become errno through [`errno`]
//! alone, logged here once.
//!
//! A refused hint write or open may be answered late ([`super::Late`]): its reply waits
//! in a task, so the FUSE thread that received it goes on at once, and nothing of the
//! handle is held meanwhile (the core has returned).
//!
//! A panic in an operation, in the FUSE thread or in its task, is caught here and
//! answered with EIO, logged as [`FsError::Panicked`]: a panic that left a FUSE thread
//! would end it, and on thread 0 the whole mount.

use std::ffi::OsStr;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use futures::FutureExt;
use tokio::runtime::Handle;

use super::errno::errno;
use super::page_cache::PageCache;
use super::{FsCore, Late, BLOCK_SIZE};
use crate::error::{FsError, FsResult};

/// A node never changes (a changed object is a new inode), so the kernel may keep the
/// attributes it learns; what a name stands for it keeps as long as the lookup says,
/// at most this long.
const TTL: Duration = Duration::from_secs(3600);

/// The mount's page cache in the kernel, filled through FUSE's store notification.
pub struct KernelPageCache(fuser::Notifier);

impl KernelPageCache {
    pub fn new(notifier: fuser::Notifier) -> KernelPageCache {
        KernelPageCache(notifier)
    }
}

impl PageCache for KernelPageCache {
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.0.store(INodeNo(ino), offset, bytes)
    }
}

/// The filesystem handed to fuser.
pub struct ScdlFs {
    core: Arc<FsCore>,
    runtime: Handle,
}

impl ScdlFs {
    pub fn new(core: Arc<FsCore>, runtime: Handle) -> ScdlFs {
        ScdlFs { core, runtime }
    }

    /// Runs `operation` until its first wait here, then in a task; `ok` answers a
    /// success, an error (a panic included) is answered with its errno.
    fn answer<R: Reply, T: Send + 'static>(
        &self,
        name: &'static str,
        reply: R,
        operation: impl Future<Output = FsResult<T>> + Send + 'static,
        ok: impl FnOnce(R, T) + Send + 'static,
    ) {
        let _entered = self.runtime.enter();
        let mut operation = Box::pin(AssertUnwindSafe(operation).catch_unwind());
        let mut context = Context::from_waker(futures::task::noop_waker_ref());
        match operation.as_mut().poll(&mut context) {
            Poll::Ready(result) => answer_with(name, reply, unwound(result), ok),
            // Spawning polls again with a real waker.
            Poll::Pending => {
                self.runtime
                    .spawn(async move { answer_with(name, reply, unwound(operation.await), ok) });
            }
        }
    }

    /// Answers like [`answer_now`], except that an error to be answered late is
    /// answered from a task once its time is up.
    fn answer_maybe_late<R: Reply, T>(
        &self,
        name: &'static str,
        reply: R,
        operation: impl FnOnce() -> Result<T, Late>,
        ok: impl FnOnce(R, T),
    ) {
        let result = catch_unwind(AssertUnwindSafe(operation))
            .unwrap_or_else(|panic| Err(FsError::of_panic(panic).into()));
        match result {
            Err(Late {
                error,
                answer_after,
            }) if !answer_after.is_zero() => {
                self.runtime.spawn(async move {
                    tokio::time::sleep(answer_after).await;
                    reply.fail(errno_of(name, error));
                });
            }
            result => answer_with(name, reply, result.map_err(|late| late.error), ok),
        }
    }
}

/// Answers with what `operation`, which never waits, returns (a panic is an error).
fn answer_now<R: Reply, T>(
    name: &'static str,
    reply: R,
    operation: impl FnOnce() -> FsResult<T>,
    ok: impl FnOnce(R, T),
) {
    let result = unwound(catch_unwind(AssertUnwindSafe(operation)));
    answer_with(name, reply, result, ok);
}

/// The operation's result, or the error its panic becomes.
fn unwound<T>(result: std::thread::Result<FsResult<T>>) -> FsResult<T> {
    result.unwrap_or_else(|panic| Err(FsError::of_panic(panic)))
}

fn answer_with<R: Reply, T>(
    name: &'static str,
    reply: R,
    result: FsResult<T>,
    ok: impl FnOnce(R, T),
) {
    match result {
        // A panic in `ok` drops the reply it took, which fuser then answers with EIO.
        Ok(value) => {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| ok(reply, value))) {
                errno_of(name, FsError::of_panic(panic));
            }
        }
        Err(error) => reply.fail(errno_of(name, error)),
    }
}

fn errno_of(operation: &'static str, error: FsError) -> Errno {
    let errno = errno(&error);
    if errno == Errno::EIO {
        tracing::error!(operation, %error, "failing with EIO");
    } else {
        tracing::debug!(operation, %error, "failing");
    }
    errno
}

/// The one thing every fuser reply can do.
trait Reply: Send + 'static {
    fn fail(self, errno: Errno);
}

macro_rules! replies {
    ($($reply:ty),*) => {
        $(impl Reply for $reply {
            fn fail(self, errno: Errno) {
                self.error(errno)
            }
        })*
    };
}

replies!(
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyDirectory,
    ReplyOpen,
    ReplyWrite,
    ReplyEmpty,
    ReplyXattr,
    ReplyStatfs
);

/// Requests that would change the tree: all refused with EROFS.
macro_rules! refuse_changes {
    ($($operation:ident($($arg:ident: $type:ty),*) -> $reply:ty;)*) => {
        $(fn $operation(&self, _req: &Request, $($arg: $type,)* reply: $reply) {
            reply.error(errno(&FsError::ReadOnly));
        })*
    };
}

/// Answers an extended-attribute request: its size when asked for 0 bytes, else the
/// bytes if they fit.
fn reply_xattr(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    if size == 0 {
        reply.size(bytes.len() as u32);
    } else if (size as usize) < bytes.len() {
        reply.fail(errno(&FsError::BufferTooSmall));
    } else {
        reply.data(bytes);
    }
}

impl Filesystem for ScdlFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let wanted = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS;
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (core, name) = (self.core.clone(), name.to_owned());
        let lookup = async move { core.lookup(parent.0, &name).await };
        self.answer("lookup", reply, lookup, |reply, entry| {
            let valid_for = entry.valid_for.map_or(TTL, |d| d.min(TTL));
            reply.entry(&valid_for, &entry.attr, Generation(0))
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let getattr = || self.core.getattr(ino.0);
        answer_now("getattr", reply, getattr, |reply, attr| {
            reply.attr(&TTL, &attr)
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let more_than_size =
            mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some();
        let setattr = || self.core.setattr(ino.0, size, more_than_size);
        answer_now("setattr", reply, setattr, |reply, attr| {
            reply.attr(&TTL, &attr)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let uid = req.uid();
        let open = || self.core.open_answered(ino.0, uid);
        self.answer_maybe_late("open", reply, open, |reply, opened| {
            // Hint files see every write; data files are immutable objects, so the
            // kernel may keep their pages across opens.
            let flags = if opened.direct_io {
                FopenFlags::FOPEN_DIRECT_IO
            } else {
                FopenFlags::FOPEN_KEEP_CACHE
            };
            reply.opened(FileHandle(opened.handle), flags)
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let core = self.core.clone();
        let read = async move { core.read(ino.0, fh.0, offset, size).await };
        self.answer("read", reply, read, |reply, bytes| reply.data(&bytes));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let write = || self.core.write_answered(fh.0, data);
        self.answer_maybe_late("write", reply, write, |reply, n| reply.written(n));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let release = || {
            self.core.release(fh.0);
            Ok(())
        };
        answer_now("release", reply, release, |reply, ()| reply.ok());
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let core = self.core.clone();
        let listing = async move { core.readdir(ino.0).await };
        let core = self.core.clone();
        self.answer("readdir", reply, listing, move |mut reply, listing| {
            for entry in core.dir_entries(ino.0, offset, &listing) {
                let ino = INodeNo(entry.ino);
                if reply.add(ino, entry.next_offset, entry.kind, &entry.name) {
                    break;
                }
            }
            reply.ok()
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let room = || Ok(self.core.statfs());
        answer_now("statfs", reply, room, |reply, room| {
            let (total, free) = (room.blocks, room.free_blocks);
            reply.statfs(total, free, free, 0, 0, BLOCK_SIZE, 1024, BLOCK_SIZE)
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (core, name, uid) = (self.core.clone(), name.to_owned(), req.uid());
        let getxattr = async move { core.getxattr(ino.0, &name, uid).await };
        self.answer("getxattr", reply, getxattr, move |reply, json| {
            reply_xattr(reply, size, &json)
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (core, name, value) = (self.core.clone(), name.to_owned(), value.to_vec());
        let setxattr = async move { core.setxattr(ino.0, &name, &value).await };
        self.answer("setxattr", reply, setxattr, |reply, ()| reply.ok());
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = || Ok(self.core.listxattr(ino.0));
        answer_now("listxattr", reply, names, |reply, names| {
            reply_xattr(reply, size, &names)
        });
    }

    /// Python's `open()` asks every file whether it is a terminal (TCGETS); no file
    /// here is a device, so every ioctl gets ENOTTY, quietly.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(errno(&FsError::NotATerminal));
    }

    refuse_changes! {
        mknod(_parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32, _rdev: u32) -> ReplyEntry;
        mkdir(_parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32) -> ReplyEntry;
        unlink(_parent: INodeNo, _name: &OsStr) -> ReplyEmpty;
        rmdir(_parent: INodeNo, _name: &OsStr) -> ReplyEmpty;
        symlink(_parent: INodeNo, _link_name: &OsStr, _target: &std::path::Path) -> ReplyEntry;
        rename(_parent: INodeNo, _name: &OsStr, _newparent: INodeNo, _newname: &OsStr, _flags: fuser::RenameFlags) -> ReplyEmpty;
        link(_ino: INodeNo, _newparent: INodeNo, _newname: &OsStr) -> ReplyEntry;
        create(_parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32, _flags: i32) -> ReplyCreate;
    }
}
