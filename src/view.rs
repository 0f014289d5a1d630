//! Views: what bytes a read of a file stands for, as pieces of objects.
//!
//! A raw file is one piece of one object. A flat array is pieces of the chunks' arrays
//! ([`scdl_format::flat`]), row offsets with the shift that rebases them. A synthesized file is
//! bytes held in memory. The view never does I/O: the read path fetches the pieces.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use scdl_format::{ArrayKind, Dtype};

use crate::catalog::{FileContent, FlatDataset};
use crate::object::ObjectInfo;
use scdl_format::flat::FlatPiece;

/// One contiguous source of bytes.
#[derive(Clone, Debug)]
pub enum Piece {
    /// Bytes `range` of an object, each `dtype` element increased by `add` when
    /// `rebase` is set.
    Object {
        object: Arc<ObjectInfo>,
        range: Range<u64>,
        rebase: Option<(Dtype, u64)>,
    },
    Bytes(Bytes),
}

/// A read, resolved: concatenate `pieces`, drop `skip` bytes, keep `len`. Before any byte
/// is returned, the row offsets of every chunk in `chunks_to_check` must have passed
/// their check.
pub struct ReadPlan {
    pub pieces: Vec<Piece>,
    pub skip: u64,
    pub len: u64,
    pub chunks_to_check: Option<(Arc<FlatDataset>, Vec<usize>)>,
}

impl ReadPlan {
    /// The pieces of a flat array's chunks, each with its chunk: what a flat read
    /// touches, as the view mapped it (nothing for other files).
    pub fn chunk_pieces(&self) -> impl Iterator<Item = (usize, &Arc<ObjectInfo>, &Range<u64>)> {
        let chunks = self.chunks_to_check.iter().flat_map(|(_, chunks)| chunks);
        let objects = self.pieces.iter().filter_map(|piece| match piece {
            Piece::Object { object, range, .. } => Some((object, range)),
            Piece::Bytes(_) => None,
        });
        // plan_flat lists one chunk per object piece, in order.
        chunks
            .zip(objects)
            .map(|(&chunk, (object, range))| (chunk, object, range))
    }

    fn whole(pieces: Vec<Piece>, len: u64) -> ReadPlan {
        ReadPlan {
            pieces,
            skip: 0,
            len,
            chunks_to_check: None,
        }
    }
}

/// Resolves a read of `size` bytes at `offset` of a file of `file_size` bytes.
pub fn plan_read(content: &FileContent, file_size: u64, offset: u64, size: u64) -> ReadPlan {
    let end = offset.saturating_add(size).min(file_size);
    if offset >= end {
        return ReadPlan::whole(Vec::new(), 0);
    }
    match content {
        FileContent::Object(object) => ReadPlan::whole(
            vec![Piece::Object {
                object: object.clone(),
                range: offset..end,
                rebase: None,
            }],
            end - offset,
        ),
        FileContent::Bytes(bytes) => ReadPlan::whole(
            vec![Piece::Bytes(bytes.slice(offset as usize..end as usize))],
            end - offset,
        ),
        FileContent::Hints(_, announced) => ReadPlan::whole(
            vec![Piece::Bytes(announced.slice(offset as usize..end as usize))],
            end - offset,
        ),
        FileContent::FlatArray(dataset, kind) => plan_flat(dataset, *kind, offset, end - offset),
    }
}

fn plan_flat(dataset: &Arc<FlatDataset>, kind: ArrayKind, offset: u64, len: u64) -> ReadPlan {
    let read = dataset.layout.map(kind, offset, len);
    let row_dtype = dataset.layout.row_dtype();
    let mut chunks = Vec::new();
    let pieces = read
        .pieces
        .into_iter()
        .map(|piece| match piece {
            FlatPiece::Chunk {
                chunk,
                array,
                range,
                add,
            } => {
                chunks.push(chunk);
                Piece::Object {
                    object: dataset.array(chunk, array).clone(),
                    range,
                    rebase: (array == ArrayKind::RowPtr).then_some((row_dtype, add)),
                }
            }
            FlatPiece::TotalNnz => {
                let mut bytes = vec![0u8; row_dtype.size().unwrap() as usize];
                // Validation checked that the total fits the row-offset type.
                row_dtype.write_uint(&mut bytes, 0, dataset.layout.total_nnz());
                Piece::Bytes(bytes.into())
            }
        })
        .collect();
    ReadPlan {
        pieces,
        skip: read.skip,
        len: read.len,
        chunks_to_check: Some((dataset.clone(), chunks)),
    }
}
