//! The read-ahead hint protocol, version 4: how a sampler tells the scdlfs daemon the
//! order in which it will read a dataset.
//!
//! A sampler opens the dataset's hint file (`.scdlfs-hints` in the dataset directory of
//! the mount) for writing and writes lines of ASCII text:
//!
//! ```text
//! scdlfs-hints 2            first line of every handle: protocol and version
//! chunk-rows 1024           (version 2) the chunk size the writer's windows assume
//! plan 3                    start a new plan (here for epoch 3), dropping the old one
//! window 17 4 9             next step: read chunks 17, 4 and 9 (any order inside)
//! rows 1024 1088 5120 5184  next step: read rows [1024, 1088) and [5120, 5184)
//! reading 1                 (version 4) the writer now reads step 1 of its plan
//! rows+ 0 1 7 8             (version 4) the next step begins with rows [0, 1), [7, 8) …
//! rows 9 10                 … and ends with [9, 10): one step of three ranges
//! ```
//!
//! A plan is the ordered list of steps written since the last `plan` line; `window` and
//! `rows` steps may be mixed. A plan belongs to the handle that wrote it and disappears
//! when that handle is closed.
//!
//! Version 2 lets the two ends agree on what a chunk is, which a monolithic dataset does
//! not say by itself: read, the hint file gives the daemon's [`Announcement`] (the
//! greeting and `chunk-rows R`), and a writer that states `chunk-rows` is refused unless
//! it matches. A monolithic dataset's `window` steps name its *virtual chunks*: rows
//! `[c·R, (c+1)·R)`. Version 1 handles are still accepted, without `chunk-rows`.
//!
//! Version 3 adds to the announcement the chunks the daemon holds in its disk cache
//! (`cached S1 E1 …`, chunk ranges), so that a sampler can order the next epoch to read
//! them first ([`Announcement::cached`]). `cached` is a line of the read side only: a
//! writer that sends it is refused.
//!
//! Version 4 lets the writer say which step it is reading (`reading S`, steps counted
//! from 0 at the `plan` line). Otherwise the daemon infers the position from the reads
//! it serves, and a reader whose rows the daemon stored into the page cache ahead of it
//! makes none.
//!
//! Version 4 also lets a step be longer than a line: `window+` and `rows+` lines hold the
//! first chunks or ranges of a step that the next `window` or `rows` line ends. A fetch
//! of 4,096 single rows of a 10^8-row dataset is about 80 KB of text, over the line
//! limit; as several `rows` lines it would be several steps, which the daemon would
//! take for a reader moving on while it still reads the first ones.
//! [`HintLine::window_step`] and [`HintLine::rows_step`] cut a step into lines.
//!
//! The full specification, with the daemon's limits and error behaviour, is
//! `docs/hint-protocol.md`; this module is its only implementation.

use std::fmt;
use std::ops::Range;

/// The protocol version this module writes and announces.
pub const VERSION: u32 = 4;
/// The versions a reader of the protocol accepts in a greeting.
pub const SUPPORTED_VERSIONS: [u32; 4] = [1, 2, 3, 4];
/// The first word of the greeting line.
pub const GREETING: &str = "scdlfs-hints";
/// The file name of a dataset's hint file.
pub const HINT_FILE: &str = ".scdlfs-hints";
/// A longer line is refused rather than buffered.
pub const MAX_LINE_LEN: usize = 64 * 1024;

/// One line of the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HintLine {
    Greeting {
        version: u32,
    },
    /// (Version 2) Rows per chunk: what `window` steps mean.
    ChunkRows {
        rows: u64,
    },
    Plan {
        epoch: u64,
    },
    Window {
        chunks: Vec<u32>,
    },
    /// One step reading several row ranges `[start, end)` together (one fetch).
    Rows {
        ranges: Vec<std::ops::Range<u64>>,
    },
    /// (Version 3, announcement only) Chunk ranges `[start, end)` the daemon holds.
    Cached {
        chunks: Vec<Range<u32>>,
    },
    /// (Version 4) The writer is reading step `step` of its plan (0: the first step
    /// after the `plan` line).
    Reading {
        step: u64,
    },
    /// (Version 4) The first chunks of a window step that the next `window` line ends.
    WindowPart {
        chunks: Vec<u32>,
    },
    /// (Version 4) The first row ranges of a step that the next `rows` line ends.
    RowsPart {
        ranges: Vec<Range<u64>>,
    },
}

/// Why a line was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    #[error("line is not ASCII text")]
    NotText,
    #[error("line longer than {MAX_LINE_LEN} bytes")]
    LineTooLong,
    #[error("unknown keyword {0:?}")]
    UnknownKeyword(String),
    #[error("{keyword}: {reason}")]
    BadArguments {
        keyword: &'static str,
        reason: String,
    },
    #[error("protocol version {0} is not supported (this daemon speaks 1 to {VERSION})")]
    UnsupportedVersion(u32),
    #[error("{keyword} needs protocol version {needs}; this handle greeted with {greeted}")]
    NeedsVersion {
        keyword: &'static str,
        needs: u32,
        greeted: u32,
    },
    #[error("the first line must be \"{GREETING} {VERSION}\"")]
    MissingGreeting,
    #[error("{0} is said by the daemon's announcement, never written to it")]
    AnnouncementOnly(&'static str),
}

impl fmt::Display for HintLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HintLine::Greeting { version } => write!(f, "{GREETING} {version}"),
            HintLine::ChunkRows { rows } => write!(f, "chunk-rows {rows}"),
            HintLine::Plan { epoch } => write!(f, "plan {epoch}"),
            HintLine::Window { chunks } => write_chunks(f, "window", chunks),
            HintLine::WindowPart { chunks } => write_chunks(f, "window+", chunks),
            HintLine::Rows { ranges } => write_ranges(f, "rows", ranges),
            HintLine::RowsPart { ranges } => write_ranges(f, "rows+", ranges),
            HintLine::Cached { chunks } => {
                f.write_str("cached")?;
                for r in chunks {
                    write!(f, " {} {}", r.start, r.end)?;
                }
                Ok(())
            }
            HintLine::Reading { step } => write!(f, "reading {step}"),
        }
    }
}

fn write_chunks(f: &mut fmt::Formatter<'_>, keyword: &str, chunks: &[u32]) -> fmt::Result {
    f.write_str(keyword)?;
    for c in chunks {
        write!(f, " {c}")?;
    }
    Ok(())
}

fn write_ranges(f: &mut fmt::Formatter<'_>, keyword: &str, ranges: &[Range<u64>]) -> fmt::Result {
    f.write_str(keyword)?;
    for r in ranges {
        write!(f, " {} {}", r.start, r.end)?;
    }
    Ok(())
}

/// Bytes of `n` in decimal.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// Cuts a step's items into lines of at most [`MAX_LINE_LEN`] bytes: `part` lines,
/// then one `last` line, `width` giving an item's bytes with its leading space.
fn cut_step<T: Clone>(
    items: &[T],
    width: impl Fn(&T) -> usize,
    part: impl Fn(Vec<T>) -> HintLine,
    last: impl Fn(Vec<T>) -> HintLine,
    keyword_len: usize,
) -> Vec<HintLine> {
    let mut lines = Vec::new();
    let mut line: Vec<T> = Vec::new();
    let mut len = keyword_len;
    for item in items {
        let item_len = width(item);
        if !line.is_empty() && len + item_len > MAX_LINE_LEN {
            lines.push(part(std::mem::take(&mut line)));
            len = keyword_len;
        }
        line.push(item.clone());
        len += item_len;
    }
    lines.push(last(line));
    lines
}

fn numbers<T: std::str::FromStr>(
    keyword: &'static str,
    words: std::str::SplitAsciiWhitespace<'_>,
) -> Result<Vec<T>, HintError> {
    words
        .map(|w| {
            w.parse().map_err(|_| HintError::BadArguments {
                keyword,
                reason: format!("{w:?} is not a non-negative integer in range"),
            })
        })
        .collect()
}

/// The chunk ids of a `window` or `window+` line: at least one.
fn chunk_list(
    keyword: &'static str,
    words: std::str::SplitAsciiWhitespace<'_>,
) -> Result<Vec<u32>, HintError> {
    let chunks = numbers::<u32>(keyword, words)?;
    if chunks.is_empty() {
        return Err(HintError::BadArguments {
            keyword,
            reason: "names no chunk".into(),
        });
    }
    Ok(chunks)
}

/// The row ranges of a `rows` or `rows+` line: pairs of start and end, each start
/// below its end.
fn row_ranges(
    keyword: &'static str,
    words: std::str::SplitAsciiWhitespace<'_>,
) -> Result<Vec<Range<u64>>, HintError> {
    let bounds = numbers::<u64>(keyword, words)?;
    if bounds.is_empty() || bounds.len() % 2 != 0 {
        return Err(HintError::BadArguments {
            keyword,
            reason: "takes pairs of start and end rows".into(),
        });
    }
    let ranges: Vec<_> = bounds.chunks(2).map(|p| p[0]..p[1]).collect();
    if ranges.iter().any(|r| r.start >= r.end) {
        return Err(HintError::BadArguments {
            keyword,
            reason: "each start must be below its end".into(),
        });
    }
    Ok(ranges)
}

impl HintLine {
    /// The lines that announce a window step of `chunks` (not empty): one `window`
    /// line, or, for more chunks than a line holds, `window+` lines before it.
    pub fn window_step(chunks: &[u32]) -> Vec<HintLine> {
        cut_step(
            chunks,
            |&c| 1 + digits(c as u64),
            |chunks| HintLine::WindowPart { chunks },
            |chunks| HintLine::Window { chunks },
            "window+".len(),
        )
    }

    /// The lines that announce a step of the row ranges `ranges` (not empty): one
    /// `rows` line, or, for more ranges than a line holds, `rows+` lines before it.
    pub fn rows_step(ranges: &[Range<u64>]) -> Vec<HintLine> {
        cut_step(
            ranges,
            |r| 2 + digits(r.start) + digits(r.end),
            |ranges| HintLine::RowsPart { ranges },
            |ranges| HintLine::Rows { ranges },
            "rows+".len(),
        )
    }

    /// Parses one line (without its newline). Blank lines are not lines: the caller
    /// skips them.
    pub fn parse(line: &[u8]) -> Result<HintLine, HintError> {
        if line.len() > MAX_LINE_LEN {
            return Err(HintError::LineTooLong);
        }
        let text = std::str::from_utf8(line)
            .ok()
            .filter(|t| t.is_ascii())
            .ok_or(HintError::NotText)?;
        let mut words = text.split_ascii_whitespace();
        let keyword = words.next().unwrap_or("");
        match keyword {
            GREETING => match numbers::<u32>("greeting", words)?.as_slice() {
                [version] => Ok(HintLine::Greeting { version: *version }),
                _ => Err(HintError::BadArguments {
                    keyword: "greeting",
                    reason: "takes one version number".into(),
                }),
            },
            "chunk-rows" => match numbers::<u64>("chunk-rows", words)?.as_slice() {
                [rows] if *rows > 0 => Ok(HintLine::ChunkRows { rows: *rows }),
                _ => Err(HintError::BadArguments {
                    keyword: "chunk-rows",
                    reason: "takes one positive row count".into(),
                }),
            },
            "plan" => match numbers::<u64>("plan", words)?.as_slice() {
                [epoch] => Ok(HintLine::Plan { epoch: *epoch }),
                _ => Err(HintError::BadArguments {
                    keyword: "plan",
                    reason: "takes one epoch number".into(),
                }),
            },
            "window" => Ok(HintLine::Window {
                chunks: chunk_list("window", words)?,
            }),
            "window+" => Ok(HintLine::WindowPart {
                chunks: chunk_list("window+", words)?,
            }),
            "rows" => Ok(HintLine::Rows {
                ranges: row_ranges("rows", words)?,
            }),
            "rows+" => Ok(HintLine::RowsPart {
                ranges: row_ranges("rows+", words)?,
            }),
            "reading" => match numbers::<u64>("reading", words)?.as_slice() {
                [step] => Ok(HintLine::Reading { step: *step }),
                _ => Err(HintError::BadArguments {
                    keyword: "reading",
                    reason: "takes one step number".into(),
                }),
            },
            "cached" => {
                let bounds = numbers::<u32>("cached", words)?;
                if bounds.is_empty() || bounds.len() % 2 != 0 {
                    return Err(HintError::BadArguments {
                        keyword: "cached",
                        reason: "takes pairs of start and end chunks".into(),
                    });
                }
                let chunks: Vec<_> = bounds.chunks(2).map(|p| p[0]..p[1]).collect();
                if chunks.iter().any(|r| r.start >= r.end) {
                    return Err(HintError::BadArguments {
                        keyword: "cached",
                        reason: "each start must be below its end".into(),
                    });
                }
                Ok(HintLine::Cached { chunks })
            }
            other => Err(HintError::UnknownKeyword(
                other.chars().take(32).collect::<String>(),
            )),
        }
    }
}

/// Chunk ranges per `cached` line of an announcement: at most 22 bytes each, so a line
/// stays far below [`MAX_LINE_LEN`].
const CACHED_RANGES_PER_LINE: usize = 512;

/// What the daemon gives a reader of a dataset's hint file: the protocol version it
/// speaks, the dataset's rows per chunk (virtual chunks for a monolithic dataset) and,
/// from version 3, the chunks its disk cache holds, as protocol lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    pub version: u32,
    pub chunk_rows: u64,
    /// (Version 3) The chunks wholly in the daemon's disk cache when the hint handle
    /// was first read, as sorted, disjoint, non-adjacent ranges; `None` from a daemon
    /// that does not say (version 1 or 2).
    pub cached: Option<Vec<Range<u32>>>,
}

impl Announcement {
    /// The current version's announcement: `chunk_rows` per chunk, and the chunks in
    /// `cached` (any order, overlaps allowed) held.
    pub fn new(chunk_rows: u64, cached: impl IntoIterator<Item = Range<u32>>) -> Announcement {
        Announcement {
            version: VERSION,
            chunk_rows,
            cached: Some(merged(cached)),
        }
    }

    /// Whether the daemon said it holds chunk `chunk` (`false` when it did not say).
    pub fn holds(&self, chunk: u32) -> bool {
        self.cached.as_deref().is_some_and(|ranges| {
            let after = ranges.partition_point(|r| r.end <= chunk);
            ranges.get(after).is_some_and(|r| r.contains(&chunk))
        })
    }

    /// Parses an announcement as a reader of the hint file gets it; `None` if `text`
    /// is not one (another version, lines out of place, a malformed line).
    pub fn parse(text: &[u8]) -> Option<Announcement> {
        let mut lines = text
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .map(HintLine::parse);
        let (Some(Ok(HintLine::Greeting { version })), Some(Ok(HintLine::ChunkRows { rows }))) =
            (lines.next(), lines.next())
        else {
            return None;
        };
        if !SUPPORTED_VERSIONS.contains(&version) {
            return None;
        }
        let mut cached = (version >= 3).then(Vec::new);
        for line in lines {
            match (line.ok()?, cached.as_mut()) {
                (HintLine::Cached { chunks }, Some(all)) => all.extend(chunks),
                _ => return None,
            }
        }
        Some(Announcement {
            version,
            chunk_rows: rows,
            cached: cached.map(merged),
        })
    }
}

impl fmt::Display for Announcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = self.version;
        writeln!(f, "{}", HintLine::Greeting { version })?;
        writeln!(
            f,
            "{}",
            HintLine::ChunkRows {
                rows: self.chunk_rows
            }
        )?;
        for ranges in self
            .cached
            .as_deref()
            .unwrap_or_default()
            .chunks(CACHED_RANGES_PER_LINE)
        {
            let chunks = ranges.to_vec();
            writeln!(f, "{}", HintLine::Cached { chunks })?;
        }
        Ok(())
    }
}

/// Ranges sorted, with overlapping and adjacent ones joined; empty ones dropped.
fn merged(ranges: impl IntoIterator<Item = Range<u32>>) -> Vec<Range<u32>> {
    let mut ranges: Vec<_> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
    ranges.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<u32>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Splits a byte stream, written in pieces of any size, into lines, and enforces the
/// greeting and the version's vocabulary. One decoder serves one open handle.
#[derive(Clone, Debug, Default)]
pub struct HintDecoder {
    partial: Vec<u8>,
    /// The version the handle greeted with; `None` before the greeting.
    greeted: Option<u32>,
}

impl HintDecoder {
    /// Decodes one written piece. On success returns the complete lines it finished
    /// (a trailing incomplete line is kept for the next piece). On error nothing of the
    /// piece is kept, so a refused write leaves the decoder as it was before it.
    pub fn feed(&mut self, piece: &[u8]) -> Result<Vec<HintLine>, HintError> {
        let mut greeted = self.greeted;
        let mut lines = Vec::new();
        let mut pending: &[u8] = &self.partial;
        let mut rest = piece;
        let mut joined;
        while let Some(newline) = rest.iter().position(|&b| b == b'\n') {
            let line: &[u8] = if pending.is_empty() {
                &rest[..newline]
            } else {
                joined = pending.to_vec();
                joined.extend_from_slice(&rest[..newline]);
                &joined
            };
            pending = &[];
            rest = &rest[newline + 1..];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = HintLine::parse(line)?;
            match (&parsed, greeted) {
                (HintLine::Greeting { version }, _) if !SUPPORTED_VERSIONS.contains(version) => {
                    return Err(HintError::UnsupportedVersion(*version));
                }
                (HintLine::Greeting { version }, _) => greeted = Some(*version),
                (_, None) => return Err(HintError::MissingGreeting),
                (HintLine::Cached { .. }, Some(_)) => {
                    return Err(HintError::AnnouncementOnly("cached"));
                }
                (HintLine::ChunkRows { .. }, Some(version)) if version < 2 => {
                    return Err(HintError::NeedsVersion {
                        keyword: "chunk-rows",
                        needs: 2,
                        greeted: version,
                    });
                }
                (HintLine::Reading { .. }, Some(version)) if version < 4 => {
                    return Err(HintError::NeedsVersion {
                        keyword: "reading",
                        needs: 4,
                        greeted: version,
                    });
                }
                (HintLine::WindowPart { .. }, Some(version)) if version < 4 => {
                    return Err(HintError::NeedsVersion {
                        keyword: "window+",
                        needs: 4,
                        greeted: version,
                    });
                }
                (HintLine::RowsPart { .. }, Some(version)) if version < 4 => {
                    return Err(HintError::NeedsVersion {
                        keyword: "rows+",
                        needs: 4,
                        greeted: version,
                    });
                }
                _ => {}
            }
            lines.push(parsed);
        }
        let new_partial_len = pending.len() + rest.len();
        if new_partial_len > MAX_LINE_LEN {
            return Err(HintError::LineTooLong);
        }
        if !rest.is_empty() && (!rest.is_ascii() || rest.contains(&0)) {
            return Err(HintError::NotText);
        }
        let mut partial = pending.to_vec();
        partial.extend_from_slice(rest);
        self.partial = partial;
        self.greeted = greeted;
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn greeting() -> String {
        format!("{GREETING} {VERSION}\n")
    }

    #[test]
    fn lines_round_trip_through_display() {
        for line in [
            HintLine::Greeting { version: 1 },
            HintLine::ChunkRows { rows: 4096 },
            HintLine::Plan { epoch: 9 },
            HintLine::Window {
                chunks: vec![3, 0, 12],
            },
            HintLine::Rows {
                ranges: vec![5..70, 100..101],
            },
            HintLine::Cached {
                chunks: vec![0..2, 5..6],
            },
            HintLine::Reading { step: 17 },
            HintLine::WindowPart { chunks: vec![8, 1] },
            HintLine::RowsPart {
                ranges: vec![0..1, 9..12],
            },
        ] {
            assert_eq!(HintLine::parse(line.to_string().as_bytes()), Ok(line));
        }
    }

    #[test]
    fn a_line_split_across_writes_is_joined() {
        let mut d = HintDecoder::default();
        assert_eq!(d.feed(greeting().as_bytes()).unwrap().len(), 1);
        assert_eq!(d.feed(b"window 1 ").unwrap(), vec![]);
        assert_eq!(
            d.feed(b"2\nrows 0 ").unwrap(),
            vec![HintLine::Window { chunks: vec![1, 2] }]
        );
        assert_eq!(
            d.feed(b"4\n").unwrap(),
            vec![HintLine::Rows {
                ranges: std::iter::once(0..4).collect()
            }]
        );
    }

    #[test]
    fn steps_before_the_greeting_are_refused() {
        let mut d = HintDecoder::default();
        assert_eq!(d.feed(b"window 1\n"), Err(HintError::MissingGreeting));
        assert_eq!(
            d.feed(b"scdlfs-hints 5\n"),
            Err(HintError::UnsupportedVersion(5))
        );
    }

    /// Golden streams: the bytes a writer of each version sends decode to exactly these
    /// lines, forever. A version 1 writer (released samplers) keeps working.
    #[test]
    fn golden_streams_of_every_version_decode() {
        let v1 = b"scdlfs-hints 1\nplan 0\nwindow 3 1\nrows 10 20 40 41\n";
        assert_eq!(
            HintDecoder::default().feed(v1).unwrap(),
            vec![
                HintLine::Greeting { version: 1 },
                HintLine::Plan { epoch: 0 },
                HintLine::Window { chunks: vec![3, 1] },
                HintLine::Rows {
                    ranges: vec![10..20, 40..41]
                },
            ]
        );
        let v2 = b"scdlfs-hints 2\nchunk-rows 1024\nplan 7\nwindow 0\n";
        assert_eq!(
            HintDecoder::default().feed(v2).unwrap(),
            vec![
                HintLine::Greeting { version: 2 },
                HintLine::ChunkRows { rows: 1024 },
                HintLine::Plan { epoch: 7 },
                HintLine::Window { chunks: vec![0] },
            ]
        );
        let v3 = b"scdlfs-hints 3\nchunk-rows 64\nplan 1\nrows 0 64\n";
        assert_eq!(
            HintDecoder::default().feed(v3).unwrap(),
            vec![
                HintLine::Greeting { version: 3 },
                HintLine::ChunkRows { rows: 64 },
                HintLine::Plan { epoch: 1 },
                HintLine::Rows {
                    ranges: std::iter::once(0..64).collect()
                },
            ]
        );
        let v4 = b"scdlfs-hints 4\nchunk-rows 64\nplan 2\nrows 0 64\nrows 128 192\nreading 1\nrows+ 0 1 7 8\nrows 9 10\nwindow+ 3\nwindow 0\n";
        assert_eq!(
            HintDecoder::default().feed(v4).unwrap(),
            vec![
                HintLine::Greeting { version: 4 },
                HintLine::ChunkRows { rows: 64 },
                HintLine::Plan { epoch: 2 },
                HintLine::Rows {
                    ranges: std::iter::once(0..64).collect()
                },
                HintLine::Rows {
                    ranges: std::iter::once(128..192).collect()
                },
                HintLine::Reading { step: 1 },
                HintLine::RowsPart {
                    ranges: vec![0..1, 7..8]
                },
                HintLine::Rows {
                    ranges: std::iter::once(9..10).collect()
                },
                HintLine::WindowPart { chunks: vec![3] },
                HintLine::Window { chunks: vec![0] },
            ]
        );
        for (greeting, part) in [
            (&b"scdlfs-hints 3\n"[..], &b"rows+ 0 1\n"[..]),
            (b"scdlfs-hints 2\n", b"window+ 0\n"),
        ] {
            let mut decoder = HintDecoder::default();
            decoder.feed(greeting).unwrap();
            assert!(
                matches!(
                    decoder.feed(part),
                    Err(HintError::NeedsVersion { needs: 4, .. })
                ),
                "{part:?}"
            );
        }
        assert_eq!(
            HintDecoder::default().feed(b"scdlfs-hints 3\nplan 0\nreading 0\n"),
            Err(HintError::NeedsVersion {
                keyword: "reading",
                needs: 4,
                greeted: 3
            })
        );
        assert_eq!(
            HintDecoder::default().feed(b"scdlfs-hints 1\nchunk-rows 1024\n"),
            Err(HintError::NeedsVersion {
                keyword: "chunk-rows",
                needs: 2,
                greeted: 1
            })
        );
    }

    /// The announcement's bytes, forever: a change to them needs a new version.
    #[test]
    fn the_announcement_is_golden_and_parses_back() {
        let held = Announcement::new(4096, [7..9, 0..3, 2..4, 9..10, 12..13]);
        assert_eq!(
            held.to_string(),
            "scdlfs-hints 4\nchunk-rows 4096\ncached 0 4 7 10 12 13\n"
        );
        assert_eq!(Announcement::parse(held.to_string().as_bytes()), Some(held));
        let none_held = Announcement::new(4096, []);
        assert_eq!(none_held.to_string(), "scdlfs-hints 4\nchunk-rows 4096\n");
        // A version 3 daemon's announcement says the same with its own version.
        let v3 = Announcement::parse(b"scdlfs-hints 3\nchunk-rows 4096\ncached 0 4\n").unwrap();
        assert_eq!((v3.version, v3.holds(3), v3.holds(4)), (3, true, false));
        assert_eq!(none_held.cached, Some(vec![]));
        assert_eq!(
            Announcement::parse(none_held.to_string().as_bytes()),
            Some(none_held)
        );
    }

    /// What daemons of versions 1 and 2 announce still parses, without a cache.
    #[test]
    fn announcements_of_earlier_versions_say_nothing_of_the_cache() {
        for (text, version) in [
            (&b"scdlfs-hints 1\nchunk-rows 8\n"[..], 1),
            (b"scdlfs-hints 2\nchunk-rows 8\n", 2),
        ] {
            let parsed = Announcement::parse(text).unwrap();
            assert_eq!((parsed.version, parsed.chunk_rows), (version, 8));
            assert_eq!(parsed.cached, None);
            assert!(!parsed.holds(0));
        }
        for bad in [
            &b""[..],
            b"scdlfs-hints 3\n",
            b"chunk-rows 8\n",
            b"scdlfs-hints 9\nchunk-rows 8\n",
            b"scdlfs-hints 2\nchunk-rows 8\ncached 0 1\n",
            b"scdlfs-hints 3\nchunk-rows 8\ncached 1 1\n",
            b"scdlfs-hints 3\nchunk-rows 8\nwindow 1\n",
        ] {
            assert_eq!(Announcement::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_long_cached_list_is_cut_into_lines_that_parse_back() {
        let every_other = (0..5000u32).map(|c| 2 * c..2 * c + 1);
        let held = Announcement::new(64, every_other);
        let text = held.to_string();
        assert!(text.lines().all(|l| l.len() < MAX_LINE_LEN));
        assert_eq!(text.lines().filter(|l| l.starts_with("cached")).count(), 10);
        let parsed = Announcement::parse(text.as_bytes()).unwrap();
        assert_eq!(parsed, held);
        assert!(parsed.holds(9998) && !parsed.holds(9999) && !parsed.holds(1));
    }

    #[test]
    fn a_writer_cannot_claim_what_is_cached() {
        let mut d = HintDecoder::default();
        d.feed(greeting().as_bytes()).unwrap();
        assert_eq!(
            d.feed(b"cached 0 4\n"),
            Err(HintError::AnnouncementOnly("cached"))
        );
    }

    #[test]
    fn a_refused_write_leaves_the_decoder_unchanged() {
        let mut d = HintDecoder::default();
        d.feed(greeting().as_bytes()).unwrap();
        d.feed(b"window 4").unwrap();
        assert!(d.feed(b" 5\nbogus\n").is_err());
        assert_eq!(
            d.feed(b" 6\n").unwrap(),
            vec![HintLine::Window { chunks: vec![4, 6] }]
        );
    }

    #[test]
    fn malformed_lines_are_refused() {
        for bad in [
            &b"rows 5 5"[..],
            b"rows 1",
            b"rows 1 2 3",
            b"rows 1 2 7 4",
            b"window",
            b"window -1",
            b"window 99999999999",
            b"plan",
            b"chunk-rows 0",
            b"chunk-rows",
            b"chunk-rows 1 2",
            b"cached",
            b"cached 3",
            b"cached 4 2",
            b"launch 1",
            b"\xff\xfe",
        ] {
            assert!(HintLine::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// A fetch of 4,096 single rows of a 10^8-row dataset, about 80 KB as one line,
    /// is announced in lines the decoder takes.
    #[test]
    fn a_step_longer_than_a_line_is_cut_into_lines_that_decode() {
        let ranges: Vec<Range<u64>> = (0..4096u64)
            .map(|i| 99_000_000 + 24_000 * i..99_000_001 + 24_000 * i)
            .collect();
        let lines = HintLine::rows_step(&ranges);
        assert!(lines.len() > 1);
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let mut decoder = HintDecoder::default();
        decoder.feed(greeting().as_bytes()).unwrap();
        assert_eq!(decoder.feed(text.as_bytes()).unwrap(), lines);
    }

    proptest! {
        /// A step's lines hold its items in order, each line within the limit, every
        /// line but the last a part, and as few lines as the limit allows.
        #[test]
        fn a_step_is_cut_into_parts_then_its_last_line(
            ranges in proptest::collection::vec((any::<u64>(), 1u64..1 << 20), 1..12_000),
            chunks in proptest::collection::vec(any::<u32>(), 1..12_000),
        ) {
            let ranges: Vec<Range<u64>> = ranges.into_iter()
                .map(|(start, len)| start.min(u64::MAX - len)..start.min(u64::MAX - len) + len)
                .collect();
            let rows = HintLine::rows_step(&ranges);
            let windows = HintLine::window_step(&chunks);
            for lines in [&rows, &windows] {
                let encoded: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                prop_assert!(encoded.iter().all(|l| l.len() <= MAX_LINE_LEN));
                let total: usize = encoded.iter().map(String::len).sum();
                prop_assert!(lines.len() <= total / (MAX_LINE_LEN - 50) + 1);
                for line in &lines[..lines.len() - 1] {
                    let is_part = matches!(line, HintLine::RowsPart { .. } | HintLine::WindowPart { .. });
                    prop_assert!(is_part, "{:?}", line);
                }
            }
            let joined: Vec<Range<u64>> = rows.iter().flat_map(|l| match l {
                HintLine::Rows { ranges } | HintLine::RowsPart { ranges } => ranges.clone(),
                other => panic!("{other:?}"),
            }).collect();
            prop_assert_eq!(joined, ranges);
            let ends_rows = matches!(rows.last(), Some(HintLine::Rows { .. }));
            prop_assert!(ends_rows);
            let joined: Vec<u32> = windows.iter().flat_map(|l| match l {
                HintLine::Window { chunks } | HintLine::WindowPart { chunks } => chunks.clone(),
                other => panic!("{other:?}"),
            }).collect();
            prop_assert_eq!(joined, chunks);
            let ends_window = matches!(windows.last(), Some(HintLine::Window { .. }));
            prop_assert!(ends_window);
        }

        /// Arbitrary bytes, cut into arbitrary pieces, never panic the decoder, and
        /// every line it yields re-encodes to something it parses to the same value.
        #[test]
        fn arbitrary_bytes_never_panic(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..8),
        ) {
            let mut d = HintDecoder::default();
            let _ = d.feed(greeting().as_bytes());
            for piece in pieces {
                if let Ok(lines) = d.feed(&piece) {
                    for line in lines {
                        prop_assert_eq!(HintLine::parse(line.to_string().as_bytes()), Ok(line));
                    }
                }
            }
        }

        #[test]
        fn valid_text_split_anywhere_decodes_the_same(
            steps in proptest::collection::vec((0u64..1000, 1u64..50), 1..20),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut text = greeting();
            let mut expected = vec![HintLine::Greeting { version: VERSION }];
            for (start, len) in steps {
                let line = HintLine::Rows { ranges: std::iter::once(start..start + len).collect() };
                text.push_str(&format!("{line}\n"));
                expected.push(line);
            }
            let cut = cut.index(text.len());
            let mut d = HintDecoder::default();
            let mut got = d.feed(&text.as_bytes()[..cut]).unwrap();
            got.extend(d.feed(&text.as_bytes()[cut..]).unwrap());
            prop_assert_eq!(got, expected);
        }
    }
}
