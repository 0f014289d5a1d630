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
//! Within an arena, glibc returns freed memory to the kernel only from the top of the
//! heap; freed chunks below a live one stay resident. With the live heap flat, that
//! kept heap still grew with the epoch's length (25 MiB after a 1.46 GB epoch, 36 MiB
//! after a 14.6 GB one), so the daemon hands it back every [`HEAP_RETURN_INTERVAL`]
//! ([`return_freed_heap`], from its main loop).

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

/// How often the daemon hands its freed heap back to the kernel.
pub const HEAP_RETURN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Hands the pages of every freed heap chunk, in every arena, back to the kernel.
///
/// Unconditional: the allocator's figures count freed bytes whether or not their pages
/// are still resident, so they cannot tell whether a call would gain anything. A call
/// advises the kernel once per free chunk that spans a page (measured at well under a
/// millisecond after a cold epoch); a page handed back costs a fault when reused.
pub fn return_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases pages of free chunks, under the arenas' locks.
    unsafe {
        libc::malloc_trim(0);
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

    /// The tests that read the heap's figures run one at a time.
    static HEAP_FIGURES: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    #[test]
    fn reads_the_resident_size_and_the_heap() {
        let _alone = HEAP_FIGURES.lock();
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
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_heap_goes_back_to_the_kernel() {
        let _alone = HEAP_FIGURES.lock();
        const BLOCK: usize = 16 << 10;
        // Every other block stays live, so the freed ones lie between live ones and
        // the allocator cannot shrink its heap from the top to return them.
        let mut blocks: Vec<Vec<u8>> = (0..2048).map(|_| vec![1u8; BLOCK]).collect();
        let live: Vec<Vec<u8>> = blocks.iter_mut().step_by(2).map(std::mem::take).collect();
        let page = 4096;
        let freed_pages: Vec<usize> = blocks
            .iter()
            .filter(|block| !block.is_empty())
            .map(|block| (block.as_ptr() as usize + 64).next_multiple_of(page))
            .collect();
        drop(blocks);
        let resident = |pages: &[usize]| {
            pages
                .iter()
                .filter(|&&address| {
                    let mut in_core = 0u8;
                    // SAFETY: mincore only reports on the mapping; the page is not read.
                    let done =
                        unsafe { libc::mincore(address as *mut libc::c_void, page, &mut in_core) };
                    done == 0 && in_core & 1 == 1
                })
                .count()
        };
        assert!(resident(&freed_pages) > freed_pages.len() * 9 / 10);
        return_freed_heap();
        // Other tests' threads may take some of the freed chunks meanwhile.
        let kept = resident(&freed_pages);
        assert!(
            kept < freed_pages.len() / 10,
            "{kept} of {} pages still resident",
            freed_pages.len()
        );
        drop(live);
    }

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tscdlfs\nVmHWM:\t  120 kB\nVmRSS:\t   64 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), 64);
        assert_eq!(status_kib(status, "VmHWM:"), 120);
        assert_eq!(status_kib(status, "VmSwap:"), 0);
    }
}
