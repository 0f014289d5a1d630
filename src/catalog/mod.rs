//! What the mount shows: the tree of directories and files built lazily from store
//! listings ([`tree`]), the objects behind them with their pinned versions
//! ([`objects`]), and the chunked ([`chunked`]) and monolithic ([`monolithic`])
//! datasets found on the way, either of them a [`Dataset`] ([`dataset`]).

pub(crate) mod chunked;
pub(crate) mod dataset;
pub mod monolithic;
pub(crate) mod objects;
pub mod tree;

pub use chunked::FlatDataset;
pub use dataset::Dataset;
pub use monolithic::MonolithicDataset;
pub use objects::ObjectRegistry;
pub use tree::{DirMode, FileContent, ListingTimes, Node, NodeKind, Tree, LISTING_DEADLINES};
