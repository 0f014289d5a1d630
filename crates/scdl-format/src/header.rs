//! The `header.sch` codec: a big-endian binary description of an SCDL archive's arrays
//! and feature indices, with a trailing chunk description in chunked archives.
//!
//! Decoding is strict (every count is checked against the bytes that remain, names must
//! be UTF-8, dtype codes known) because the header is the only record of the arrays'
//! real element types: a misread header silently garbles every number behind it.
//! Encoding is the exact inverse, so that a header re-encoded by [`Header::encode`] is
//! byte-for-byte what the writer produced.

use crate::dtype::Dtype;
use crate::layout::ArrayKind;

/// No SCDL header is larger (real ones are a few KiB): readers of untrusted stores
/// refuse a bigger `header.sch` before reading it.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

const MAGIC: &[u8; 4] = b"SCDL";
/// Names longer than this are taken for corruption rather than allocated.
const MAX_NAME_LEN: u32 = 4096;
const MAX_SHAPE_DIMS: u32 = 32;

/// How the archive's arrays are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `MEMMAP_V0`: one `data.npy`, `row_ptr.npy`, `col_ptr.npy` at the root.
    Monolithic,
    /// `CHUNKED_MEMMAP_V0`: the arrays split by rows into `chunk_XXXXX/` directories.
    Chunked,
}

impl Backend {
    pub fn code(self) -> u32 {
        match self {
            Backend::Monolithic => 1,
            Backend::Chunked => 2,
        }
    }
}

/// One array entry of the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayInfo {
    /// The enum name the writer records: `DATA`, `ROWPTR`, `COLPTR` or `NEIGHBOR_*`.
    pub name: String,
    /// Element count (not bytes); the global count in chunked archives too.
    pub length: u64,
    pub dtype: Dtype,
    pub shape: Option<Vec<u32>>,
}

/// One feature-index entry of the header (`var_features`, `obs_features`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureIndexInfo {
    pub name: String,
    pub length: u64,
    pub dtype: Dtype,
    pub files: Vec<String>,
    pub shape: Option<Vec<u32>>,
}

/// The trailing description of a chunked archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedInfo {
    /// Rows per chunk; the last chunk may be shorter.
    pub chunk_size: u32,
    pub num_chunks: u32,
    pub total_rows: u64,
}

/// A decoded `header.sch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Schema version (major, minor, point); the released writer uses 0.1.0.
    pub version: (u8, u8, u8),
    /// Endianness code of the header; always 1 (network order) in files seen so far.
    pub endianness: u8,
    pub backend: Backend,
    pub arrays: Vec<ArrayInfo>,
    pub feature_indices: Vec<FeatureIndexInfo>,
    /// Present in chunked archives (and only there).
    pub chunked: Option<ChunkedInfo>,
}

/// Why a header could not be decoded or does not describe a usable archive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("not an SCDL header (magic is {0:02x?}, expected \"SCDL\")")]
    BadMagic([u8; 4]),
    #[error("header truncated at byte {offset} while reading {what}")]
    Truncated { offset: usize, what: &'static str },
    #[error("unknown backend code {0}")]
    UnknownBackend(u32),
    #[error("unknown dtype code {code} for {name}")]
    UnknownDtype { name: String, code: u32 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    BadUtf8 { offset: usize, what: &'static str },
    #[error("{what} of {value} at byte {offset} is implausible")]
    Implausible {
        offset: usize,
        what: &'static str,
        value: u64,
    },
    #[error("chunked backend without chunk information")]
    MissingChunkInfo,
    #[error("header has no {0} array")]
    MissingArray(&'static str),
    #[error("array {name} has dtype {dtype}, which cannot back a {role}")]
    UnusableDtype {
        name: &'static str,
        dtype: Dtype,
        role: &'static str,
    },
}

struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HeaderError> {
        let end = self
            .offset
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(HeaderError::Truncated {
                offset: self.offset,
                what,
            })?;
        let taken = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(taken)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HeaderError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, HeaderError> {
        Ok(u32::from_be_bytes(self.take(4, what)?.try_into().unwrap()))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, HeaderError> {
        Ok(u64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    fn string(&mut self, what: &'static str) -> Result<String, HeaderError> {
        let at = self.offset;
        let len = self.u32(what)?;
        if len > MAX_NAME_LEN {
            return Err(HeaderError::Implausible {
                offset: at,
                what,
                value: len as u64,
            });
        }
        let start = self.offset;
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| HeaderError::BadUtf8 {
            offset: start,
            what,
        })
    }

    /// A count of items that each take at least `min_item_bytes`, checked against the
    /// bytes left so a corrupt count cannot make us allocate gigabytes.
    fn count(&mut self, what: &'static str, min_item_bytes: usize) -> Result<u32, HeaderError> {
        let at = self.offset;
        let count = self.u32(what)?;
        let left = self.bytes.len() - self.offset;
        if (count as usize).saturating_mul(min_item_bytes) > left {
            return Err(HeaderError::Implausible {
                offset: at,
                what,
                value: count as u64,
            });
        }
        Ok(count)
    }

    fn dtype(&mut self, name: &str) -> Result<Dtype, HeaderError> {
        let code = self.u32("dtype")?;
        Dtype::from_code(code).ok_or_else(|| HeaderError::UnknownDtype {
            name: name.to_owned(),
            code,
        })
    }

    fn shape(&mut self) -> Result<Option<Vec<u32>>, HeaderError> {
        if self.u8("has_shape")? == 0 {
            return Ok(None);
        }
        let at = self.offset;
        let dims = self.u32("shape dims")?;
        if dims > MAX_SHAPE_DIMS {
            return Err(HeaderError::Implausible {
                offset: at,
                what: "shape dims",
                value: dims as u64,
            });
        }
        (0..dims)
            .map(|_| self.u32("shape"))
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

impl Header {
    /// Decodes a `header.sch`. Bytes after the feature indices of a monolithic header
    /// are ignored, as the released reader ignores them.
    pub fn decode(bytes: &[u8]) -> Result<Header, HeaderError> {
        let mut r = Reader { bytes, offset: 0 };
        let magic: [u8; 4] = r.take(4, "magic")?.try_into().unwrap();
        if &magic != MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        let version = (r.u8("version")?, r.u8("version")?, r.u8("version")?);
        let endianness = r.u8("endianness")?;
        let backend = match r.u32("backend")? {
            1 => Backend::Monolithic,
            2 => Backend::Chunked,
            other => return Err(HeaderError::UnknownBackend(other)),
        };
        // An array entry takes at least 4 + 8 + 4 + 1 bytes.
        let array_count = r.count("array count", 17)?;
        let mut arrays = Vec::with_capacity(array_count as usize);
        for _ in 0..array_count {
            let name = r.string("array name")?;
            let length = r.u64("array length")?;
            let dtype = r.dtype(&name)?;
            let shape = r.shape()?;
            arrays.push(ArrayInfo {
                name,
                length,
                dtype,
                shape,
            });
        }
        let feature_count = r.count("feature index count", 21)?;
        let mut feature_indices = Vec::with_capacity(feature_count as usize);
        for _ in 0..feature_count {
            let name = r.string("feature index name")?;
            let length = r.u64("feature index length")?;
            let dtype = r.dtype(&name)?;
            let file_count = r.count("feature index file count", 4)?;
            let files = (0..file_count)
                .map(|_| r.string("feature index file"))
                .collect::<Result<_, _>>()?;
            let shape = r.shape()?;
            feature_indices.push(FeatureIndexInfo {
                name,
                length,
                dtype,
                files,
                shape,
            });
        }
        let chunked = match backend {
            Backend::Monolithic => None,
            Backend::Chunked => {
                if r.u8("has_chunked_info")
                    .map_err(|_| HeaderError::MissingChunkInfo)?
                    == 0
                {
                    return Err(HeaderError::MissingChunkInfo);
                }
                Some(ChunkedInfo {
                    chunk_size: r.u32("chunk_size")?,
                    num_chunks: r.u32("num_chunks")?,
                    total_rows: r.u64("total_rows")?,
                })
            }
        };
        Ok(Header {
            version,
            endianness,
            backend,
            arrays,
            feature_indices,
            chunked,
        })
    }

    /// Encodes the header exactly as the SCDL writer lays it out.
    pub fn encode(&self) -> Vec<u8> {
        fn string(out: &mut Vec<u8>, s: &str) {
            out.extend_from_slice(&(s.len() as u32).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        fn shape(out: &mut Vec<u8>, shape: &Option<Vec<u32>>) {
            match shape {
                None => out.push(0),
                Some(dims) => {
                    out.push(1);
                    out.extend_from_slice(&(dims.len() as u32).to_be_bytes());
                    for d in dims {
                        out.extend_from_slice(&d.to_be_bytes());
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[self.version.0, self.version.1, self.version.2]);
        out.push(self.endianness);
        out.extend_from_slice(&self.backend.code().to_be_bytes());
        out.extend_from_slice(&(self.arrays.len() as u32).to_be_bytes());
        for a in &self.arrays {
            string(&mut out, &a.name);
            out.extend_from_slice(&a.length.to_be_bytes());
            out.extend_from_slice(&a.dtype.code().to_be_bytes());
            shape(&mut out, &a.shape);
        }
        out.extend_from_slice(&(self.feature_indices.len() as u32).to_be_bytes());
        for f in &self.feature_indices {
            string(&mut out, &f.name);
            out.extend_from_slice(&f.length.to_be_bytes());
            out.extend_from_slice(&f.dtype.code().to_be_bytes());
            out.extend_from_slice(&(f.files.len() as u32).to_be_bytes());
            for file in &f.files {
                string(&mut out, file);
            }
            shape(&mut out, &f.shape);
        }
        if let Some(c) = &self.chunked {
            out.push(1);
            out.extend_from_slice(&c.chunk_size.to_be_bytes());
            out.extend_from_slice(&c.num_chunks.to_be_bytes());
            out.extend_from_slice(&c.total_rows.to_be_bytes());
        }
        out
    }

    /// The header entry of one of the three CSR arrays.
    pub fn array(&self, kind: ArrayKind) -> Result<&ArrayInfo, HeaderError> {
        self.arrays
            .iter()
            .find(|a| a.name == kind.header_name())
            .ok_or(HeaderError::MissingArray(kind.header_name()))
    }

    /// The three CSR arrays' entries, checked to have types a reader can map: raw
    /// numbers for DATA, unsigned integers for the two index arrays.
    pub fn csr_arrays(&self) -> Result<[&ArrayInfo; 3], HeaderError> {
        let arrays = [
            self.array(ArrayKind::Data)?,
            self.array(ArrayKind::RowPtr)?,
            self.array(ArrayKind::ColPtr)?,
        ];
        for (kind, info) in ArrayKind::ALL.iter().zip(arrays) {
            let usable = match kind {
                ArrayKind::Data => info.dtype.size().is_some(),
                ArrayKind::RowPtr | ArrayKind::ColPtr => info.dtype.is_unsigned_int(),
            };
            if !usable {
                return Err(HeaderError::UnusableDtype {
                    name: kind.header_name(),
                    dtype: info.dtype,
                    role: kind.role(),
                });
            }
        }
        Ok(arrays)
    }

    /// The header of the monolithic archive equivalent to this chunked one: the same
    /// arrays with their global lengths and types, the same feature indices, backend 1
    /// and no chunk information.
    pub fn to_monolithic(&self) -> Header {
        Header {
            backend: Backend::Monolithic,
            chunked: None,
            ..self.clone()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn sample_chunked() -> Header {
        Header {
            version: (0, 1, 0),
            endianness: 1,
            backend: Backend::Chunked,
            arrays: vec![
                ArrayInfo {
                    name: "DATA".into(),
                    length: 1234,
                    dtype: Dtype::F32,
                    shape: None,
                },
                ArrayInfo {
                    name: "COLPTR".into(),
                    length: 1234,
                    dtype: Dtype::U16,
                    shape: None,
                },
                ArrayInfo {
                    name: "ROWPTR".into(),
                    length: 101,
                    dtype: Dtype::U16,
                    shape: None,
                },
            ],
            feature_indices: vec![FeatureIndexInfo {
                name: "var_features".into(),
                length: 500,
                dtype: Dtype::String,
                files: vec!["dataframe_00.parquet".into()],
                shape: Some(vec![500, 3]),
            }],
            chunked: Some(ChunkedInfo {
                chunk_size: 32,
                num_chunks: 4,
                total_rows: 100,
            }),
        }
    }

    /// The bytes of a chunked header, written out by hand from the format description so
    /// that any change of the codec's layout fails here.
    #[test]
    fn golden_chunked_header_bytes() {
        let mut expected = Vec::new();
        expected.extend_from_slice(b"SCDL\x00\x01\x00\x01");
        expected.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3]);
        expected.extend_from_slice(b"\x00\x00\x00\x04DATA");
        expected.extend_from_slice(&1234u64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 6, 0]);
        expected.extend_from_slice(b"\x00\x00\x00\x06COLPTR");
        expected.extend_from_slice(&1234u64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 2, 0]);
        expected.extend_from_slice(b"\x00\x00\x00\x06ROWPTR");
        expected.extend_from_slice(&101u64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 2, 0]);
        expected.extend_from_slice(&[0, 0, 0, 1]);
        expected.extend_from_slice(b"\x00\x00\x00\x0cvar_features");
        expected.extend_from_slice(&500u64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 1]);
        expected.extend_from_slice(b"\x00\x00\x00\x14dataframe_00.parquet");
        expected.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 1, 0xf4, 0, 0, 0, 3]);
        expected.extend_from_slice(&[1, 0, 0, 0, 32, 0, 0, 0, 4]);
        expected.extend_from_slice(&100u64.to_be_bytes());
        assert_eq!(sample_chunked().encode(), expected);
        assert_eq!(Header::decode(&expected).unwrap(), sample_chunked());
    }

    #[test]
    fn monolithic_equivalent_drops_only_the_chunk_description() {
        let chunked = sample_chunked();
        let flat = chunked.to_monolithic();
        let encoded = flat.encode();
        assert_eq!(&encoded[8..12], &[0, 0, 0, 1]);
        // Same bytes but the backend code and the 17-byte trailer.
        let chunked_bytes = chunked.encode();
        assert_eq!(encoded.len() + 17, chunked_bytes.len());
        assert_eq!(encoded[12..], chunked_bytes[12..chunked_bytes.len() - 17]);
    }

    #[test]
    fn rejects_wrong_magic_unknown_backend_and_missing_chunk_info() {
        assert!(matches!(
            Header::decode(b"NOPE\0\x01\0\x01"),
            Err(HeaderError::BadMagic(_))
        ));
        let mut bytes = sample_chunked().encode();
        bytes[11] = 7;
        assert_eq!(Header::decode(&bytes), Err(HeaderError::UnknownBackend(7)));
        let bytes = sample_chunked().encode();
        assert_eq!(
            Header::decode(&bytes[..bytes.len() - 17]),
            Err(HeaderError::MissingChunkInfo)
        );
    }

    #[test]
    fn a_huge_count_is_refused_without_allocating() {
        let mut bytes = sample_chunked().encode();
        bytes[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Header::decode(&bytes),
            Err(HeaderError::Implausible { .. })
        ));
    }

    #[test]
    fn index_arrays_must_be_unsigned_integers() {
        let mut header = sample_chunked();
        header.arrays[2].dtype = Dtype::F32;
        assert!(matches!(
            header.csr_arrays(),
            Err(HeaderError::UnusableDtype { name: "ROWPTR", .. })
        ));
    }

    proptest! {
        /// No input makes the decoder panic; every prefix of a valid header is refused.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Header::decode(&bytes);
        }

        #[test]
        fn every_strict_prefix_is_refused(cut in 0usize..1000) {
            let bytes = sample_chunked().encode();
            let cut = cut % bytes.len();
            prop_assert!(Header::decode(&bytes[..cut]).is_err());
        }
    }
}
