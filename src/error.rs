//! The filesystem's error type: every failure a FUSE reply can carry is an
//! [`FsError`], with its facts as data.
//!
//! Part of the bottom layer: it names no layer above it (each converts its own typed
//! errors into an [`FsError`] where it defines them), and the FUSE edge alone turns an
//! [`FsError`] into an errno ([`crate::fs::errno`]).

use std::sync::Arc;

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
    /// A user opening more hint handles than one user may hold.
    #[error("user {uid} holds {limit} hint handles already")]
    TooManyHintHandles { uid: u32, limit: usize },
    /// A control request (an extended attribute written) that is not one.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("busy: {0}")]
    Busy(String),
    #[error("object store request for {key} failed: {message}")]
    Store { key: String, message: String },
    #[error("{key} changed in the store since it was listed ({pinned} no longer matches); unmount and mount again to see the new version")]
    ObjectChanged { key: String, pinned: String },
    #[error("{key}: the store's answer has no ETag to tie it to the bytes held from an earlier answer; not joined")]
    VersionUnconfirmed { key: String },
    #[error("{key} returned {got} bytes for a range of {expected}: truncated or changed object")]
    ShortRead {
        key: String,
        expected: u64,
        got: u64,
    },
    #[error("{prefix}: the store lists more than {limit} entries")]
    ListingTooLong { prefix: String, limit: usize },
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
    /// A cached part failed its checksum (or its file could not be opened or read) and
    /// was dropped; reading it again fetches it.
    #[error("{0}")]
    CacheCorrupt(String),
    /// A bug: the operation panicked. The thread it ran on goes on serving.
    #[error("the operation panicked: {message}")]
    Panicked { message: String },
}

impl FsError {
    /// The error a caught panic becomes, with what it said.
    pub fn of_panic(panic: Box<dyn std::any::Any + Send>) -> FsError {
        let message = match panic.downcast::<String>() {
            Ok(message) => *message,
            Err(panic) => panic
                .downcast_ref::<&str>()
                .map_or("(no message)", |message| message)
                .to_owned(),
        };
        FsError::Panicked { message }
    }
}

/// Why a write to a hint file is refused: lines the protocol does not allow, or a plan
/// the dataset or the daemon's bounds do not allow.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HintRefused {
    #[error(transparent)]
    Malformed(#[from] scdl_format::hint::HintError),
    #[error(transparent)]
    Plan(#[from] PlanRefused),
}

/// Why a batch of hint lines is refused by the plan it would change (which is then
/// unchanged): the facts, as the prefetcher found them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanRefused {
    #[error("the writer assumes chunks of {writer} rows, but the dataset's chunks have {dataset}")]
    ChunkRows { writer: u64, dataset: u64 },
    #[error("window names chunk {chunk}, but the dataset has {chunks} chunks")]
    NoSuchChunk { chunk: u32, chunks: u64 },
    #[error("rows {start}..{end} end past the dataset's {rows} rows")]
    RowsPastEnd { start: u64, end: u64, rows: u64 },
    #[error("plan longer than {limit} steps")]
    TooManySteps { limit: usize },
    #[error("the plans of all open hint files would name more than {limit} chunks and row ranges")]
    TooManyEntries { limit: usize },
    #[error("a step spans {work} chunks, more than the {limit} one step may")]
    StepTooWide { work: u64, limit: u64 },
    #[error("the plan would span {work} chunks over its steps, more than the {limit} left to this handle and its user")]
    TooMuchWork { work: u64, limit: u64 },
    #[error("plans started faster than {per_second} a second (after a burst of {burst})")]
    StartsTooFast { per_second: u32, burst: u32 },
    #[error("a step begun with window+ goes on with rows, or one begun with rows+ with window")]
    MixedStep,
}

impl FsError {
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

pub type FsResult<T> = Result<T, FsError>;
