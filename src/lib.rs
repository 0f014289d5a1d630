//! scdlfs: a remote chunked SCDL dataset as an ordinary local directory.
//!
//! The layers, top to bottom (see `docs/architecture.md`):
//! - [`fs`]: the FUSE glue; answers from memory or the disk cache, or from a task.
//! - [`catalog`]: the inode tree from store listings, dataset discovery and checks.
//! - [`view`]: which object bytes a file's bytes are (raw objects, flat arrays).
//! - [`read`]: turns a resolved read into bytes, rebasing and checking row offsets.
//! - [`prefetch`]: plans from hint files, read-ahead, eviction advice.
//! - [`fetch`]: one download per part, demand before prefetch, retries.
//! - [`cache`]: parts on local disk under a byte budget.
//! - [`parts`]: part ids and the geometry of parts and blocks, shared by the above.
//! - [`store`]: the object client for S3, GCS, HTTP and local folders, and test doubles.
//!
//! [`chunker`] is `scdlfs chunk`, which writes chunked datasets into any store.
//! [`mount`] assembles them; [`cli`] is the command line; [`status`] and
//! [`metrics_http`] report on a running mount; [`warm`] fetches named parts into its
//! cache on request (`scdlfs warm`).

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
pub mod parts;
pub mod prefetch;
pub mod process_memory;
pub mod progress;
pub mod read;
pub mod status;
pub mod store;
pub mod synthetic;
pub mod units;
pub mod unmount;
pub mod view;
pub mod warm;
