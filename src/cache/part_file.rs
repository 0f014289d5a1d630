//! The on-disk format of one cached part, version 2.
//!
//! A part file is a header followed by the part's bytes. The header makes the file
//! self-describing: it names the object (key and pinned ETag) and the part's place in
//! it, and carries a CRC32C of every block of the data and one of the header itself, so
//! that every read can check the blocks it touches and a daemon can re-adopt a cache
//! after a restart. Version 1 had a single CRC32C of the whole part, which a read of a
//! few KiB could not afford to check.
//!
//! ```text
//! offset  size  field (integers little-endian)
//!      0     8  magic "SCDLFSPT"
//!      8     4  format version (2)
//!     12     4  header length H (a multiple of 4096)
//!     16     8  offset of the part in the object
//!     24     8  data length D
//!     32     4  block length B
//!     36     2  key length K
//!     38     2  ETag length E
//!     40     K  object key (UTF-8)
//!   40+K     E  ETag (UTF-8; empty when the store gives none)
//!      T  4×N  CRC32C of each block, T = 40+K+E rounded up to 4, N = ⌈D / B⌉
//!   ....        zero padding
//!    H-4     4  CRC32C of bytes 0..H-4
//! ```
//! The header length keeps the data page-aligned, so reads of a part file are aligned
//! reads of the underlying filesystem. The block length is chosen by measurement (see
//! [`BLOCK_LEN`]) and recorded, so a later version may change it without a new format.

pub const MAGIC: &[u8; 8] = b"SCDLFSPT";
pub const FORMAT_VERSION: u32 = 2;
/// The unit the header length is a multiple of.
const PAGE: usize = 4096;
const FIXED_LEN: usize = 40;
/// A header larger than this is refused on decoding (it would describe a part of more
/// than 16 GiB at 64 KiB blocks): a damaged length must not become a huge allocation.
pub const MAX_HEADER_LEN: usize = 1 << 20;

/// Bytes per checksummed block. 64 KiB: a kernel read of 128 KiB touches two or three
/// blocks, so a read checks at most 64 KiB more than it returns, while the checksum
/// table of an 8 MiB part stays at 512 bytes (measured in `benches`/the report of
/// issue 10: the checks cost a few percent of a warm read).
pub const BLOCK_LEN: u32 = 64 << 10;

/// Where a part's bytes came from: what its file's header records.
#[derive(Clone, Copy, Debug)]
pub struct PartOrigin<'a> {
    pub key: &'a str,
    pub etag: &'a str,
    pub object_offset: u64,
}

/// What a part file's header records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartHeader {
    pub key: String,
    pub etag: String,
    pub object_offset: u64,
    pub data_len: u64,
    pub block_len: u32,
    pub block_crc32c: Vec<u32>,
}

/// Why a part file's header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("shorter than its header")]
    Truncated,
    #[error("bad magic")]
    BadMagic,
    #[error("format version {0}, this daemon reads version {FORMAT_VERSION}")]
    UnknownVersion(u32),
    #[error("header length {0} out of range")]
    BadLength(usize),
    #[error("header checksum mismatch")]
    ChecksumMismatch,
    #[error("fields inconsistent: {0}")]
    Inconsistent(&'static str),
}

impl PartHeader {
    /// The header of `data`, checksummed block by block.
    pub fn of(key: &str, etag: &str, object_offset: u64, data: &[u8]) -> PartHeader {
        PartHeader {
            key: key.to_owned(),
            etag: etag.to_owned(),
            object_offset,
            data_len: data.len() as u64,
            block_len: BLOCK_LEN,
            block_crc32c: data
                .chunks(BLOCK_LEN as usize)
                .map(crc32c::crc32c)
                .collect(),
        }
    }

    /// Whether the key and ETag fit the header's length fields.
    pub fn fits(key: &str, etag: &str) -> bool {
        key.len() <= u16::MAX as usize && etag.len() <= u16::MAX as usize
    }

    fn table_offset(key_len: usize, etag_len: usize) -> usize {
        (FIXED_LEN + key_len + etag_len).next_multiple_of(4)
    }

    /// The header's length on disk: the data starts here.
    pub fn encoded_len(&self) -> usize {
        Self::len_for(self.key.len(), self.etag.len(), self.block_crc32c.len())
    }

    /// The length of the header of a part of `data_len` bytes in [`BLOCK_LEN`] blocks,
    /// known before its data is: where a part file being written puts its data.
    pub fn encoded_len_before_data(key: &str, etag: &str, data_len: u64) -> usize {
        let blocks = data_len.div_ceil(BLOCK_LEN as u64) as usize;
        Self::len_for(key.len(), etag.len(), blocks)
    }

    fn len_for(key_len: usize, etag_len: usize, blocks: usize) -> usize {
        (Self::table_offset(key_len, etag_len) + 4 * blocks + 4).next_multiple_of(PAGE)
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(
            PartHeader::fits(&self.key, &self.etag),
            "caller checks fits()"
        );
        let len = self.encoded_len();
        let mut out = vec![0u8; len];
        out[0..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.object_offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.data_len.to_le_bytes());
        out[32..36].copy_from_slice(&self.block_len.to_le_bytes());
        out[36..38].copy_from_slice(&(self.key.len() as u16).to_le_bytes());
        out[38..40].copy_from_slice(&(self.etag.len() as u16).to_le_bytes());
        let key_end = FIXED_LEN + self.key.len();
        out[FIXED_LEN..key_end].copy_from_slice(self.key.as_bytes());
        out[key_end..key_end + self.etag.len()].copy_from_slice(self.etag.as_bytes());
        let table = Self::table_offset(self.key.len(), self.etag.len());
        for (i, crc) in self.block_crc32c.iter().enumerate() {
            out[table + 4 * i..table + 4 * i + 4].copy_from_slice(&crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[..len - 4]);
        out[len - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The header length a file starting with `prefix` (at least [`PAGE`] bytes, or the
    /// whole file if shorter) declares, so the caller can read the rest of the header.
    pub fn declared_len(prefix: &[u8]) -> Result<usize, HeaderError> {
        if prefix.len() < FIXED_LEN {
            return Err(HeaderError::Truncated);
        }
        if &prefix[0..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u32::from_le_bytes(prefix[8..12].try_into().unwrap());
        if version != FORMAT_VERSION {
            return Err(HeaderError::UnknownVersion(version));
        }
        let len = u32::from_le_bytes(prefix[12..16].try_into().unwrap()) as usize;
        if len == 0 || !len.is_multiple_of(PAGE) || len > MAX_HEADER_LEN {
            return Err(HeaderError::BadLength(len));
        }
        Ok(len)
    }

    /// Decodes a header from the start of a part file.
    pub fn decode(bytes: &[u8]) -> Result<PartHeader, HeaderError> {
        let len = Self::declared_len(bytes)?;
        if bytes.len() < len {
            return Err(HeaderError::Truncated);
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap()) as usize;
        if crc32c::crc32c(&bytes[..len - 4]) != u32_at(len - 4) {
            return Err(HeaderError::ChecksumMismatch);
        }
        let (data_len, block_len) = (u64_at(24), u32_at(32));
        if block_len == 0 {
            return Err(HeaderError::Inconsistent("block length 0"));
        }
        let (key_len, etag_len) = (u16_at(36), u16_at(38));
        let blocks = data_len.div_ceil(block_len as u64);
        let table = Self::table_offset(key_len, etag_len);
        // Checked: a forged header may declare more blocks than any length can hold.
        let declared = blocks
            .checked_mul(4)
            .and_then(|table_len| table_len.checked_add(table as u64 + 4))
            .and_then(|end| end.checked_next_multiple_of(PAGE as u64));
        if declared != Some(len as u64) {
            return Err(HeaderError::Inconsistent(
                "header length does not match its fields",
            ));
        }
        let text = |from: usize, len: usize| {
            String::from_utf8(bytes[from..from + len].to_vec())
                .map_err(|_| HeaderError::Inconsistent("key or ETag not UTF-8"))
        };
        Ok(PartHeader {
            object_offset: u64_at(16),
            data_len,
            block_len,
            block_crc32c: (0..blocks as usize)
                .map(|i| u32_at(table + 4 * i))
                .collect(),
            key: text(FIXED_LEN, key_len)?,
            etag: text(FIXED_LEN + key_len, etag_len)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> PartHeader {
        let data: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
        PartHeader::of("ds/chunk_00001/data.npy", "\"abc\"", 8 << 20, &data)
    }

    /// Fails whenever the layout changes: a changed layout needs a new FORMAT_VERSION.
    #[test]
    fn golden_header_v2() {
        let header = sample();
        assert_eq!(header.block_crc32c.len(), 3);
        let encoded = header.encode();
        assert_eq!(encoded.len(), 4096);
        let mut expected = Vec::new();
        expected.extend_from_slice(b"SCDLFSPT");
        expected.extend_from_slice(&[2, 0, 0, 0, 0, 0x10, 0, 0]);
        expected.extend_from_slice(&[0, 0, 0x80, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&150_000u64.to_le_bytes());
        expected.extend_from_slice(&[0, 0, 1, 0]);
        expected.extend_from_slice(&[23, 0, 5, 0]);
        expected.extend_from_slice(b"ds/chunk_00001/data.npy\"abc\"");
        for crc in [0x0daa_fcdeu32, 0xf143_9ecd, 0x0deb_8fef] {
            expected.extend_from_slice(&crc.to_le_bytes());
        }
        assert_eq!(&encoded[..expected.len()], &expected[..]);
        assert!(encoded[expected.len()..4092].iter().all(|&b| b == 0));
        assert_eq!(
            u32::from_le_bytes(encoded[4092..].try_into().unwrap()),
            919_616_147,
            "header checksum of the golden header"
        );
        assert_eq!(PartHeader::decode(&encoded).unwrap(), sample());
    }

    #[test]
    fn damaged_headers_are_refused() {
        let mut encoded = sample().encode();
        encoded[20] ^= 1;
        assert_eq!(
            PartHeader::decode(&encoded),
            Err(HeaderError::ChecksumMismatch)
        );
        let mut encoded = sample().encode();
        encoded[8] = 1;
        assert_eq!(
            PartHeader::decode(&encoded),
            Err(HeaderError::UnknownVersion(1))
        );
        let encoded = sample().encode();
        assert_eq!(
            PartHeader::decode(&encoded[..100]),
            Err(HeaderError::Truncated)
        );
    }

    #[test]
    fn a_long_key_and_many_blocks_grow_the_header_by_pages() {
        let key = "k".repeat(5000);
        let header = PartHeader::of(&key, "", 0, &vec![7u8; 64 << 20]);
        assert_eq!(header.block_crc32c.len(), 1024);
        let encoded = header.encode();
        assert_eq!(encoded.len(), 3 * 4096);
        assert_eq!(PartHeader::decode(&encoded).unwrap(), header);
    }

    /// Found by the fuzzer: a header whose checksum holds but whose value count, in
    /// blocks of one byte, overflows the arithmetic that checks its length.
    #[test]
    fn a_header_declaring_more_blocks_than_fit_is_refused() {
        let mut bytes = sample().encode();
        let len = bytes.len();
        bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        bytes[32..36].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..len - 4]);
        bytes[len - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            PartHeader::decode(&bytes),
            Err(HeaderError::Inconsistent(_))
        ));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let _ = PartHeader::decode(&bytes);
        }

        #[test]
        fn headers_round_trip(key in "[a-z/]{0,300}", etag in "[a-z0-9\"]{0,40}", offset in any::<u64>(), len in 0usize..300_000) {
            let header = PartHeader::of(&key, &etag, offset, &vec![3u8; len]);
            let encoded = header.encode();
            prop_assert_eq!(encoded.len() % 4096, 0);
            prop_assert_eq!(PartHeader::decode(&encoded).unwrap(), header);
        }
    }
}
