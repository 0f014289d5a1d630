//! Layout discovery: how many rows a dataset has and how they fall into chunks, learnt
//! from the dataset directory alone.
//!
//! A sampler may be pointed at three kinds of directory, told apart by their headers:
//!
//! * the **raw view** of an scdlfs mount (or a local chunked archive): `header.sch` is
//!   chunked (backend 2) and its trailer carries the chunk description;
//! * the **flat view** of an scdlfs mount: `header.sch` is monolithic (backend 1), so
//!   that the released reader can open the directory, and the chunked original is kept
//!   at `.chunked/header.sch`;
//! * a **monolithic dataset on a mount**: `header.sch` is monolithic and there is no
//!   `.chunked/`, but the directory has a hint file; the daemon groups the rows into
//!   virtual chunks and its hint file, read, announces how many rows each has
//!   ([`scdl_format::hint::Announcement`]), so sampler and daemon agree on what a
//!   `window` step names;
//! * a **plain monolithic** directory on local disk: no chunks at all, so rows are
//!   grouped into virtual chunks of a size the caller chooses, which keeps the same
//!   orders usable (the locality they buy is then only the page cache's).
//!
//! This module only reads headers and the hint file's announcement; it never lists
//! chunk directories, which on a mount would cost a round trip per entry for nothing
//! the header does not already say.

use std::fmt;
use std::fs;
use std::io;
use std::num::NonZeroU64;
use std::ops::Range;
use std::path::{Path, PathBuf};

use scdl_format::hint::{Announcement, HINT_FILE};
use scdl_format::layout::{CHUNKED_DIR, HEADER_FILE};
use scdl_format::{ArrayKind, Backend, ChunkGeometry, Header, HeaderError};

/// Rows per virtual chunk of a plain monolithic directory, unless the caller says
/// otherwise.
pub const DEFAULT_VIRTUAL_CHUNK_SIZE: NonZeroU64 = NonZeroU64::new(1024).unwrap();

/// Which kind of directory [`DatasetLayout::discover`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetKind {
    /// `header.sch` is chunked: the raw view of a mount, or a local chunked archive.
    RawView,
    /// `header.sch` is monolithic and `.chunked/header.sch` holds the chunk description.
    FlatView,
    /// A monolithic archive on a mount: its chunks are the daemon's virtual chunks, of
    /// the size its hint file announces.
    MountedMonolithic,
    /// A monolithic archive without `.chunked/`; its chunks are virtual.
    PlainMonolithic,
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DatasetKind::RawView => "raw view",
            DatasetKind::FlatView => "flat view",
            DatasetKind::MountedMonolithic => "monolithic dataset on a mount",
            DatasetKind::PlainMonolithic => "plain monolithic directory",
        })
    }
}

/// Why a dataset's layout could not be learnt.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} is not a usable SCDL header: {source}")]
    Header { path: PathBuf, source: HeaderError },
    #[error("{path} should be a chunked header (backend 2) but is monolithic")]
    NotChunked { path: PathBuf },
    #[error("{path}: {reason}")]
    Inconsistent { path: PathBuf, reason: String },
    #[error(
        "the flat header says {flat_rows} rows but {CHUNKED_DIR}/{HEADER_FILE} says {chunked_rows}"
    )]
    ViewsDisagree { flat_rows: u64, chunked_rows: u64 },
    #[error("chunk size must be positive")]
    ZeroChunkSize,
    #[error(
        "{path} does not announce the daemon's chunk rows (an scdlfs of another protocol version?)"
    )]
    BadAnnouncement { path: PathBuf },
    #[error("{total_rows} rows in chunks of {chunk_size} make more than 2^32 chunks")]
    TooManyChunks { total_rows: u64, chunk_size: u64 },
}

/// The rows of a dataset and their chunks, with chunk ids that fit the `u32` of the
/// hint protocol's `window` lines and of the chunked header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLayout {
    geometry: ChunkGeometry,
}

impl ChunkLayout {
    pub fn new(total_rows: u64, chunk_size: u64) -> Result<ChunkLayout, LayoutError> {
        let geometry =
            ChunkGeometry::new(total_rows, chunk_size).ok_or(LayoutError::ZeroChunkSize)?;
        if u32::try_from(geometry.num_chunks()).is_err() {
            return Err(LayoutError::TooManyChunks {
                total_rows,
                chunk_size,
            });
        }
        Ok(ChunkLayout { geometry })
    }

    pub fn total_rows(&self) -> u64 {
        self.geometry.total_rows
    }

    /// Rows per chunk; the last chunk may be shorter.
    pub fn chunk_size(&self) -> u64 {
        self.geometry.chunk_size
    }

    pub fn num_chunks(&self) -> u32 {
        self.geometry.num_chunks() as u32
    }

    /// The rows `[start, end)` of chunk `chunk`.
    pub fn chunk_rows(&self, chunk: u32) -> Range<u64> {
        self.geometry.chunk_rows(chunk as u64)
    }
}

/// What a sampler needs to know of a dataset directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetLayout {
    /// The directory the layout was learnt from; its hint file, if any, is here.
    pub dir: PathBuf,
    pub kind: DatasetKind,
    pub chunks: ChunkLayout,
}

impl DatasetLayout {
    /// Learns the layout of the dataset at `dir`. `virtual_chunk_size` is used only for a
    /// plain monolithic directory, which has no chunks of its own and no daemon to ask.
    pub fn discover(
        dir: &Path,
        virtual_chunk_size: NonZeroU64,
    ) -> Result<DatasetLayout, LayoutError> {
        let top_path = dir.join(HEADER_FILE);
        let top = read_header(&top_path)?;
        let (kind, chunks) = match top.backend {
            Backend::Chunked => (DatasetKind::RawView, chunk_layout_of(&top, &top_path)?),
            Backend::Monolithic => {
                let flat_rows = rows_from_row_ptr(&top, &top_path)?;
                let chunked_dir = dir.join(CHUNKED_DIR);
                match fs::symlink_metadata(&chunked_dir) {
                    Ok(_) => {
                        let path = chunked_dir.join(HEADER_FILE);
                        let chunks = chunk_layout_of(&read_header(&path)?, &path)?;
                        if chunks.total_rows() != flat_rows {
                            return Err(LayoutError::ViewsDisagree {
                                flat_rows,
                                chunked_rows: chunks.total_rows(),
                            });
                        }
                        (DatasetKind::FlatView, chunks)
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        match announced_chunk_rows(dir)? {
                            Some(rows) => (
                                DatasetKind::MountedMonolithic,
                                ChunkLayout::new(flat_rows, rows)?,
                            ),
                            None => (
                                DatasetKind::PlainMonolithic,
                                ChunkLayout::new(flat_rows, virtual_chunk_size.get())?,
                            ),
                        }
                    }
                    Err(source) => {
                        return Err(LayoutError::Read {
                            path: chunked_dir,
                            source,
                        })
                    }
                }
            }
        };
        Ok(DatasetLayout {
            dir: dir.to_owned(),
            kind,
            chunks,
        })
    }
}

/// The rows per chunk the daemon announces in the hint file at `dir`, or `None` when
/// there is no hint file (not a mount).
fn announced_chunk_rows(dir: &Path) -> Result<Option<u64>, LayoutError> {
    Ok(read_announcement(dir)?.map(|a| a.chunk_rows))
}

/// The daemon's announcement in the hint file of the dataset directory `dir`, read
/// through a handle of its own (so the cache it reports is the cache as of now), or
/// `None` when there is no hint file (not a mount).
pub fn read_announcement(dir: &Path) -> Result<Option<Announcement>, LayoutError> {
    let path = dir.join(HINT_FILE);
    let text = match fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LayoutError::Read { path, source }),
    };
    match Announcement::parse(&text) {
        Some(announcement) => Ok(Some(announcement)),
        None => Err(LayoutError::BadAnnouncement { path }),
    }
}

fn read_header(path: &Path) -> Result<Header, LayoutError> {
    let bytes = fs::read(path).map_err(|source| LayoutError::Read {
        path: path.to_owned(),
        source,
    })?;
    Header::decode(&bytes).map_err(|source| LayoutError::Header {
        path: path.to_owned(),
        source,
    })
}

/// The row count a header's ROWPTR array implies: one offset per row, plus the end.
fn rows_from_row_ptr(header: &Header, path: &Path) -> Result<u64, LayoutError> {
    let row_ptr = header
        .array(ArrayKind::RowPtr)
        .map_err(|source| LayoutError::Header {
            path: path.to_owned(),
            source,
        })?;
    row_ptr
        .length
        .checked_sub(1)
        .ok_or_else(|| LayoutError::Inconsistent {
            path: path.to_owned(),
            reason: "ROWPTR has no entries, not even the final offset".into(),
        })
}

/// The chunk layout a chunked header describes, checked against itself, so a corrupt
/// trailer cannot send the sampler to chunks that do not exist.
fn chunk_layout_of(header: &Header, path: &Path) -> Result<ChunkLayout, LayoutError> {
    let info = match (header.backend, header.chunked) {
        (Backend::Chunked, Some(info)) => info,
        _ => {
            return Err(LayoutError::NotChunked {
                path: path.to_owned(),
            })
        }
    };
    let inconsistent = |reason: String| LayoutError::Inconsistent {
        path: path.to_owned(),
        reason,
    };
    let chunks = ChunkLayout::new(info.total_rows, info.chunk_size as u64)
        .map_err(|e| inconsistent(e.to_string()))?;
    if chunks.num_chunks() != info.num_chunks {
        return Err(inconsistent(format!(
            "{} rows in chunks of {} make {} chunks, but the header says {}",
            info.total_rows,
            info.chunk_size,
            chunks.num_chunks(),
            info.num_chunks
        )));
    }
    let row_ptr_rows = rows_from_row_ptr(header, path)?;
    if row_ptr_rows != info.total_rows {
        return Err(inconsistent(format!(
            "ROWPTR implies {row_ptr_rows} rows, but the chunk description says {}",
            info.total_rows
        )));
    }
    Ok(chunks)
}
