//! The one place where an [`FsError`] becomes an errno: the FUSE edge. Below it, every
//! layer speaks in [`FsError`]s and their data; a reader of this file sees the whole
//! mapping at once.

use fuser::Errno;

use crate::error::{FsError, HintRefused, PlanRefused};

/// The errno a FUSE reply carries for `error`.
pub fn errno(error: &FsError) -> Errno {
    match error {
        FsError::NotFound => Errno::ENOENT,
        FsError::NotADirectory => Errno::ENOTDIR,
        FsError::IsADirectory => Errno::EISDIR,
        FsError::ReadOnly => Errno::EROFS,
        FsError::NoSuchAttribute => Errno::NO_XATTR,
        FsError::BufferTooSmall => Errno::ERANGE,
        FsError::NotATerminal => Errno::ENOTTY,
        // A limit of the user's, not a fault of the lines or of the process's own
        // descriptors: the same write goes through a moment later, the same open once
        // the user closes a hint handle.
        FsError::InvalidHint(HintRefused::Plan(PlanRefused::StartsTooFast { .. })) => Errno::EAGAIN,
        FsError::TooManyHintHandles { .. } => Errno::EBUSY,
        FsError::InvalidHint(_) | FsError::InvalidRequest(_) => Errno::EINVAL,
        FsError::Busy(_) => Errno::EBUSY,
        FsError::Store { .. }
        | FsError::ObjectChanged { .. }
        | FsError::VersionUnconfirmed { .. }
        | FsError::ShortRead { .. }
        | FsError::ListingTooLong { .. }
        | FsError::TimedOut { .. }
        | FsError::CorruptData(_)
        | FsError::RowOffsets { .. }
        | FsError::CacheIo(_)
        | FsError::CacheCorrupt(_)
        | FsError::Panicked { .. } => Errno::EIO,
    }
}
