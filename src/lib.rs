//! scdlfs: a remote chunked SCDL dataset as an ordinary local directory.
//!
//! The layers, top to bottom (see `docs/architecture.md`). Every module imports only
//! modules on its own line's right or on lines below it; none imports upward:
//! - [`cli`], [`mount`], [`metrics_http`]: the command line, the composition root
//!   ([`mount::assemble`], which hands each component exactly what it uses), and the
//!   metrics endpoint.
//! - [`fs`], [`status`]: the FUSE glue (answers from memory or the disk cache, or from a
//!   task; errno values are made in [`fs::errno`] alone) and what `scdlfs status` shows.
//! - [`prefetch`], [`read`], [`warm`]: plans from hint files and read-ahead; a planned
//!   read becomes bytes; warm jobs. None imports another.
//! - [`row_offset_check`]: each flat chunk's row offsets checked once per mount.
//! - [`view`]: which object bytes a file's bytes are (raw objects, flat arrays).
//! - [`catalog`], [`fetch`]: the inode tree from store listings, dataset discovery and
//!   checks; one download per part, demand before prefetch, hard deadlines.
//! - [`cache`]: parts on local disk under a byte budget.
//! - The bottom, which every layer may use: [`object`] (an object as pinned, and the
//!   one pinned GET), [`error`], [`parts`] (part ids and geometry), [`planner_wake`]
//!   (the bell the layers below ring for the prefetcher), [`metrics`], and [`store`]
//!   (the object client for S3, GCS, HTTP and local folders).
//!
//! Beside the stack: [`chunker`] is `scdlfs chunk`, which writes chunked datasets into
//! any store; [`synthetic`] makes the datasets of `scdlfs demo` (which the tests and
//! the benchmarks use too); [`units`], [`progress`], [`process_memory`] and [`unmount`]
//! are small helpers of the command line.

pub mod cache;
pub mod cache_dir_check;
pub mod catalog;
pub mod chunker;
pub mod cli;
pub mod error;
pub mod fetch;
pub mod fs;
pub mod metrics;
pub mod metrics_http;
pub mod mount;
pub mod object;
pub mod parts;
pub mod planner_wake;
pub mod prefetch;
pub mod process_memory;
pub mod progress;
pub mod read;
pub mod row_offset_check;
pub mod status;
pub mod store;
pub mod synthetic;
pub mod units;
pub mod unmount;
pub mod view;
pub mod warm;
