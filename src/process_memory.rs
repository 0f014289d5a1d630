//! The daemon's memory as the kernel and the allocator see it, for `scdlfs status`.
//!
//! The fetcher accounts for the bytes it holds (`fetch/memory.rs`); what the process
//! holds besides (catalog, plans, cache index, thread stacks, the allocator's free
//! lists) shows only in its resident size. Splitting that into the heap the program uses
//! and the free heap the allocator keeps tells growth of live state from retention.
//!
//! The retention is bounded here too: glibc gives a thread that finds the heap busy an
//! arena of its own (up to eight per core) and keeps in each what was freed there. The
//! daemon's threads (runtime workers, blocking file I/O, FUSE, read-around pushers) all
//! pass bodies and replies through the heap, so every arena grew to its own high-water
//! mark. Measured on a 4.5 GB cold windows epoch: 111 MiB resident with glibc's default,
//! 94 MiB with two arenas, the heap in use the same.
//!
//! The free heap an arena keeps is not handed back to the kernel on a timer: tried with
//! `malloc_trim(0)` every second, a 15 GB cold windows epoch peaked at the same
//! resident size (92–99 MiB, against 86–97 without) for 20–45% more daemon CPU. The
//! allocator reuses its free lists before it touches new pages, so they do not raise
//! the peak, and every page handed back faults in again when the next body passes.
//!
//! Nor is glibc's mmap threshold fixed (it rises to the size of the largest mapped
//! block freed, so 128 KiB replies and body buffers soon come from the arenas): fixed
//! at 128 KiB, a cold windows epoch peaked at 48–56 MiB on 1.46 GB (55–70 without) and
//! 79–80 MiB on 14.6 GB (105–107), for 12% more daemon CPU (every such buffer mapped
//! and faulted in afresh), and the growth from the one size to the other stayed: over
//! the 14.6 GB epoch the resident size rose from 47 to 69 MiB between the peaks of
//! buffers in flight, none of which grows with the dataset (the largest, sampled with
//! heaptrack at the peak: the FUSE threads' request buffers, mostly never touched;
//! the read-around's two window buffers, since cut to a slice each, `fs/read_around.rs`;
//! the HTTP connections' read buffers).

use serde::{Deserialize, Serialize};

/// One reading of the process's memory; fields the platform cannot give are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// Resident set size now (`VmRSS`).
    pub resident_bytes: u64,
    /// The highest resident set size so far (`VmHWM`).
    pub peak_resident_bytes: u64,
    /// Heap bytes in live allocations (glibc `mallinfo2`: `uordblks` + `hblkhd`).
    pub heap_in_use_bytes: u64,
    /// Heap bytes freed but kept by the allocator (glibc `mallinfo2`: `fordblks`).
    pub heap_free_kept_bytes: u64,
}

impl ProcessMemory {
    pub fn now() -> ProcessMemory {
        let mut memory = ProcessMemory::default();
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            memory.resident_bytes = status_kib(&status, "VmRSS:") * 1024;
            memory.peak_resident_bytes = status_kib(&status, "VmHWM:") * 1024;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: mallinfo2 only reads the allocator's counters.
            let info = unsafe { libc::mallinfo2() };
            memory.heap_in_use_bytes = (info.uordblks + info.hblkhd) as u64;
            memory.heap_free_kept_bytes = info.fordblks as u64;
        }
        memory
    }
}

/// Heap arenas the daemon's allocator may create, unless `MALLOC_ARENA_MAX` says.
const HEAP_ARENAS: i32 = 2;

/// Caps glibc's heap arenas at [`HEAP_ARENAS`]; call before any thread is spawned.
pub fn limit_heap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no thread allocates yet.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, HEAP_ARENAS) };
    }
}

/// The value in KiB of `field` in `/proc/self/status`, 0 if absent.
fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_resident_size_and_the_heap() {
        let memory = ProcessMemory::now();
        assert!(memory.resident_bytes > 0);
        assert!(memory.peak_resident_bytes >= memory.resident_bytes);
        // Kept opaque: an optimizer may drop an allocation nothing reads. The heap is
        // the whole test process's, and tests beside this one free memory meanwhile
        // (a run under load once saw 64 MiB held as 66.9 MB of growth): hold far more
        // than is asked of the growth.
        let held = std::hint::black_box(vec![1u8; 256 << 20]);
        let grown = ProcessMemory::now();
        assert!(
            grown.heap_in_use_bytes >= memory.heap_in_use_bytes + (128 << 20),
            "{memory:?} then {grown:?}"
        );
        drop(held);
    }

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tscdlfs\nVmHWM:\t  120 kB\nVmRSS:\t   64 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), 64);
        assert_eq!(status_kib(status, "VmHWM:"), 120);
        assert_eq!(status_kib(status, "VmSwap:"), 0);
    }
}
