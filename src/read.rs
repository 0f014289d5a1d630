//! The read path: a resolved read ([`ReadPlan`]) becomes bytes. Parts already on disk
//! are read in the caller's thread ([`ReadPath::read_cached`]); anything that needs the
//! network is awaited in a task ([`ReadPath::read`]), so the FUSE threads never wait
//! on a download. Row offsets are rebased here (the rule lives with the format,
//! [`scdl_format::flat`]), and a read touching a flat chunk waits for that chunk's row
//! offsets to pass their check ([`crate::row_offset_check`]): wrong numbers are never
//! served.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::future::try_join_all;
use scdl_format::flat::rebase_row_offsets;
use scdl_format::ArrayKind;

use crate::cache::{DiskCache, Recency};
use crate::error::{FsError, FsResult};
use crate::fetch::{Fetcher, PartBytes};
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::parts::PartKey;
use crate::row_offset_check::RowOffsetCheck;
use crate::view::{Piece, ReadPlan};

/// How often a read assembles its parts when cached ones keep failing their checksum
/// or their reads (each failure drops the part, so the next attempt downloads it).
const CORRUPT_PART_ATTEMPTS: u32 = 3;

/// Bytes `within` (offsets in the part) of part `index` of `object`, which a read needs.
struct Need<'a> {
    key: PartKey,
    object: &'a Arc<ObjectInfo>,
    index: u64,
    within: std::ops::Range<u64>,
}

pub struct ReadPath {
    fetcher: Arc<Fetcher>,
    cache: Arc<DiskCache>,
    row_offset_check: Arc<RowOffsetCheck>,
    metrics: Arc<Metrics>,
}

impl ReadPath {
    pub fn new(
        fetcher: Arc<Fetcher>,
        cache: Arc<DiskCache>,
        row_offset_check: Arc<RowOffsetCheck>,
        metrics: Arc<Metrics>,
    ) -> Arc<ReadPath> {
        Arc::new(ReadPath {
            fetcher,
            cache,
            row_offset_check,
            metrics,
        })
    }

    /// The parts a plan needs, each once, with the bytes of each it needs.
    fn parts_needed<'a>(&self, plan: &'a ReadPlan) -> Vec<Need<'a>> {
        let part_size = self.fetcher.part_size();
        let mut needs: Vec<Need<'a>> = Vec::new();
        let mut at: HashMap<PartKey, usize> = HashMap::new();
        for piece in &plan.pieces {
            if let Piece::Object { object, range, .. } = piece {
                for index in self.fetcher.parts_of(range) {
                    let key = Fetcher::key(object, index);
                    let part_start = index * part_size;
                    let within = range.start.max(part_start) - part_start
                        ..range.end.min(part_start + part_size) - part_start;
                    match at.get(&key) {
                        Some(&i) => {
                            let known = &mut needs[i].within;
                            *known = known.start.min(within.start)..known.end.max(within.end);
                        }
                        None => {
                            at.insert(key, needs.len());
                            needs.push(Need {
                                key,
                                object,
                                index,
                                within,
                            });
                        }
                    }
                }
            }
        }
        needs
    }

    /// The parts a reader's read needs, noted as demanded (a prefetched one is a hit).
    fn parts_demanded<'a>(&self, plan: &'a ReadPlan) -> Vec<Need<'a>> {
        let needs = self.parts_needed(plan);
        for need in &needs {
            self.fetcher.note_demand(need.key);
        }
        needs
    }

    /// Bytes per part, as the fetcher cuts objects.
    pub fn part_size(&self) -> u64 {
        self.fetcher.part_size()
    }

    /// Serves the read from the disk cache (and the bytes the fetcher holds in memory)
    /// alone, if every part is there and every chunk check has passed; `None` if the
    /// read must wait for something.
    pub fn read_cached(&self, plan: &ReadPlan) -> Option<FsResult<Vec<u8>>> {
        let needs = self.parts_demanded(plan);
        let mut out = Vec::new();
        let result = self.read_local(plan, needs, Recency::Use, &mut out)?;
        Metrics::add(&self.metrics.reads_from_cache, 1);
        Some(result.map(|()| out))
    }

    /// Bytes no reader has asked for yet, for the read-around, into `out` (reused from
    /// push to push): served like [`ReadPath::read_cached`] if every part is local, but
    /// neither a use of the parts for the eviction order nor a demand, and never a
    /// download.
    pub fn read_around(&self, plan: &ReadPlan, out: &mut Vec<u8>) -> Option<FsResult<()>> {
        self.read_local(plan, self.parts_needed(plan), Recency::Keep, out)
    }

    /// Whether every byte of `plan` is local now (cached, or held by the fetcher) and
    /// every chunk check has passed: what [`ReadPath::read_around`] needs to serve it.
    pub fn is_local(&self, plan: &ReadPlan) -> bool {
        let checked = plan
            .chunks_to_check
            .as_ref()
            .is_none_or(|(dataset, chunks)| {
                chunks
                    .iter()
                    .all(|&chunk| RowOffsetCheck::passed(dataset, chunk))
            });
        checked
            && self
                .parts_needed(plan)
                .iter()
                .all(|need| self.has_locally(need))
    }

    /// Gives back the fetcher's copies of a plan's exact rows within `plan`: they are in
    /// the page cache now.
    pub fn release_planned(&self, plan: &ReadPlan) {
        for need in self.parts_needed(plan) {
            self.fetcher.release_planned(need.key, &need.within);
        }
    }

    /// Whether the bytes a read needs of a part are cached or held by the fetcher.
    fn has_locally(&self, need: &Need<'_>) -> bool {
        self.cache.contains(need.key) || self.fetcher.in_memory(need.key, &need.within).is_some()
    }

    fn read_local(
        &self,
        plan: &ReadPlan,
        needs: Vec<Need<'_>>,
        recency: Recency,
        out: &mut Vec<u8>,
    ) -> Option<FsResult<()>> {
        if let Some((dataset, chunks)) = &plan.chunks_to_check {
            for &chunk in chunks {
                match RowOffsetCheck::verdict(dataset, chunk) {
                    Some(Ok(())) => {}
                    Some(Err(rejected)) => return Some(Err(rejected.clone().into())),
                    None => return None,
                }
            }
        }
        let mut parts = HashMap::new();
        for need in needs {
            let part = match self.cache.get(need.key, recency) {
                Some(part) => PartBytes::Cached(part),
                None => self.fetcher.in_memory(need.key, &need.within)?,
            };
            parts.insert(need.key, part);
        }
        match self.finish_into(plan, &parts, out) {
            // The bad part is out of the cache now: the read goes to the network.
            Err(FsError::CacheCorrupt(_)) => None,
            result => Some(result),
        }
    }

    /// Serves the read, downloading what is missing.
    pub async fn read(self: &Arc<Self>, plan: ReadPlan) -> FsResult<Vec<u8>> {
        let started = Instant::now();
        let needed = self.parts_demanded(&plan);
        let mut on_network = needed.iter().any(|need| !self.has_locally(need));
        let checks = async {
            if let Some((dataset, chunks)) = &plan.chunks_to_check {
                // Pieces come in file order, so a chunk's repeats are adjacent.
                let mut chunks = chunks.clone();
                chunks.dedup();
                try_join_all(chunks.into_iter().map(|c| async move {
                    let verdict = self.row_offset_check.check(dataset, c).await?;
                    verdict.clone().map_err(FsError::from)
                }))
                .await?;
            }
            Ok::<_, FsError>(())
        };
        if let Some((dataset, chunks)) = &plan.chunks_to_check {
            on_network |= chunks.iter().any(|&c| {
                RowOffsetCheck::verdict(dataset, c).is_none()
                    && !self.fetcher.is_cached(dataset.array(c, ArrayKind::RowPtr))
            });
        }
        let ((), mut parts) = futures::try_join!(checks, self.fetch_all(needed))?;
        let mut attempt = 1;
        let result = loop {
            match self.finish(&plan, &parts.into_iter().collect()) {
                // A cached part failed its checksum or could not be read, and left the
                // cache: fetch it again.
                Err(FsError::CacheCorrupt(_)) if attempt < CORRUPT_PART_ATTEMPTS => {
                    attempt += 1;
                    on_network = true;
                    parts = self.fetch_all(self.parts_demanded(&plan)).await?;
                }
                result => break result,
            }
        };
        if on_network {
            self.fetcher.note_read_answered();
            self.metrics.demand_wait_seconds.record(started.elapsed());
        }
        result
    }

    /// The bytes each need asks for, from the cache or as soon as they have arrived.
    async fn fetch_all(&self, needs: Vec<Need<'_>>) -> FsResult<Vec<(PartKey, PartBytes)>> {
        try_join_all(needs.into_iter().map(|need| async move {
            let bytes = self
                .fetcher
                .bytes(need.object, need.index, need.within)
                .await?;
            Ok::<_, FsError>((need.key, bytes))
        }))
        .await
    }

    /// Assembles a plan's bytes from its parts.
    fn finish(&self, plan: &ReadPlan, parts: &HashMap<PartKey, PartBytes>) -> FsResult<Vec<u8>> {
        let mut out = Vec::new();
        self.finish_into(plan, parts, &mut out)?;
        Ok(out)
    }

    /// Assembles a plan's bytes from its parts into `out`, whatever it held: the pieces
    /// cover every byte, so a reused buffer needs no clearing.
    fn finish_into(
        &self,
        plan: &ReadPlan,
        parts: &HashMap<PartKey, PartBytes>,
        out: &mut Vec<u8>,
    ) -> FsResult<()> {
        let total: u64 = plan
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Object { range, .. } => range.end - range.start,
                Piece::Bytes(b) => b.len() as u64,
            })
            .sum();
        out.resize(total as usize, 0);
        let mut at = 0usize;
        let part_size = self.fetcher.part_size();
        for piece in &plan.pieces {
            match piece {
                Piece::Bytes(bytes) => {
                    out[at..at + bytes.len()].copy_from_slice(bytes);
                    at += bytes.len();
                }
                Piece::Object {
                    object,
                    range,
                    rebase,
                } => {
                    let piece_start = at;
                    for index in self.fetcher.parts_of(range) {
                        let part_start = index * part_size;
                        let from = range.start.max(part_start);
                        let to = range.end.min(part_start + part_size);
                        let dest = piece_start + (from - range.start) as usize;
                        let part = &parts[&Fetcher::key(object, index)];
                        part.copy_to(
                            &mut out[dest..dest + (to - from) as usize],
                            from - part_start,
                        )?;
                    }
                    at += (range.end - range.start) as usize;
                    if let Some((dtype, add)) = rebase {
                        rebase_row_offsets(&mut out[piece_start..at], *dtype, *add).map_err(
                            |source| FsError::RowOffsets {
                                key: object.key.to_string(),
                                source,
                            },
                        )?;
                    }
                }
            }
        }
        let skip = plan.skip as usize;
        if skip > 0 {
            out.drain(..skip);
        }
        out.truncate(plan.len as usize);
        Ok(())
    }
}
