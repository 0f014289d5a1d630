//! The datasets a hint file steers, of either kind: a chunked dataset shown flat
//! ([`FlatDataset`]) or a monolithic one shown as stored ([`MonolithicDataset`]).

use std::sync::Arc;
use std::time::SystemTime;

use object_store::path::Path as ObjectPath;
use scdl_format::{ArrayKind, ChunkGeometry};

use super::chunked::FlatDataset;
use super::monolithic::MonolithicDataset;
use crate::object::ObjectInfo;

/// A dataset a hint file steers: chunked (shown flat), or monolithic (shown as stored).
#[derive(Clone)]
pub enum Dataset {
    Chunked(Arc<FlatDataset>),
    Monolithic(Arc<MonolithicDataset>),
}

impl Dataset {
    pub fn prefix(&self) -> &ObjectPath {
        match self {
            Dataset::Chunked(d) => &d.prefix,
            Dataset::Monolithic(d) => &d.prefix,
        }
    }

    /// How the dataset's rows fall into chunks, real or virtual: what plans name.
    pub fn geometry(&self) -> ChunkGeometry {
        match self {
            Dataset::Chunked(d) => d.geometry(),
            Dataset::Monolithic(d) => d.geometry,
        }
    }

    pub fn mtime(&self) -> SystemTime {
        match self {
            Dataset::Chunked(d) => d.mtime,
            Dataset::Monolithic(d) => d.mtime(),
        }
    }

    /// An object every reader of the dataset reads first: its (first chunk's) row
    /// offsets; `None` for a chunked dataset of no rows, which has no chunk.
    pub fn row_offsets_object(&self) -> Option<&Arc<ObjectInfo>> {
        match self {
            Dataset::Chunked(d) => d.chunks.first().map(|c| &c[ArrayKind::RowPtr.index()]),
            Dataset::Monolithic(d) => Some(&d.arrays[ArrayKind::RowPtr.index()]),
        }
    }

    pub fn same(&self, other: &Dataset) -> bool {
        match (self, other) {
            (Dataset::Chunked(a), Dataset::Chunked(b)) => Arc::ptr_eq(a, b),
            (Dataset::Monolithic(a), Dataset::Monolithic(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
