//! The manifest of a chunked archive: every object of the dataset with its size,
//! modification time and ETag, in one object beside `header.sch`, so that a mount opens
//! the dataset with one GET instead of listing its objects (a dataset of 24,415 chunks
//! holds 73,000 objects: 74 listing pages, one after the other).
//!
//! `scdlfs chunk` writes it after the chunk objects and before the header (the header
//! is the commit point, so a manifest is never the only sign of a dataset);
//! `scdlfs manifest URL` writes one for a dataset chunked by another tool. It lists
//! every object of the dataset but `header.sch` (written after it) and itself, with
//! keys relative to the dataset. A reader checks it against the header
//! ([`Manifest::agrees_with`]: chunk size, chunk count, rows) and every object it pins
//! against the store as it reads it (`If-Match` with the ETag listed here).
//!
//! The format is text, one record a line (`docs/manifest.md`):
//!
//! ```text
//! scdlfs-manifest 1
//! rows 1200
//! chunk-rows 15
//! chunks 80
//! object 120 1733400000123456789 "9b2cf535f27731c974343645a3985328" chunk_00000/data.npy
//! ...
//! end 243
//! ```
//!
//! An `object` line holds the size in bytes, the modification time in nanoseconds
//! since the Unix epoch, the ETag as the store's answers quote it (`-` for none) and
//! the key, which runs to the end of the line. `end` repeats the count of objects, so
//! that a manifest cut short is refused rather than read as a smaller dataset. The
//! version on the first line changes with any change of the format; the golden test
//! below fails when the encoding does.

use std::fmt::Write as _;

use crate::header::Header;

/// The manifest's name in the dataset's directory. It sorts before the chunk
/// directories and is hidden from a plain `ls`.
pub const MANIFEST_FILE: &str = ".scdlfs-manifest";

/// The version of the format this crate writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

const MAGIC: &str = "scdlfs-manifest";

/// The largest manifest a reader takes: about a million objects' lines, the most a
/// mount lists in one directory or dataset. A larger one is refused unread.
pub const MAX_MANIFEST_BYTES: u64 = 128 << 20;

/// One object of the dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestObject {
    /// The key relative to the dataset's prefix (`chunk_00000/data.npy`).
    pub key: String,
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
    /// The ETag in its quoted header form, if the store gives one.
    pub etag: Option<String>,
}

/// A chunked dataset's objects and the shape its header must have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub rows: u64,
    pub chunk_rows: u64,
    pub chunks: u64,
    pub objects: Vec<ManifestObject>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("not an scdlfs manifest")]
    NotAManifest,
    #[error("manifest version {0}, this reader knows version {MANIFEST_VERSION}")]
    UnknownVersion(String),
    #[error("manifest line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("the manifest ends after {found} objects, before its end line")]
    CutShort { found: usize },
    #[error("the manifest's end line says {said} objects, it lists {found}")]
    WrongCount { said: u64, found: usize },
    #[error("the manifest describes {manifest}, the header {header}")]
    Disagrees { manifest: String, header: String },
    #[error("{key:?} cannot be written in a manifest: {reason}")]
    Unwritable { key: String, reason: &'static str },
}

impl Manifest {
    /// The manifest's bytes. Keys with a line break, empty keys and ETags with white
    /// space cannot be written.
    pub fn encode(&self) -> Result<String, ManifestError> {
        let mut out = String::with_capacity(64 + 96 * self.objects.len());
        let _ = writeln!(out, "{MAGIC} {MANIFEST_VERSION}");
        let _ = writeln!(out, "rows {}", self.rows);
        let _ = writeln!(out, "chunk-rows {}", self.chunk_rows);
        let _ = writeln!(out, "chunks {}", self.chunks);
        for object in &self.objects {
            let unwritable = |reason| ManifestError::Unwritable {
                key: object.key.clone(),
                reason,
            };
            if object.key.is_empty() || object.key.contains(['\n', '\r']) {
                return Err(unwritable("a key must be one line, not empty"));
            }
            let etag = match &object.etag {
                Some(etag) if etag.is_empty() || etag.contains(char::is_whitespace) => {
                    return Err(unwritable("its ETag is empty or holds white space"))
                }
                Some(etag) => etag.as_str(),
                None => "-",
            };
            let _ = writeln!(
                out,
                "object {} {} {etag} {}",
                object.size, object.mtime_ns, object.key
            );
        }
        let _ = writeln!(out, "end {}", self.objects.len());
        Ok(out)
    }

    /// A manifest from its bytes, checked line by line.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let read = ManifestBytes::parse(bytes)?;
        Ok(Manifest {
            rows: read.rows,
            chunk_rows: read.chunk_rows,
            chunks: read.chunks,
            objects: read.objects().map(|o| o.to_owned()).collect(),
        })
    }

    /// Whether the manifest describes the dataset `header` (a chunked one): the same
    /// rows, rows per chunk and chunks. A manifest left from another chunking of the
    /// same prefix disagrees, and is not used.
    pub fn agrees_with(&self, header: &Header) -> Result<(), ManifestError> {
        agrees_with([self.rows, self.chunk_rows, self.chunks], header)
    }
}

/// Whether `[rows, chunk_rows, chunks]` are those of the dataset `header`.
fn agrees_with([rows, chunk_rows, chunks]: [u64; 3], header: &Header) -> Result<(), ManifestError> {
    let shape = |rows: u64, chunk_rows: u64, chunks: u64| {
        format!("{rows} rows in {chunks} chunks of {chunk_rows}")
    };
    let manifest = shape(rows, chunk_rows, chunks);
    let header = match &header.chunked {
        Some(info) => shape(
            info.total_rows,
            info.chunk_size as u64,
            info.num_chunks as u64,
        ),
        None => "a monolithic archive".to_owned(),
    };
    if manifest == header {
        Ok(())
    } else {
        Err(ManifestError::Disagrees { manifest, header })
    }
}

/// One object of a manifest as its bytes hold it ([`ManifestBytes::objects`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestEntry<'a> {
    /// The key relative to the dataset's prefix.
    pub key: &'a str,
    pub size: u64,
    pub mtime_ns: u64,
    /// The ETag as written, quoted; `None` for `-`.
    pub etag: Option<&'a str>,
}

impl ManifestEntry<'_> {
    pub fn to_owned(&self) -> ManifestObject {
        ManifestObject {
            key: self.key.to_owned(),
            size: self.size,
            mtime_ns: self.mtime_ns,
            etag: self.etag.map(str::to_owned),
        }
    }
}

/// A manifest checked whole, whose objects are read from its bytes each time they are
/// asked for ([`ManifestBytes::objects`]) instead of copied out: a reader that makes
/// each object into something of its own (a mount's catalog, 10^5 objects of an atlas)
/// holds the manifest's bytes while it does, not a second copy of every key and ETag
/// besides them. [`Manifest::decode`] is this, copied out.
pub struct ManifestBytes<B> {
    bytes: B,
    pub rows: u64,
    pub chunk_rows: u64,
    pub chunks: u64,
    /// How many objects it lists.
    pub len: usize,
    /// Where the first `object` line starts.
    objects_at: usize,
}

impl<B: AsRef<[u8]>> ManifestBytes<B> {
    /// The manifest of `bytes`, checked line by line as [`Manifest::decode`] does.
    pub fn parse(bytes: B) -> Result<ManifestBytes<B>, ManifestError> {
        let text = std::str::from_utf8(bytes.as_ref()).map_err(|_| ManifestError::NotAManifest)?;
        let mut lines = text.split_terminator('\n').enumerate();
        let (_, first) = lines.next().ok_or(ManifestError::NotAManifest)?;
        let version = first
            .strip_prefix(MAGIC)
            .and_then(|rest| rest.strip_prefix(' '))
            .ok_or(ManifestError::NotAManifest)?;
        if version != MANIFEST_VERSION.to_string() {
            return Err(ManifestError::UnknownVersion(version.to_owned()));
        }
        let mut at = first.len() + 1;
        let mut field = |name: &str| -> Result<u64, ManifestError> {
            let (index, line) = lines.next().ok_or(ManifestError::CutShort { found: 0 })?;
            at += line.len() + 1;
            let bad = |reason: String| ManifestError::BadLine {
                line: index + 1,
                reason,
            };
            let value = line
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
                .ok_or_else(|| bad(format!("expected `{name} N`")))?;
            number(value).ok_or_else(|| bad(format!("{name}: not a number: {value:?}")))
        };
        let rows = field("rows")?;
        let chunk_rows = field("chunk-rows")?;
        let chunks = field("chunks")?;
        let objects_at = at.min(text.len());
        let mut found = 0usize;
        for (index, line) in lines {
            let bad = |reason: &str| ManifestError::BadLine {
                line: index + 1,
                reason: reason.to_owned(),
            };
            if let Some(count) = line.strip_prefix("end ") {
                let said = number(count).ok_or_else(|| bad("end: not a number"))?;
                if said != found as u64 {
                    return Err(ManifestError::WrongCount { said, found });
                }
                if index + 1 != text.split_terminator('\n').count() {
                    return Err(ManifestError::BadLine {
                        line: index + 2,
                        reason: "a line after the end line".into(),
                    });
                }
                return Ok(ManifestBytes {
                    bytes,
                    rows,
                    chunk_rows,
                    chunks,
                    len: found,
                    objects_at,
                });
            }
            object_line(line).map_err(bad)?;
            found += 1;
        }
        Err(ManifestError::CutShort { found })
    }

    /// The objects it lists, in its order.
    pub fn objects(&self) -> impl Iterator<Item = ManifestEntry<'_>> + '_ {
        let text = std::str::from_utf8(self.bytes.as_ref()).expect("checked by parse");
        text[self.objects_at..]
            .split_terminator('\n')
            .take(self.len)
            .map(|line| object_line(line).expect("checked by parse"))
    }

    /// Whether the manifest describes the dataset `header` ([`Manifest::agrees_with`]).
    pub fn agrees_with(&self, header: &Header) -> Result<(), ManifestError> {
        agrees_with([self.rows, self.chunk_rows, self.chunks], header)
    }
}

/// An `object` line's fields, or what is wrong with it.
fn object_line(line: &str) -> Result<ManifestEntry<'_>, &'static str> {
    let fields = line
        .strip_prefix("object ")
        .ok_or("expected `object` or `end`")?;
    let mut parts = fields.splitn(4, ' ');
    let mut next = || parts.next().filter(|p| !p.is_empty());
    let size = next().and_then(number).ok_or("bad size")?;
    let mtime_ns = next().and_then(number).ok_or("bad time")?;
    let etag = next().ok_or("no ETag")?;
    let key = next().ok_or("no key")?;
    if key.contains('\r') {
        return Err("a key with a line break");
    }
    Ok(ManifestEntry {
        key,
        size,
        mtime_ns,
        etag: (etag != "-").then_some(etag),
    })
}

/// A decimal number as the manifest writes it: digits only, no sign, no leading zero.
fn number(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::ChunkedInfo;

    fn sample() -> Manifest {
        Manifest {
            rows: 100,
            chunk_rows: 64,
            chunks: 2,
            objects: vec![
                ManifestObject {
                    key: "chunk_00000/data.npy".into(),
                    size: 4096,
                    mtime_ns: 1_733_400_000_123_456_789,
                    etag: Some("\"9b2cf535f27731c974343645a3985328\"".into()),
                },
                ManifestObject {
                    key: "var_features/dataframe 00.parquet".into(),
                    size: 0,
                    mtime_ns: 0,
                    etag: None,
                },
            ],
        }
    }

    /// The bytes of a manifest, written out by hand from the format description so that
    /// any change of the encoding fails here.
    #[test]
    fn golden_manifest_bytes() {
        let golden = "scdlfs-manifest 1\n\
                      rows 100\n\
                      chunk-rows 64\n\
                      chunks 2\n\
                      object 4096 1733400000123456789 \"9b2cf535f27731c974343645a3985328\" chunk_00000/data.npy\n\
                      object 0 0 - var_features/dataframe 00.parquet\n\
                      end 2\n";
        assert_eq!(sample().encode().unwrap(), golden);
        assert_eq!(Manifest::decode(golden.as_bytes()).unwrap(), sample());
    }

    proptest::proptest! {
        /// Read from its bytes, a manifest lists what was written, in order, and
        /// nothing more; an empty one too.
        #[test]
        fn a_manifest_read_from_its_bytes_lists_what_was_written(
            objects in proptest::collection::vec(
                ("[a-z_/ .0-9]{1,30}", 0u64..u64::MAX, 0u64..u64::MAX,
                 proptest::option::of("\"[0-9a-f]{0,40}\"")),
                0..20,
            ),
        ) {
            let objects: Vec<ManifestObject> = objects
                .into_iter()
                .map(|(key, size, mtime_ns, etag)| ManifestObject { key, size, mtime_ns, etag })
                .collect();
            let manifest = Manifest { rows: 7, chunk_rows: 3, chunks: 3, objects };
            let bytes = manifest.encode().unwrap();
            let read = ManifestBytes::parse(bytes.as_bytes()).unwrap();
            proptest::prop_assert_eq!((read.rows, read.chunk_rows, read.chunks), (7, 3, 3));
            proptest::prop_assert_eq!(read.len, manifest.objects.len());
            let listed: Vec<ManifestObject> = read.objects().map(|o| o.to_owned()).collect();
            proptest::prop_assert_eq!(&listed, &manifest.objects);
            proptest::prop_assert_eq!(Manifest::decode(bytes.as_bytes()).unwrap(), manifest);
        }
    }

    #[test]
    fn a_manifest_cut_short_or_miscounted_is_refused() {
        let bytes = sample().encode().unwrap();
        let cut = &bytes[..bytes.find("end").unwrap()];
        assert_eq!(
            Manifest::decode(cut.as_bytes()),
            Err(ManifestError::CutShort { found: 2 })
        );
        let miscounted = bytes.replace("end 2", "end 3");
        assert_eq!(
            Manifest::decode(miscounted.as_bytes()),
            Err(ManifestError::WrongCount { said: 3, found: 2 })
        );
        let trailing = format!("{bytes}object 1 1 - x\n");
        assert!(matches!(
            Manifest::decode(trailing.as_bytes()),
            Err(ManifestError::BadLine { line: 8, .. })
        ));
    }

    #[test]
    fn other_versions_and_other_files_are_refused() {
        let bytes = sample().encode().unwrap();
        assert_eq!(
            Manifest::decode(bytes.replace("manifest 1", "manifest 2").as_bytes()),
            Err(ManifestError::UnknownVersion("2".into()))
        );
        assert_eq!(
            Manifest::decode(b"SCDL\x00\x01"),
            Err(ManifestError::NotAManifest)
        );
        for bad in [
            "object 01 0 - k",
            "object 1 x - k",
            "object 1 0 -",
            "object 1 0  k",
        ] {
            let text = bytes.replace("object 0 0 - var_features/dataframe 00.parquet", bad);
            assert!(
                matches!(
                    Manifest::decode(text.as_bytes()),
                    Err(ManifestError::BadLine { line: 6, .. })
                ),
                "{bad:?} was taken"
            );
        }
    }

    #[test]
    fn keys_and_etags_that_a_line_cannot_hold_are_not_written() {
        for (key, etag) in [("a\nb", None), ("", None), ("k", Some("\"a b\""))] {
            let mut manifest = sample();
            manifest.objects[0].key = key.into();
            manifest.objects[0].etag = etag.map(str::to_owned);
            assert!(matches!(
                manifest.encode(),
                Err(ManifestError::Unwritable { .. })
            ));
        }
    }

    #[test]
    fn a_manifest_agrees_only_with_a_header_of_its_shape() {
        let mut header = crate::header::tests::sample_chunked();
        header.chunked = Some(ChunkedInfo {
            chunk_size: 64,
            num_chunks: 2,
            total_rows: 100,
        });
        assert_eq!(sample().agrees_with(&header), Ok(()));
        header.chunked = Some(ChunkedInfo {
            chunk_size: 64,
            num_chunks: 2,
            total_rows: 99,
        });
        assert!(matches!(
            sample().agrees_with(&header),
            Err(ManifestError::Disagrees { .. })
        ));
        header.chunked = None;
        assert!(sample().agrees_with(&header).is_err());
    }
}
