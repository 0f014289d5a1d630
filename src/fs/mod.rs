//! The FUSE glue: kernel requests in, replies out.
//!
//! Every callback either answers at once from memory or the disk cache, or moves its
//! reply into a task on the runtime and returns; no FUSE thread ever waits on the
//! network. The mount is read-only in effect but not in name: files open O_RDWR (the
//! released SCDL reader insists) and map shared and writable, while every write and
//! every change of the tree fails with EROFS. The one writable file is each dataset's
//! hint file, whose lines go to the prefetcher.

mod hints;

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;

use crate::catalog::tree::{FileNode, Listing};
use crate::catalog::{FileContent, Node, NodeKind, Tree};
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::prefetch::Prefetcher;
use crate::read::ReadPath;
use crate::status::{Observer, STATUS_XATTR};
use crate::view::plan_read;
use hints::HintHandles;

/// Objects are immutable for the life of a mount, so the kernel may keep what it learns.
const TTL: Duration = Duration::from_secs(3600);
const BLOCK_SIZE: u32 = 128 * 1024;

/// The filesystem handed to fuser; tasks hold clones of its core.
pub struct ScdlFs(Arc<FsCore>);

struct FsCore {
    tree: Arc<Tree>,
    read_path: Arc<ReadPath>,
    prefetcher: Arc<Prefetcher>,
    metrics: Arc<Metrics>,
    runtime: Handle,
    hints: HintHandles,
    observer: Observer,
    uid: u32,
    gid: u32,
}

impl ScdlFs {
    pub fn new(
        tree: Arc<Tree>,
        read_path: Arc<ReadPath>,
        prefetcher: Arc<Prefetcher>,
        metrics: Arc<Metrics>,
        runtime: Handle,
        observer: Observer,
    ) -> ScdlFs {
        ScdlFs(Arc::new(FsCore {
            hints: HintHandles::new(prefetcher.clone()),
            tree,
            read_path,
            prefetcher,
            metrics,
            runtime,
            observer,
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
        }))
    }
}

impl FsCore {
    fn attr(&self, node: &Node) -> FileAttr {
        let (kind, size, mtime, perm, nlink) = match &node.kind {
            NodeKind::Dir(_) => (FileType::Directory, 0, self.tree.mount_time(), 0o755, 2),
            NodeKind::File(file) => {
                let perm = match file.content {
                    FileContent::Hints(_) => 0o666,
                    _ => 0o644,
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
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK_SIZE,
            flags: 0,
        }
    }

    fn entry_of(&self, listing: &Listing, name: &OsStr) -> FsResult<FileAttr> {
        let name = name.to_str().ok_or(FsError::NotFound)?;
        let ino = listing.get(name).ok_or(FsError::NotFound)?;
        Ok(self.attr(&*self.tree.node(ino)?))
    }
}

fn file_of(node: &Node) -> FsResult<&FileNode> {
    match &node.kind {
        NodeKind::File(file) => Ok(file),
        NodeKind::Dir(_) => Err(FsError::IsADirectory),
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
        match self.0.tree.cached_listing(parent.0) {
            Err(error) => reply.error(error.errno()),
            Ok(Some(listing)) => match self.0.entry_of(&listing, name) {
                Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
                Err(error) => reply.error(error.errno()),
            },
            Ok(None) => {
                let core = self.0.clone();
                let name = name.to_owned();
                self.0.runtime.spawn(async move {
                    let result = async {
                        let listing = core.tree.listing(parent.0).await?;
                        core.entry_of(&listing, &name)
                    };
                    match result.await {
                        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
                        Err(error) => reply.error(log_error("lookup", error)),
                    }
                });
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.tree.node(ino.0) {
            Ok(node) => reply.attr(&TTL, &self.0.attr(&node)),
            Err(error) => reply.error(error.errno()),
        }
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
        let node = match self.0.tree.node(ino.0) {
            Ok(node) => node,
            Err(error) => return reply.error(error.errno()),
        };
        // Opening the hint file with O_TRUNC truncates it to its size, 0: a no-op.
        let is_hints =
            matches!(&node.kind, NodeKind::File(f) if matches!(f.content, FileContent::Hints(_)));
        let only_truncate =
            mode.is_none() && uid.is_none() && gid.is_none() && atime.is_none() && mtime.is_none();
        if is_hints && only_truncate && size.unwrap_or(0) == 0 {
            reply.attr(&TTL, &self.0.attr(&node));
        } else {
            reply.error(Errno::EROFS);
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let node = match self.0.tree.node(ino.0) {
            Ok(node) => node,
            Err(error) => return reply.error(error.errno()),
        };
        match file_of(&node) {
            Err(error) => reply.error(error.errno()),
            Ok(file) => match &file.content {
                FileContent::Hints(dataset) => {
                    let fh = self.0.hints.open(dataset.clone());
                    reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
                }
                // Immutable objects: the kernel may keep cached pages across opens.
                _ => reply.opened(
                    FileHandle(self.0.prefetcher.open_handle()),
                    FopenFlags::FOPEN_KEEP_CACHE,
                ),
            },
        }
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
        let node = match self.0.tree.node(ino.0) {
            Ok(node) => node,
            Err(error) => return reply.error(error.errno()),
        };
        let file = match file_of(&node) {
            Ok(file) => file,
            Err(error) => return reply.error(error.errno()),
        };
        let plan = plan_read(&file.content, file.size, offset, size as u64);
        self.0
            .prefetcher
            .observe_read(fh.0, &file.content, file.size, offset, size as u64, &plan);
        if let Some(result) = self.0.read_path.read_cached(&plan) {
            return self.0.reply_read(reply, result);
        }
        let core = self.0.clone();
        self.0.runtime.spawn(async move {
            let result = core.read_path.read(plan).await;
            core.reply_read(reply, result);
        });
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
        match self.0.hints.write(fh.0, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(error) => reply.error(error.errno()),
        }
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
        self.0.hints.close(fh.0);
        self.0.prefetcher.close_handle(fh.0);
        reply.ok();
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
        match self.0.tree.cached_listing(ino.0) {
            Err(error) => reply.error(error.errno()),
            Ok(Some(listing)) => self.0.answer_readdir(ino.0, offset, &listing, reply),
            Ok(None) => {
                let core = self.0.clone();
                self.0.runtime.spawn(async move {
                    match core.tree.listing(ino.0).await {
                        Ok(listing) => core.answer_readdir(ino.0, offset, &listing, reply),
                        Err(error) => reply.error(log_error("readdir", error)),
                    }
                });
            }
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let stats = self.0.read_path.fetcher().cache().stats();
        let block = BLOCK_SIZE as u64;
        let total = stats.budget_bytes / block;
        let free = stats.budget_bytes.saturating_sub(stats.cached_bytes) / block;
        reply.statfs(total, free, free, 0, 0, BLOCK_SIZE, 1024, BLOCK_SIZE);
    }

    fn getxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        if ino != INodeNo::ROOT || name != STATUS_XATTR {
            return reply.error(Errno::NO_XATTR);
        }
        let json = serde_json::to_vec(&self.0.observer.status()).expect("status serializes");
        if size == 0 {
            reply.size(json.len() as u32);
        } else if (size as usize) < json.len() {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&json);
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        let names = if ino == INodeNo::ROOT {
            format!("{STATUS_XATTR}\0").into_bytes()
        } else {
            Vec::new()
        };
        if size == 0 {
            reply.size(names.len() as u32);
        } else if (size as usize) < names.len() {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&names);
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
}

impl FsCore {
    fn answer_readdir(&self, ino: u64, offset: u64, listing: &Listing, mut reply: ReplyDirectory) {
        let parent = self.tree.node(ino).map(|n| n.parent).unwrap_or(ino);
        let dots = [(".".to_owned(), ino), ("..".to_owned(), parent)];
        for (i, (name, child)) in dots
            .iter()
            .chain(listing.entries.iter())
            .enumerate()
            .skip(offset as usize)
        {
            let kind = match self
                .tree
                .node(*child)
                .map(|n| matches!(n.kind, NodeKind::Dir(_)))
            {
                Ok(true) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            if reply.add(INodeNo(*child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn reply_read(&self, reply: ReplyData, result: FsResult<Vec<u8>>) {
        match result {
            Ok(bytes) => {
                Metrics::add(&self.metrics.reads, 1);
                Metrics::add(&self.metrics.bytes_read, bytes.len() as u64);
                reply.data(&bytes);
            }
            Err(error) => {
                Metrics::add(&self.metrics.read_errors, 1);
                reply.error(log_error("read", error));
            }
        }
    }
}

fn log_error(operation: &'static str, error: FsError) -> Errno {
    let errno = error.errno();
    if errno == Errno::EIO {
        tracing::error!(operation, %error, "failing with EIO");
    } else {
        tracing::debug!(operation, %error, "failing");
    }
    errno
}
