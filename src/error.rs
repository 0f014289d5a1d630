//! The filesystem's error type, and the one place where errors become errno values.
//!
//! Every failure a FUSE reply can carry is an [`FsError`]; the glue in [`crate::fs`]
//! turns it into an errno with [`FsError::errno`] and nowhere else, so a reader of
//! this file sees the whole mapping at once.

use std::sync::Arc;

use fuser::Errno;

/// Why an operation on the mount failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such entry")]
    NotFound,
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error("the mount is read-only")]
    ReadOnly,
    #[error("no such extended attribute")]
    NoSuchAttribute,
    #[error("the reply buffer is too small")]
    BufferTooSmall,
    #[error("not a terminal")]
    NotATerminal,
    #[error("invalid hint: {0}")]
    InvalidHint(#[from] HintRefused),
    /// A control request (an extended attribute written) that is not one.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("busy: {0}")]
    Busy(String),
    #[error("object store request for {key} failed: {message}")]
    Store { key: String, message: String },
    #[error("{key} changed in the store since it was listed (ETag {pinned} no longer matches); unmount and mount again to see the new version")]
    ObjectChanged { key: String, pinned: String },
    #[error("{key} returned {got} bytes for a range of {expected}: truncated or changed object")]
    ShortRead {
        key: String,
        expected: u64,
        got: u64,
    },
    #[error("{key}: no answer within {after:?}")]
    TimedOut {
        key: String,
        after: std::time::Duration,
    },
    #[error("{0}")]
    CorruptData(String),
    /// A chunk's row offsets fail their check, or do not survive their shift.
    #[error("{key}: {source}")]
    RowOffsets {
        key: String,
        source: scdl_format::flat::RowOffsetError,
    },
    #[error("local cache I/O failed: {0}")]
    CacheIo(Arc<std::io::Error>),
    /// A cached part failed its checksum (or its file could not be opened again) and was
    /// dropped; reading it again fetches it.
    #[error("{0}")]
    CacheCorrupt(String),
}

/// Why a write to a hint file is refused: lines the protocol does not allow, or a plan
/// the dataset or the daemon's bounds do not allow.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HintRefused {
    #[error(transparent)]
    Malformed(#[from] scdl_format::hint::HintError),
    #[error(transparent)]
    Plan(#[from] crate::prefetch::plan::PlanError),
}

impl FsError {
    /// The errno a FUSE reply carries for this error.
    pub fn errno(&self) -> Errno {
        match self {
            FsError::NotFound => Errno::ENOENT,
            FsError::NotADirectory => Errno::ENOTDIR,
            FsError::IsADirectory => Errno::EISDIR,
            FsError::ReadOnly => Errno::EROFS,
            FsError::NoSuchAttribute => Errno::NO_XATTR,
            FsError::BufferTooSmall => Errno::ERANGE,
            FsError::NotATerminal => Errno::ENOTTY,
            FsError::InvalidHint(_) | FsError::InvalidRequest(_) => Errno::EINVAL,
            FsError::Busy(_) => Errno::EBUSY,
            FsError::Store { .. }
            | FsError::ObjectChanged { .. }
            | FsError::ShortRead { .. }
            | FsError::TimedOut { .. }
            | FsError::CorruptData(_)
            | FsError::RowOffsets { .. }
            | FsError::CacheIo(_)
            | FsError::CacheCorrupt(_) => Errno::EIO,
        }
    }

    /// A store error, its message stripped of any credentials its URLs carry.
    pub fn store(key: &str, error: &object_store::Error) -> FsError {
        FsError::Store {
            key: key.to_owned(),
            message: crate::store::redact_urls(&error.to_string()),
        }
    }
}

impl From<std::io::Error> for FsError {
    fn from(error: std::io::Error) -> Self {
        FsError::CacheIo(Arc::new(error))
    }
}

impl From<crate::cache::CacheError> for FsError {
    fn from(error: crate::cache::CacheError) -> Self {
        match error {
            crate::cache::CacheError::Io(error) => error.into(),
            // Both were dropped from the cache: the read path fetches the part again.
            dropped @ (crate::cache::CacheError::Corrupt { .. }
            | crate::cache::CacheError::Vanished { .. }) => {
                FsError::CacheCorrupt(dropped.to_string())
            }
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;
