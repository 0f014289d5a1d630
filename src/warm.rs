//! Warming: the daemon side of `scdlfs warm`, which fetches named parts of a dataset
//! into the cache of the running mount before a job reads them.
//!
//! The channel is the dataset directory's extended attribute [`WARM_XATTR`], as the
//! status is the root's: no socket to find or secure, no entry in the tree, and the
//! kernel lets only those who may write the directory (its owner, root) start a job.
//! Setting it to a [`WarmRequest`] starts or stops the dataset's one warm job; reading
//! it gives the job's [`WarmProgress`] as JSON. A job whose progress nobody has read
//! for [`LEASE`] stops by itself: its client was killed.
//!
//! A job fetches through the fetcher at prefetch priority (a reader's demand goes
//! first), at most half the download slots at once, and only what the cache can keep:
//! the selection's parts, in order, while they fit nine tenths of the budget (the rest
//! is room for part-file headers and for the reads under way) and the chunk budget.
//! Parts beyond are not fetched and are reported as over the budget, so warming never
//! evicts what it warmed itself. Parts already cached are counted, not fetched, and
//! made the most recently used.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use scdl_format::ArrayKind;
use serde::{Deserialize, Serialize};

use crate::cache::{DiskCache, Recency};
use crate::catalog::monolithic::CorruptRowOffsets;
use crate::catalog::Dataset;
use crate::error::{FsError, FsResult};
use crate::fetch::Fetcher;
use crate::object::ObjectInfo;

/// The extended attribute of a dataset directory that starts, stops and reports warming.
pub const WARM_XATTR: &str = "user.scdlfs.warm";

/// A job stops once nobody has read its progress for this long.
pub const LEASE: Duration = Duration::from_secs(30);

/// After this many failed parts a job gives up: the store is not answering.
const MAX_FAILED_PARTS: u64 = 8;

/// What to warm, in the dataset's rows: half-open ranges, clamped to the dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Chunks `[start, end)`: a monolithic dataset's virtual chunks (the hint file's
    /// `chunk-rows`).
    Chunks(Range<u64>),
    /// Rows `[start, end)`; a chunked dataset warms the whole chunks holding them.
    Rows(Range<u64>),
    All,
}

/// What a client writes to [`WARM_XATTR`]: one line of ASCII words.
///
/// ```text
/// start TOKEN chunks START END
/// start TOKEN rows START END
/// start TOKEN all
/// stop TOKEN
/// ```
///
/// The token is the client's name for its job: progress carries it, so a client can
/// tell its job from a later one, and `stop` stops only the job it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WarmRequest {
    Start { token: String, selection: Selection },
    Stop { token: String },
}

impl WarmRequest {
    pub fn parse(bytes: &[u8]) -> Result<WarmRequest, BadWarmRequest> {
        let text = std::str::from_utf8(bytes)?;
        let words: Vec<&str> = text.split_ascii_whitespace().collect();
        let number = |word: &str| {
            word.parse::<u64>()
                .map_err(|source| BadWarmRequest::NotANumber {
                    word: word.to_owned(),
                    source,
                })
        };
        match words.as_slice() {
            ["stop", token] => Ok(WarmRequest::Stop {
                token: token.to_string(),
            }),
            ["start", token, "all"] => Ok(WarmRequest::Start {
                token: token.to_string(),
                selection: Selection::All,
            }),
            ["start", token, what @ ("chunks" | "rows"), start, end] => {
                let range = number(start)?..number(end)?;
                Ok(WarmRequest::Start {
                    token: token.to_string(),
                    selection: if *what == "chunks" {
                        Selection::Chunks(range)
                    } else {
                        Selection::Rows(range)
                    },
                })
            }
            _ => Err(BadWarmRequest::Unknown(text.to_owned())),
        }
    }

    pub fn encode(&self) -> String {
        match self {
            WarmRequest::Stop { token } => format!("stop {token}"),
            WarmRequest::Start { token, selection } => match selection {
                Selection::All => format!("start {token} all"),
                Selection::Chunks(r) => format!("start {token} chunks {} {}", r.start, r.end),
                Selection::Rows(r) => format!("start {token} rows {} {}", r.start, r.end),
            },
        }
    }
}

/// Why bytes written to [`WARM_XATTR`] are not a [`WarmRequest`].
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadWarmRequest {
    #[error("not text")]
    NotText(#[from] std::str::Utf8Error),
    #[error("{word:?} is not a non-negative integer")]
    NotANumber {
        word: String,
        source: std::num::ParseIntError,
    },
    #[error("not a warm request: {0:?}")]
    Unknown(String),
}

/// Why a warm job failed.
#[derive(Debug, thiserror::Error)]
enum WarmFailure {
    #[error(
        "the selection names no {what}: the dataset has {chunks} chunks of {chunk_rows} rows, {rows} rows"
    )]
    EmptySelection {
        what: &'static str,
        chunks: u64,
        chunk_rows: u64,
        rows: u64,
    },
    #[error(transparent)]
    Read(#[from] FsError),
    #[error(transparent)]
    RowOffsets(#[from] CorruptRowOffsets),
}

/// Where a job is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmState {
    /// Waiting for the earlier mount's parts to be adopted, and finding the parts.
    #[default]
    Resolving,
    Running,
    /// Every part within the budget was looked at.
    Done,
    /// Stopped before the end: asked to, or its client went away.
    Stopped,
    /// The selection could not be resolved, or the store kept failing.
    Failed,
}

impl WarmState {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            WarmState::Done | WarmState::Stopped | WarmState::Failed
        )
    }
}

/// A job's figures, as [`WARM_XATTR`] reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmProgress {
    pub token: String,
    pub state: WarmState,
    /// The parts of the selection that fit the budget: what the job brings in.
    pub parts_total: u64,
    pub bytes_total: u64,
    /// Parts found in the cache: counted, not fetched.
    pub parts_already_cached: u64,
    pub bytes_already_cached: u64,
    pub parts_fetched: u64,
    pub bytes_fetched: u64,
    /// Parts of the selection left out because they do not fit the budget.
    pub parts_over_budget: u64,
    pub bytes_over_budget: u64,
    /// Parts fetched that the cache could not keep (pinned data filled it).
    pub parts_not_kept: u64,
    pub parts_failed: u64,
    pub budget_bytes: u64,
    /// Why the job stopped or failed, or its first error.
    pub message: Option<String>,
}

impl WarmProgress {
    /// Bytes of the selection within the budget that are in the cache now.
    pub fn bytes_done(&self) -> u64 {
        self.bytes_already_cached + self.bytes_fetched
    }
}

struct Job {
    progress: Mutex<WarmProgress>,
    stop: AtomicBool,
    last_read: Mutex<Instant>,
}

impl Job {
    /// Whether to start no more parts; notes why the first time it says so.
    fn should_stop(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return true;
        }
        if self.last_read.lock().elapsed() >= LEASE {
            self.stop_because(format!(
                "nobody read the progress for {} s: the client is gone",
                LEASE.as_secs()
            ));
            return true;
        }
        false
    }

    fn stop_because(&self, reason: String) {
        if !self.stop.swap(true, Ordering::Relaxed) {
            self.progress.lock().message.get_or_insert(reason);
        }
    }

    fn update(&self, change: impl FnOnce(&mut WarmProgress)) {
        change(&mut self.progress.lock());
    }
}

/// The warm jobs of a mount, at most one per dataset.
pub struct Warmer {
    fetcher: Arc<Fetcher>,
    cache: Arc<DiskCache>,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    /// Jobs are started from FUSE threads, outside the runtime.
    runtime: tokio::runtime::Handle,
}

impl Warmer {
    /// Must be called within the runtime that will run the jobs.
    pub fn new(fetcher: Arc<Fetcher>, cache: Arc<DiskCache>) -> Arc<Warmer> {
        Arc::new(Warmer {
            fetcher,
            cache,
            jobs: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// Applies a request written to `dataset`'s [`WARM_XATTR`].
    pub fn request(&self, dataset: &Dataset, bytes: &[u8]) -> FsResult<()> {
        let request = WarmRequest::parse(bytes).map_err(|reason| {
            tracing::warn!(dataset = %dataset.prefix(), %reason, "warm request refused with EINVAL");
            FsError::InvalidRequest(reason.to_string())
        })?;
        let mut jobs = self.jobs.lock();
        let key = dataset.prefix().to_string();
        let current = jobs.get(&key);
        match request {
            WarmRequest::Stop { token } => {
                if let Some(job) = current.filter(|job| job.progress.lock().token == token) {
                    job.stop_because("interrupted".into());
                }
                Ok(())
            }
            WarmRequest::Start { token, selection } => {
                if current.is_some_and(|job| !job.progress.lock().state.is_final()) {
                    return Err(FsError::Busy(format!(
                        "{} is being warmed already",
                        dataset.prefix()
                    )));
                }
                let job = Arc::new(Job {
                    progress: Mutex::new(WarmProgress {
                        token,
                        budget_bytes: self.cache.stats().budget_bytes,
                        ..WarmProgress::default()
                    }),
                    stop: AtomicBool::new(false),
                    last_read: Mutex::new(Instant::now()),
                });
                jobs.insert(key, job.clone());
                tracing::info!(dataset = %dataset.prefix(), ?selection, "warming");
                let (fetcher, cache) = (self.fetcher.clone(), self.cache.clone());
                let dataset = dataset.clone();
                self.runtime.spawn(async move {
                    let outcome = warm(&job, &fetcher, &cache, &dataset, &selection).await;
                    let progress = {
                        let mut progress = job.progress.lock();
                        progress.state = match outcome {
                            Err(reason) => {
                                progress.message = Some(reason.to_string());
                                WarmState::Failed
                            }
                            Ok(()) if job.stop.load(Ordering::Relaxed) => WarmState::Stopped,
                            Ok(()) => WarmState::Done,
                        };
                        progress.clone()
                    };
                    tracing::info!(dataset = %dataset.prefix(), ?progress, "warming ended");
                });
                Ok(())
            }
        }
    }

    /// The progress of `dataset`'s job, as JSON; reading it renews the job's lease.
    pub fn progress(&self, dataset: &Dataset) -> FsResult<Vec<u8>> {
        let job = self
            .jobs
            .lock()
            .get(&dataset.prefix().to_string())
            .cloned()
            .ok_or(FsError::NoSuchAttribute)?;
        *job.last_read.lock() = Instant::now();
        let progress = job.progress.lock().clone();
        Ok(serde_json::to_vec(&progress).expect("progress serializes"))
    }
}

/// One job, from resolving its selection to its last part.
async fn warm(
    job: &Job,
    fetcher: &Arc<Fetcher>,
    cache: &Arc<DiskCache>,
    dataset: &Dataset,
    selection: &Selection,
) -> Result<(), WarmFailure> {
    // Parts of an earlier mount count as cached only once adopted.
    while !cache.stats().adoption_done {
        if job.should_stop() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ranges = byte_ranges(fetcher, dataset, selection).await?;
    let mut seen = HashSet::new();
    let parts: Vec<(Arc<ObjectInfo>, u64)> = ranges
        .into_iter()
        .flat_map(|(object, range)| fetcher.parts_of(&range).map(move |i| (object.clone(), i)))
        .filter(|(object, index)| seen.insert(Fetcher::key(object, *index)))
        .collect();
    let budget = cache.stats().budget_bytes;
    let room = budget - budget / 10;
    let max_groups = cache.max_groups();
    let (mut kept, mut kept_bytes, mut groups) = (Vec::new(), 0u64, HashSet::new());
    let (mut over_parts, mut over_bytes) = (0u64, 0u64);
    for (object, index) in parts {
        let len = range_len(&fetcher.part_range(&object, index));
        let new_group = object.group.filter(|g| !groups.contains(g));
        let fits = over_parts == 0
            && kept_bytes + len <= room
            && !(new_group.is_some() && max_groups.is_some_and(|max| groups.len() >= max));
        if fits {
            kept_bytes += len;
            groups.extend(new_group);
            kept.push((object, index));
        } else {
            over_parts += 1;
            over_bytes += len;
        }
    }
    job.update(|p| {
        p.state = WarmState::Running;
        p.parts_total = kept.len() as u64;
        p.bytes_total = kept_bytes;
        p.parts_over_budget = over_parts;
        p.bytes_over_budget = over_bytes;
        if over_parts > 0 {
            p.message = Some(format!(
                "the selection does not fit the cache budget: warming its first {} parts, leaving out {} more",
                kept.len(),
                over_parts
            ));
        }
    });
    let slots = (fetcher.max_concurrent_requests() / 2).max(1);
    futures::stream::iter(kept)
        .take_while(|_| std::future::ready(!job.should_stop()))
        .map(|(object, index)| warm_part(job, fetcher, cache, object, index))
        .buffer_unordered(slots)
        .for_each(|()| async {})
        .await;
    Ok(())
}

/// Brings one part in (or finds it there) and counts it.
async fn warm_part(
    job: &Job,
    fetcher: &Arc<Fetcher>,
    cache: &Arc<DiskCache>,
    object: Arc<ObjectInfo>,
    index: u64,
) {
    let key = Fetcher::key(&object, index);
    let len = range_len(&fetcher.part_range(&object, index));
    // Reading it pins it, which makes it the most recently used: what this job warms
    // later does not evict it.
    if cache.get(key, Recency::Use).is_some() {
        job.update(|p| {
            p.parts_already_cached += 1;
            p.bytes_already_cached += len;
        });
        return;
    }
    match fetcher.fetch_in_background(&object, index).await {
        Ok(()) if cache.contains(key) => job.update(|p| {
            p.parts_fetched += 1;
            p.bytes_fetched += len;
        }),
        Ok(()) => job.update(|p| p.parts_not_kept += 1),
        Err(error) => {
            tracing::warn!(key = %object.key, part = index, %error, "warming a part failed");
            let failed = {
                let mut p = job.progress.lock();
                p.parts_failed += 1;
                p.message.get_or_insert_with(|| error.to_string());
                p.parts_failed
            };
            if failed >= MAX_FAILED_PARTS {
                job.stop_because(format!("{failed} parts failed; giving up"));
            }
        }
    }
}

fn range_len(range: &Range<u64>) -> u64 {
    range.end - range.start
}

fn clamp(range: &Range<u64>, end: u64) -> Range<u64> {
    range.start.min(end)..range.end.min(end)
}

/// `range` clamped to `end`, then converted (rows to chunks, or back), unless the clamp
/// leaves it empty: an empty selection stays empty.
fn clamp_and_convert(
    range: &Range<u64>,
    end: u64,
    convert: impl FnOnce(Range<u64>) -> Range<u64>,
) -> Range<u64> {
    let clamped = clamp(range, end);
    if clamped.is_empty() {
        0..0
    } else {
        convert(clamped)
    }
}

/// The byte ranges of objects a selection names, in the dataset's order.
async fn byte_ranges(
    fetcher: &Arc<Fetcher>,
    dataset: &Dataset,
    selection: &Selection,
) -> Result<Vec<(Arc<ObjectInfo>, Range<u64>)>, WarmFailure> {
    let geometry = dataset.geometry();
    let (chunks, rows) = (geometry.num_chunks(), geometry.total_rows);
    let empty = |what| WarmFailure::EmptySelection {
        what,
        chunks,
        chunk_rows: geometry.chunk_size,
        rows,
    };
    match dataset {
        Dataset::Chunked(flat) => {
            let chunk_range = match selection {
                Selection::All => 0..chunks,
                Selection::Chunks(c) => clamp(c, chunks),
                Selection::Rows(r) => clamp_and_convert(r, rows, |r| {
                    let c = flat.layout.chunks_of_rows(r);
                    c.start as u64..c.end as u64
                }),
            };
            if chunk_range.is_empty() {
                return Err(empty("chunks"));
            }
            Ok(chunk_range
                .flat_map(|chunk| {
                    ArrayKind::ALL.map(|kind| {
                        let object = flat.array(chunk as usize, kind).clone();
                        let size = object.size;
                        (object, 0..size)
                    })
                })
                .collect())
        }
        Dataset::Monolithic(mono) => {
            let rows = match selection {
                Selection::All => {
                    return Ok(mono.arrays.iter().map(|a| (a.clone(), 0..a.size)).collect())
                }
                Selection::Rows(r) => clamp(r, rows),
                Selection::Chunks(c) => clamp_and_convert(c, chunks, |c| {
                    geometry.chunk_rows(c.start).start..geometry.chunk_rows(c.end - 1).end
                }),
            };
            if rows.is_empty() {
                return Err(empty("rows"));
            }
            let row_ptr = mono.array(ArrayKind::RowPtr).clone();
            let dtype = mono.dtypes[ArrayKind::RowPtr.index()];
            let width = mono.width(ArrayKind::RowPtr);
            let mut bounds = [0u64; 2];
            for (bound, row) in bounds.iter_mut().zip([rows.start, rows.end]) {
                let offset = row * width;
                let index = offset / fetcher.part_size();
                let part = fetcher.part(&row_ptr, index).await?;
                let mut bytes = [0u8; 8];
                let bytes = &mut bytes[..width as usize];
                part.copy_to(bytes, offset - index * fetcher.part_size())?;
                *bound = dtype.read_uint(bytes, 0);
            }
            let values = mono
                .value_range(&rows, |row| {
                    Some(if row == rows.start {
                        bounds[0]
                    } else {
                        bounds[1]
                    })
                })
                .expect("both bounds are known")?;
            let mut ranges = vec![(row_ptr, mono.row_ptr_bytes(&rows))];
            for kind in [ArrayKind::Data, ArrayKind::ColPtr] {
                let width = mono.width(kind);
                ranges.push((
                    mono.array(kind).clone(),
                    values.start * width..values.end * width,
                ));
            }
            Ok(ranges)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_back_as_written() {
        for request in [
            WarmRequest::Start {
                token: "12-3".into(),
                selection: Selection::Chunks(2..9),
            },
            WarmRequest::Start {
                token: "t".into(),
                selection: Selection::Rows(0..100),
            },
            WarmRequest::Start {
                token: "t".into(),
                selection: Selection::All,
            },
            WarmRequest::Stop { token: "t".into() },
        ] {
            assert_eq!(WarmRequest::parse(request.encode().as_bytes()), Ok(request));
        }
    }

    #[test]
    fn malformed_requests_are_refused() {
        for bad in [
            &b"start t chunks 1"[..],
            b"start t chunks a b",
            b"start t everything",
            b"stop",
            b"\xff",
            b"",
        ] {
            assert!(WarmRequest::parse(bad).is_err(), "{bad:?}");
        }
    }
}
