//! The integration tests, one binary with each former test binary as a module: the
//! shared harness (tests/common) and the dependencies are compiled and linked once,
//! not once per file (`cargo test --profile ci -p scdlfs --no-run` after a change
//! to the crate: 123 s -> 76 s). One module's tests: `cargo test --test it soak::`.

#[path = "../common/mod.rs"]
mod common;

mod announce;
mod architecture_doc;
mod bad_input;
mod cache_budget;
mod cache_dir_owner;
mod cache_integrity;
mod chunk;
mod chunk_safety;
mod cli;
mod concurrency;
mod credentials;
mod deadlines;
mod degraded_disk;
mod faults;
#[path = "core.rs"]
mod fs_core; // not `core`, which would shadow the core crate
mod fuse_panics;
mod hostile_hints;
mod layers;
mod lifetime;
mod manifest;
mod metadata_ttl;
mod monolithic;
mod open_semantics;
mod permissions;
mod persistent_cache;
mod planned_pages;
mod prefetch;
mod reads;
mod ready_fd;
mod secrets;
mod service;
mod slow_discovery;
mod soak;
mod sources;
mod top_up;
mod untrusted_sizes;
mod warm;
