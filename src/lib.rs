//! scdlfs: a remote chunked SCDL dataset as an ordinary local directory.
//!
//! The layers, top to bottom (see `docs/architecture.md`), as the imports make them:
//! a module imports only modules on lines below its own, none on its own line, and
//! sits one line above the highest it imports (`tests/it/layers.rs` holds this list
//! to the code):
//! - [`cli`]: the command line.
//! - [`mount`]: the composition root ([`mount::assemble`], which hands each component
//!   exactly what it uses).
//! - [`fs`], [`metrics_http`]: the FUSE glue (answers from memory or the disk cache, or
//!   from a task; errno values are made in [`fs::errno`] alone) and the metrics
//!   endpoint.
//! - [`status`]: what `scdlfs status` and the metrics endpoint show.
//! - [`read`], [`prefetch`]: a planned read becomes bytes; plans from hint files and
//!   read-ahead.
//! - [`view`], [`row_offset_check`], [`warm`]: which object bytes a file's bytes are
//!   (raw objects, flat arrays); each flat chunk's row offsets checked once per mount;
//!   warm jobs.
//! - [`catalog`], [`fetch`]: the inode tree from store listings, dataset discovery and
//!   checks; one download per part, demand before prefetch, hard deadlines.
//! - [`object`], [`cache`], [`users`]: an object as pinned, and the one pinned GET;
//!   parts on local disk under a byte budget; the processes a mount lives for.
//! - [`error`]: the error type, its payloads neutral (no layer's own types).
//! - [`store`], [`parts`], [`etag`], [`planner_wake`], [`metrics`]: the object client
//!   for S3, GCS, HTTP and local folders; part ids and geometry; an ETag as pinned;
//!   the bell the layers below ring for the prefetcher; the mount's counters and
//!   timings.
//!
//! Beside the stack, importing nothing of it (any layer may use them): [`chunker`] is
//! `scdlfs chunk`, which writes chunked datasets into any store; [`synthetic`] makes
//! the datasets of `scdlfs demo` (which the tests and the benchmarks use too);
//! [`units`], [`progress`], [`process_memory`], [`unmount`] and [`cache_dir_check`] are
//! small helpers of the command line and the mount.

// The crate's documentation is of its internals, built with `cargo doc
// --document-private-items`: the links from a module's docs to the private modules and
// items it is made of are the map of the architecture, and there they resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cache;
pub(crate) mod cache_dir_check;
pub mod catalog;
pub mod chunker;
pub mod cli;
pub mod error;
pub mod etag;
pub(crate) mod fetch;
pub mod fs;
pub mod metrics;
pub(crate) mod metrics_http;
pub mod mount;
pub(crate) mod object;
pub(crate) mod parts;
pub(crate) mod planner_wake;
pub mod prefetch;
pub(crate) mod process_memory;
pub(crate) mod progress;
pub(crate) mod read;
pub(crate) mod row_offset_check;
pub mod status;
pub mod store;
pub mod synthetic;
pub(crate) mod units;
pub(crate) mod unmount;
pub mod users;
pub(crate) mod view;
pub mod warm;
