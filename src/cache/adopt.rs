//! What a cache directory keeps across mounts, and how a new daemon takes it over.
//!
//! The directory records whose cache it is ([`SourceRecord`]): a daemon of another
//! source, or of another layout version, refuses it rather than serve or delete
//! someone else's data; `--cache-reset` wipes it instead.
//!
//! Part files an earlier daemon left are *strays* until a listed object claims them.
//! A part file's name ([`PartFileName`]) says when it was written, which part it holds
//! (a hash of its object's key, ETag and offset) and how long it is, so at open the
//! directory is only listed (`directory::scan`: no file opened, none sized): the budget counts
//! every stray byte from the first second, and a cache larger than a new, smaller
//! budget shrinks at once, oldest files first. The headers are then read in the
//! background ([`read_header`], on [`IO_THREADS`] threads); an object listed by the
//! catalog claims the strays of its key whose header passes [`judge`]: same ETag (the
//! version the catalog pinned), a part boundary of the current part size, the length
//! that part has. A read that comes first finds its own part's file by name and claims
//! it the same way. Adopted parts keep the block checksums of their header, so every
//! read of their bytes is checked like that of any other part.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::part_file::{HeaderError, PartHeader};
use crate::etag::Etag;
use crate::parts::{span, GroupId, ObjectId};

/// The cache layout this daemon reads: the part-file format (version
/// [`super::part_file::FORMAT_VERSION`]), the part files' names ([`PartFileName`]) and the
/// source record. Its directory is `scdlfs-cache-v{LAYOUT_VERSION}` under `--cache-dir`.
/// Version 2 named part files by a number alone, so that only sizing every file told
/// the cache's bytes and only reading every header told which part a file holds.
pub const LAYOUT_VERSION: u32 = 3;

/// The subdirectory of `--cache-dir` this layout owns.
pub fn layout_dir_name() -> String {
    format!("scdlfs-cache-v{LAYOUT_VERSION}")
}

/// The directory of the first layout, from before caches outlived their mount.
pub const FIRST_LAYOUT_DIR: &str = "scdlfs-v1";

/// The directory of the second layout, whose part files' names said nothing of their
/// length or part.
pub const SECOND_LAYOUT_DIR: &str = "scdlfs-cache-v2";

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

/// What a part file's name says: `{seq:016x}-{part:016x}-{len:x}.part`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartFileName {
    /// When the file was written, in the order of this cache directory's writes.
    pub seq: u64,
    /// Which part it holds: [`part_id`] of its object's key, ETag and offset.
    pub part: u64,
    /// The file's length, header included.
    pub len: u64,
}

impl PartFileName {
    /// The name's fields, if it is a name [`PartFileName`]'s `Display` writes (nothing
    /// else is a part file: not `+`, capitals or leading zeros either).
    pub fn parse(name: &str) -> Option<PartFileName> {
        let mut fields = name.strip_suffix(".part")?.splitn(3, '-');
        let mut hex = || u64::from_str_radix(fields.next()?, 16).ok();
        let parsed = PartFileName {
            seq: hex()?,
            part: hex()?,
            len: hex()?,
        };
        (parsed.to_string() == name).then_some(parsed)
    }
}

impl std::fmt::Display for PartFileName {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "{:016x}-{:016x}-{:x}.part",
            self.seq, self.part, self.len
        )
    }
}

/// Which part of which object version a file holds, in 64 bits: the first eight bytes
/// of the SHA-256 of the key, the ETag and the offset (each length-prefixed, so no two
/// triples share an input). A read computes it to find its part's file; the header
/// decides (a name says what a file should hold, never what it serves).
pub fn part_id(key: &str, etag: &str, object_offset: u64) -> u64 {
    let mut hash = Sha256::new();
    for field in [key.as_bytes(), etag.as_bytes()] {
        hash.update((field.len() as u64).to_le_bytes());
        hash.update(field);
    }
    hash.update(object_offset.to_le_bytes());
    u64::from_le_bytes(hash.finalize()[..8].try_into().expect("32 bytes"))
}

/// How many threads read the earlier mount's part files' headers: the work waits on
/// the disk, which serves many requests at once (cold, 10^5 files take seconds on one
/// thread).
pub const IO_THREADS: usize = 8;

/// Runs `f` on every item, on up to [`IO_THREADS`] threads.
pub fn in_parallel<T: Sync>(items: &[T], f: impl Fn(&T) + Sync) {
    let per_thread = items.len().div_ceil(IO_THREADS).max(1);
    std::thread::scope(|scope| {
        let f = &f;
        for chunk in items.chunks(per_thread) {
            scope.spawn(move || chunk.iter().for_each(f));
        }
    });
}

/// Reads and checks the header of a part file: its own checksum, a file length that is
/// exactly the header plus the data it declares and the length its name declares (a
/// file cut short by a power loss is refused here; a flipped data bit is caught by the
/// block checksums on reading), and the part its name says it holds.
pub fn read_header(mut file: File, name: &PartFileName) -> Result<(PartHeader, u64), BadPartFile> {
    let file_len = file.metadata()?.size();
    let mut head = vec![0u8; 4096];
    let got = read_up_to(&mut file, &mut head)?;
    head.truncate(got);
    let header_len = PartHeader::declared_len(&head)?;
    if header_len > head.len() {
        let have = head.len();
        head.resize(header_len, 0);
        let got = read_up_to(&mut file, &mut head[have..])?;
        head.truncate(have + got);
    }
    let header = PartHeader::decode(&head)?;
    let declared = header_len as u64 + header.data_len;
    if file_len != declared || file_len != name.len {
        return Err(BadPartFile::WrongLength {
            file_len,
            declared,
            named: name.len,
        });
    }
    if part_id(&header.key, &header.etag, header.object_offset) != name.part {
        return Err(BadPartFile::OtherPart);
    }
    Ok((header, header_len as u64))
}

/// Why an earlier mount's part file is not adopted.
#[derive(Debug, thiserror::Error)]
pub enum BadPartFile {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("file is {file_len} bytes, its header declares {declared}, its name {named}")]
    WrongLength {
        file_len: u64,
        declared: u64,
        named: u64,
    },
    #[error("its header names another part than its file name")]
    OtherPart,
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
    pub etag: Option<Etag>,
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
    use std::fs;

    fn listed(etag: Option<&str>, size: u64) -> ListedObject {
        ListedObject {
            id: ObjectId(3),
            key: "ds/chunk_00001/data.npy".into(),
            etag: etag.map(Etag::from),
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
        let golden = b"{\n  \"layout_version\": 3,\n  \"source\": \"s3://bucket/atlas\"\n}\n";
        assert_eq!(SourceRecord::of("s3://bucket/atlas", None).encode(), golden);
        assert_eq!(
            SourceRecord::decode(golden),
            Some(SourceRecord::of("s3://bucket/atlas", None))
        );
        let with_endpoint = b"{\n  \"layout_version\": 3,\n  \"source\": \"s3://bucket/atlas\",\n  \"endpoint\": \"http://127.0.0.1:9000\"\n}\n";
        let record = SourceRecord::of("s3://bucket/atlas", Some("http://127.0.0.1:9000/"));
        assert_eq!(record.encode(), with_endpoint);
        assert_eq!(SourceRecord::decode(with_endpoint), Some(record));
        assert_eq!(layout_dir_name(), "scdlfs-cache-v3");
    }

    /// Part file names are part of the layout: a change here must come with a new
    /// [`LAYOUT_VERSION`]. So is the part id, which a read computes to find its file.
    #[test]
    fn the_part_file_name_format_is_stable() {
        let id = part_id("ds/chunk_00001/data.npy", "\"v1\"", 8 << 20);
        assert_eq!(
            id, 0xb928_b39a_ffc5_c876,
            "{id:#x}: the SHA-256 of the length-prefixed fields (checked with Python's hashlib)"
        );
        let name = PartFileName {
            seq: 0x2a,
            part: id,
            len: 4096 + (8 << 20),
        };
        assert_eq!(
            name.to_string(),
            "000000000000002a-b928b39affc5c876-801000.part"
        );
        assert_eq!(PartFileName::parse(&name.to_string()), Some(name));
        assert_ne!(id, part_id("ds/chunk_00001/data.npy", "\"v2\"", 8 << 20));
        assert_ne!(id, part_id("ds/chunk_00001/data.npy\"v1\"", "", 8 << 20));
        assert_ne!(id, part_id("ds/chunk_00001/data.npy", "\"v1\"", 0));
    }

    #[test]
    fn only_names_the_cache_writes_are_part_files() {
        for foreign in [
            "000000000000002a.part", // layout 2
            "000000000000002a-b928b39affc5c876-801000.part.tmp",
            "000000000000002A-b928b39affc5c876-801000.part",
            "000000000000002a-b928b39affc5c876-0801000.part",
            "000000000000002a-b928b39affc5c876-+801000.part",
            "00000000000002a-b928b39affc5c876-801000.part",
            "000000000000002a-b928b39affc5c876-801000-1.part",
            "000000000000002a-b928b39affc5c876-10000000000000000.part",
            "notes",
        ] {
            assert_eq!(PartFileName::parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn a_header_must_match_its_files_name_and_length() {
        let dir = tempfile::tempdir().unwrap();
        let header = PartHeader::of("k", "\"e\"", 100, &[5; 100]);
        let mut bytes = header.encode();
        bytes.extend_from_slice(&[5; 100]);
        let right = PartFileName {
            seq: 1,
            part: part_id("k", "\"e\"", 100),
            len: bytes.len() as u64,
        };
        let path = dir.path().join(right.to_string());
        fs::write(&path, &bytes).unwrap();
        assert_eq!(
            read_header(File::open(&path).unwrap(), &right).unwrap(),
            (header, 4096)
        );
        let other_part = PartFileName {
            part: part_id("k", "\"e\"", 0),
            ..right
        };
        assert!(matches!(
            read_header(File::open(&path).unwrap(), &other_part),
            Err(BadPartFile::OtherPart)
        ));
        let longer = PartFileName {
            len: right.len + 1,
            ..right
        };
        assert!(matches!(
            read_header(File::open(&path).unwrap(), &longer),
            Err(BadPartFile::WrongLength { .. })
        ));
    }
}
