//! A reader's wait for its bytes of a part: answered from the cache, from memory, or
//! from the part's body as it passes them, within `read_timeout`, with a request of
//! its own for bytes far off ([`super::direct`]).

use std::ops::Range;
use std::sync::Arc;

use super::direct::{is_stray, worth_a_direct_read};
use super::permits::Urgency;
use super::planned::Covered;
use super::{Fetcher, PartBytes};
use crate::cache::Recency;
use crate::error::{FsError, FsResult};
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::parts::PartKey;

// Not a type of its own: a reader's wait looks in the cache, the memory, the plans' ranges, the edges and the downloads, and starts one: the Fetcher's whole state.
impl Fetcher {
    /// The part, waiting (at most `read_timeout`) for a download if it is not cached.
    pub async fn part(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
    ) -> FsResult<PartBytes> {
        let range = self.part_range(object, index);
        self.bytes(object, index, 0..range.end - range.start).await
    }

    /// Bytes `within` of the part (offsets in the part), waiting at most `read_timeout`:
    /// from the cache, or as soon as they have arrived.
    pub async fn bytes(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        within: Range<u64>,
    ) -> FsResult<PartBytes> {
        tokio::time::timeout(self.read_timeout, self.wait_for(object, index, within))
            .await
            .unwrap_or_else(|_| {
                Err(FsError::TimedOut {
                    key: object.key.to_string(),
                    after: self.read_timeout,
                })
            })
    }

    async fn wait_for(
        self: &Arc<Self>,
        object: &Arc<ObjectInfo>,
        index: u64,
        within: Range<u64>,
    ) -> FsResult<PartBytes> {
        let key = Self::key(object, index);
        loop {
            if let Some(part) = self.cache.get(key, Recency::Use) {
                return Ok(PartBytes::Cached(part));
            }
            if let Some(held) = self.in_memory(key, &within) {
                return Ok(held);
            }
            let planned = self.planned.covering(key, &within);
            if let Some(Covered::Coming(coming)) = planned {
                // A plan's exact bytes on their way: asking again would fetch them twice.
                coming.awaited();
                let mut done = coming.done;
                while done.changed().await.is_ok() {}
                continue;
            }
            if let Some(mut edge) = self.edges.on_the_wire(key, &within) {
                while edge.changed().await.is_ok() {}
                // Now in memory, or failed (and no longer in flight): look again.
                continue;
            }
            let part = self.part_range(object, index);
            let own = part.start + within.start..part.start + within.end;
            if is_stray(&within, part.end - part.start, self.is_in_flight(key))
                && (self.planned.is_read_exactly(object)
                    || self.waits_for_room(object, index)
                    || self.read_around_into_unplanned(object, index, &own))
            {
                // Bytes of a chunk the plans read later (the kernel's read-around across
                // a chunk's edge, into a neighbour of another window): its whole part
                // would evict a chunk they need sooner, for a few KiB; or, with room for
                // it, would be the first to go when room is needed, long before the
                // plans reach it. Or of a chunk whose rows the plans fetch exactly: its
                // part would be evicted before they come back to it. A failed or refused
                // read leaves the reader to the download, as for any reader.
                if let Some(Ok(bytes)) = self
                    .direct
                    .direct_read(&self.memory, object, own.clone())
                    .await
                {
                    Metrics::add(&self.metrics.stray_reads, 1);
                    return Ok(PartBytes::InMemory {
                        offset: within.start,
                        bytes,
                    });
                }
            }
            // None: it landed in the cache meanwhile (or was evicted again: retry).
            let Some((download, arriving)) = self.start(object, index, Urgency::demand()) else {
                continue;
            };
            if arriving.spool_failed_a_read() {
                // Our disk failed under the download: the reader's bytes come from the
                // store, however far the download is.
                let bytes = self
                    .direct
                    .read_from_store(&self.memory, object, own)
                    .await?;
                Metrics::add(&self.metrics.spool_failure_reads, 1);
                return Ok(PartBytes::InMemory {
                    offset: within.start,
                    bytes,
                });
            }
            let streamed = async {
                tokio::select! {
                    biased;
                    ended = download => match ended {
                        Ok(()) => arriving.read(within.clone()).await,
                        Err(error) => Err(error),
                    },
                    read = arriving.read(within.clone()) => read,
                }
            };
            if !worth_a_direct_read(&arriving, &within, part.end - part.start) {
                return streamed.await;
            }
            tokio::select! {
                read = streamed => return read,
                // A failed or refused direct read leaves the reader to the download.
                Some(Ok(bytes)) = self.direct.direct_read(&self.memory, object, own) => {
                    return Ok(PartBytes::InMemory { offset: within.start, bytes });
                }
            }
        }
    }

    /// Bytes `within` of the part, if memory holds them: the whole part (one the cache
    /// had no room for), a plan's exact range or an edge covering them.
    pub fn in_memory(&self, key: PartKey, within: &Range<u64>) -> Option<PartBytes> {
        if let Some(bytes) = self.uncached.lock().get(&key) {
            return Some(PartBytes::whole(bytes.clone()));
        }
        let planned = self.planned.covering(key, within);
        if let Some(Covered::Held { offset, bytes }) = planned {
            return Some(PartBytes::InMemory { offset, bytes });
        }
        self.edges.covering(key, within)
    }
}
