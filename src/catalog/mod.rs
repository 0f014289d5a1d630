//! What the mount shows: the tree of directories and files built lazily from store
//! listings ([`tree`]), the objects behind them with their pinned versions
//! ([`objects`]), and the chunked datasets found on the way ([`dataset`]).

pub mod dataset;
pub mod objects;
pub mod tree;

pub use dataset::FlatDataset;
pub use objects::{ObjectInfo, ObjectRegistry};
pub use tree::{DirMode, FileContent, Node, NodeKind, Tree};
