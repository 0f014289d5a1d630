//! The daemon's memory as the kernel and the allocator see it, for `scdlfs status`.
//!
//! The fetcher accounts for the bytes it holds (`fetch/memory.rs`); what the process
//! holds besides (catalog, plans, cache index, thread stacks, the allocator's free
//! lists) shows only in its resident size. Splitting that into the heap the program uses
//! and the free heap the allocator keeps tells growth of live state from retention.

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
        let held = vec![1u8; 64 << 20];
        let grown = ProcessMemory::now();
        assert!(
            grown.heap_in_use_bytes >= memory.heap_in_use_bytes + (64 << 20),
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
