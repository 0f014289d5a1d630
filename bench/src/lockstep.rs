//! Ranks in lockstep, as DDP trains: every rank waits at each synchronous step until all
//! have read their rows of it, so the slowest rank of every step sets the epoch's pace.
//!
//! The ranks are separate processes of `scdlfs-bench read`; they meet through a file of
//! one 8-byte counter per rank (the steps it has finished), which each rank writes at its
//! own offset and reads whole while it waits. A rank that has read its share writes
//! `u64::MAX`, so that a shorter share never holds the others.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a rank waits for the others at one step before it gives up: a rank that
/// died would otherwise hold the rest for ever.
const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// Between two looks at the others' counters: short beside a step's reads.
const POLL: Duration = Duration::from_micros(200);

pub struct Lockstep {
    file: File,
    rank: u32,
    world_size: u32,
    finished: u64,
    /// Time spent waiting for the other ranks.
    pub waited: Duration,
}

impl Lockstep {
    /// Opens the ranks' meeting file at `path` (made by the driver, `world_size` × 8
    /// zero bytes).
    pub fn join(path: &Path, rank: u32, world_size: u32) -> Result<Lockstep, String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Lockstep {
            file,
            rank,
            world_size,
            finished: 0,
            waited: Duration::ZERO,
        })
    }

    fn publish(&self, steps: u64) -> Result<(), String> {
        self.file
            .write_all_at(&steps.to_le_bytes(), u64::from(self.rank) * 8)
            .map_err(|e| e.to_string())
    }

    fn slowest(&self) -> Result<u64, String> {
        let mut counters = vec![0u8; self.world_size as usize * 8];
        self.file
            .read_exact_at(&mut counters, 0)
            .map_err(|e| e.to_string())?;
        Ok(counters
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .min()
            .unwrap_or(u64::MAX))
    }

    /// This rank has read its rows of one more step: waits until every rank has.
    pub fn step_done(&mut self) -> Result<(), String> {
        self.finished += 1;
        self.publish(self.finished)?;
        let started = Instant::now();
        while self.slowest()? < self.finished {
            if started.elapsed() > STEP_TIMEOUT {
                return Err(format!(
                    "rank {} waited {STEP_TIMEOUT:?} for the others at step {}",
                    self.rank, self.finished
                ));
            }
            std::thread::sleep(POLL);
        }
        self.waited += started.elapsed();
        Ok(())
    }

    /// This rank has read its share: the others no longer wait for it.
    pub fn leave(&self) -> Result<(), String> {
        self.publish(u64::MAX)
    }
}
