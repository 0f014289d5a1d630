//! The SCDL single-cell on-disk format, as the released `bionemo-scdl` readers and the
//! remote chunked layout use it.
//!
//! This crate is the one place that knows the bytes of the format: the big-endian
//! `header.sch` codec ([`header`]), the element types of the raw arrays ([`dtype`]),
//! the names and geometry of a chunked archive ([`layout`]), the writer that partitions
//! a monolithic archive into chunks ([`chunking`]), how a chunked archive reads as the
//! monolithic one it stands for ([`flat`]), and the read-ahead hint protocol
//! that the sampler speaks to the scdlfs daemon ([`hint`]). It does no network I/O and
//! knows nothing of FUSE, so both the daemon and the sampler library depend on it.

pub mod chunking;
pub mod dtype;
pub mod flat;
pub mod header;
pub mod hint;
pub mod layout;
pub mod manifest;

pub use dtype::Dtype;
pub use header::{ArrayInfo, Backend, ChunkedInfo, FeatureIndexInfo, Header, HeaderError};
pub use layout::{ArrayKind, ChunkGeometry};
