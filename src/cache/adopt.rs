//! What a cache directory keeps across mounts, and how a new daemon takes it over.
//!
//! The directory records whose cache it is ([`SourceRecord`]): a daemon of another
//! source, or of another layout version, refuses it rather than serve or delete
//! someone else's data; `--cache-reset` wipes it instead.
//!
//! Part files an earlier daemon left are *strays* until a listed object claims them.
//! At open the directory is only listed and sized ([`scan`]: names and lengths, no file
//! opened), so the budget counts every stray byte from the first second and a cache
//! larger than a new, smaller budget shrinks at once, oldest files first. The headers
//! are then read in the background ([`read_header`]), both on [`IO_THREADS`] threads; an object listed by the catalog
//! claims the strays of its key whose header passes [`judge`]: same ETag (the version
//! the catalog pinned), a part boundary of the current part size, the length that part
//! has. Adopted parts keep the block checksums of their header, so every read of their
//! bytes is checked like that of any other part.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::part_file::{self, PartHeader};
use crate::parts::{span, GroupId, ObjectId};

/// The cache layout this daemon reads: the part-file format plus the source record.
/// Its directory is `scdlfs-cache-v{LAYOUT_VERSION}` under `--cache-dir`.
pub const LAYOUT_VERSION: u32 = part_file::FORMAT_VERSION;

/// The subdirectory of `--cache-dir` this layout owns.
pub fn layout_dir_name() -> String {
    format!("scdlfs-cache-v{LAYOUT_VERSION}")
}

/// The directory of the first layout, from before caches outlived their mount.
pub const FIRST_LAYOUT_DIR: &str = "scdlfs-v1";

/// Whether a directory entry of `--cache-dir` is a cache of some scdlfs layout.
pub fn is_layout_dir_name(name: &str) -> bool {
    name == FIRST_LAYOUT_DIR || name.starts_with("scdlfs-cache-v")
}

/// The file in the layout directory that names the source.
pub const SOURCE_RECORD: &str = "source.json";

/// Whose cache a directory is. Written once, when the directory is created (or reset).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRecord {
    /// The layout version that wrote the directory.
    pub layout_version: u32,
    /// The source as the mount names it (`s3://bucket/prefix`, a folder, a URL).
    pub source: String,
    /// The store's custom endpoint (`--endpoint-url`), if any: the same bucket name at
    /// two endpoints is two stores. Absent from records of mounts without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl SourceRecord {
    pub fn of(source: &str, endpoint: Option<&str>) -> SourceRecord {
        SourceRecord {
            layout_version: LAYOUT_VERSION,
            source: source.to_owned(),
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_owned()),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut text = serde_json::to_vec_pretty(self).expect("plain fields");
        text.push(b'\n');
        text
    }

    pub fn decode(bytes: &[u8]) -> Option<SourceRecord> {
        serde_json::from_slice(bytes).ok()
    }
}

impl std::fmt::Display for SourceRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match &self.endpoint {
            Some(endpoint) => write!(f, "{} at the endpoint {endpoint}", self.source),
            None => write!(f, "{}", self.source),
        }
    }
}

/// A part file found at open, before its header has been read.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub bytes: u64,
    pub modified: SystemTime,
}

/// What [`scan`] found: the part files, oldest first, and the first free file number.
#[derive(Debug, Default)]
pub struct Scan {
    pub parts: Vec<Found>,
    pub next_file: u64,
    /// Files removed: temporaries of writes a crash cut short, and names no daemon writes.
    pub removed: u64,
}

/// How many threads size the part files at open and read their headers after: the
/// work waits on the disk, which serves many requests at once (cold, 10^5 files take
/// seconds on one thread).
pub const IO_THREADS: usize = 8;

/// `f` of every item, in order, on up to [`IO_THREADS`] threads.
pub fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let per_thread = items.len().div_ceil(IO_THREADS).max(1);
    std::thread::scope(|scope| {
        let f = &f;
        let workers: Vec<_> = items
            .chunks(per_thread)
            .map(|chunk| scope.spawn(move || chunk.iter().map(f).collect::<Vec<R>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// Lists `parts_dir` without opening its files: the part files, oldest first. Anything
/// else (a temporary of a write cut short, a foreign name) is removed.
pub fn scan(parts_dir: &Path) -> io::Result<Scan> {
    let paths = fs::read_dir(parts_dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<io::Result<Vec<PathBuf>>>()?;
    let metadata = in_parallel(&paths, |path| fs::symlink_metadata(path));
    let mut scan = Scan::default();
    for (path, meta) in paths.into_iter().zip(metadata) {
        let meta = meta?;
        let number = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".part"))
            .and_then(|n| u64::from_str_radix(n, 16).ok());
        match number {
            Some(number) if meta.is_file() => {
                scan.next_file = scan.next_file.max(number + 1);
                scan.parts.push(Found {
                    path,
                    bytes: meta.len(),
                    modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
            _ => {
                scan.removed += 1;
                match meta.is_dir() {
                    true => fs::remove_dir_all(&path)?,
                    false => fs::remove_file(&path)?,
                }
            }
        }
    }
    scan.parts
        .sort_by(|a, b| (a.modified, &a.path).cmp(&(b.modified, &b.path)));
    Ok(scan)
}

/// Reads and checks the header of a part file: its own checksum, and a file length that
/// is exactly the header plus the data it declares (a file cut short by a power loss
/// is refused here; a flipped data bit is caught by the block checksums on reading).
pub fn read_header(path: &Path) -> Result<(File, PartHeader, u64), String> {
    let mut file = super::private_file()
        .read(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    let file_len = file.metadata().map_err(|e| e.to_string())?.size();
    let mut head = vec![0u8; 4096];
    let got = read_up_to(&mut file, &mut head).map_err(|e| e.to_string())?;
    head.truncate(got);
    let header_len = PartHeader::declared_len(&head).map_err(|e| e.to_string())?;
    if header_len > head.len() {
        let have = head.len();
        head.resize(header_len, 0);
        let got = read_up_to(&mut file, &mut head[have..]).map_err(|e| e.to_string())?;
        head.truncate(have + got);
    }
    let header = PartHeader::decode(&head).map_err(|e| e.to_string())?;
    if file_len != header_len as u64 + header.data_len {
        return Err(format!(
            "file is {file_len} bytes, its header declares {}",
            header_len as u64 + header.data_len
        ));
    }
    Ok((file, header, header_len as u64))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// An object as this mount's catalog listed it: what a stray part must match.
#[derive(Clone, Debug)]
pub struct ListedObject {
    pub id: ObjectId,
    pub key: String,
    pub etag: Option<String>,
    pub size: u64,
    pub group: Option<GroupId>,
}

/// What becomes of a stray part whose header names a listed object.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Part `index` of the object, as it is now.
    Adopt { index: u64 },
    /// Of no use to this mount; the reason is logged.
    Remove(&'static str),
}

/// Decides whether a part file's header describes a part of `object` as listed now,
/// cut at `part_size`.
pub fn judge(header: &PartHeader, object: &ListedObject, part_size: u64) -> Verdict {
    debug_assert_eq!(header.key, object.key);
    match object.etag.as_deref() {
        // Without an ETag, nothing tells the old bytes from the new.
        None | Some("") => return Verdict::Remove("the store gives the object no ETag"),
        Some(etag) if etag != header.etag => return Verdict::Remove("the object changed"),
        Some(_) => {}
    }
    if !header.object_offset.is_multiple_of(part_size) {
        return Verdict::Remove("written with another --read-part-size");
    }
    let index = header.object_offset / part_size;
    let range = span(index, part_size, object.size);
    if range.start >= object.size || range.end - range.start != header.data_len {
        return Verdict::Remove("written with another --read-part-size");
    }
    Verdict::Adopt { index }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(etag: Option<&str>, size: u64) -> ListedObject {
        ListedObject {
            id: ObjectId(3),
            key: "ds/chunk_00001/data.npy".into(),
            etag: etag.map(str::to_owned),
            size,
            group: Some(GroupId(1)),
        }
    }

    fn header(etag: &str, offset: u64, len: usize) -> PartHeader {
        PartHeader::of("ds/chunk_00001/data.npy", etag, offset, &vec![7; len])
    }

    #[test]
    fn a_part_of_the_same_version_and_cut_is_adopted() {
        let object = listed(Some("\"v1\""), 250);
        assert_eq!(
            judge(&header("\"v1\"", 100, 100), &object, 100),
            Verdict::Adopt { index: 1 }
        );
        assert_eq!(
            judge(&header("\"v1\"", 200, 50), &object, 100),
            Verdict::Adopt { index: 2 },
            "the short last part"
        );
    }

    #[test]
    fn a_changed_object_or_another_cut_is_not_adopted() {
        let object = listed(Some("\"v2\""), 250);
        assert_eq!(
            judge(&header("\"v1\"", 100, 100), &object, 100),
            Verdict::Remove("the object changed")
        );
        let object = listed(Some("\"v1\""), 250);
        for (offset, len) in [(50, 100), (100, 50), (0, 200), (300, 100)] {
            assert!(
                matches!(
                    judge(&header("\"v1\"", offset, len), &object, 100),
                    Verdict::Remove(_)
                ),
                "{offset} {len}"
            );
        }
    }

    #[test]
    fn an_object_without_etag_adopts_nothing() {
        for etag in [None, Some("")] {
            assert!(matches!(
                judge(&header("", 0, 100), &listed(etag, 250), 100),
                Verdict::Remove(_)
            ));
        }
    }

    /// The source record's bytes are a format: a change here must come with a new
    /// [`LAYOUT_VERSION`] or a reader of the old form.
    #[test]
    fn the_source_record_format_is_stable() {
        let golden = b"{\n  \"layout_version\": 2,\n  \"source\": \"s3://bucket/atlas\"\n}\n";
        assert_eq!(SourceRecord::of("s3://bucket/atlas", None).encode(), golden);
        assert_eq!(
            SourceRecord::decode(golden),
            Some(SourceRecord::of("s3://bucket/atlas", None))
        );
        let with_endpoint = b"{\n  \"layout_version\": 2,\n  \"source\": \"s3://bucket/atlas\",\n  \"endpoint\": \"http://127.0.0.1:9000\"\n}\n";
        let record = SourceRecord::of("s3://bucket/atlas", Some("http://127.0.0.1:9000/"));
        assert_eq!(record.encode(), with_endpoint);
        assert_eq!(SourceRecord::decode(with_endpoint), Some(record));
        assert_eq!(layout_dir_name(), "scdlfs-cache-v2");
    }

    #[test]
    fn a_scan_sizes_parts_oldest_first_and_removes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let at = |secs| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        for (name, len, secs) in [
            ("000000000000000a.part", 10, 200),
            ("0000000000000002.part", 20, 100),
        ] {
            let file = File::create(dir.path().join(name)).unwrap();
            file.set_len(len).unwrap();
            file.set_modified(at(secs)).unwrap();
        }
        fs::write(dir.path().join("000000000000000b.part.tmp"), b"torn").unwrap();
        fs::write(dir.path().join("notes"), b"?").unwrap();
        let scan = scan(dir.path()).unwrap();
        let sizes: Vec<_> = scan.parts.iter().map(|f| f.bytes).collect();
        assert_eq!(sizes, [20, 10]);
        assert_eq!((scan.next_file, scan.removed), (11, 2));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
