//! The on-disk format of one cached part, version 1.
//!
//! A part file is a 4096-byte header followed by the part's bytes. The header makes the
//! file self-describing: it names the object (key and pinned ETag) and the part's place
//! in it, and carries CRC32C checksums of the data and of the header itself, so that a
//! daemon can re-adopt a cache after a restart without a format change. This version
//! does not re-adopt yet: it starts every mount with an empty cache, and reads part
//! files only through the handles it opened when writing them.
//!
//! ```text
//! offset  size  field (integers little-endian)
//!      0     8  magic "SCDLFSPT"
//!      8     4  format version (1)
//!     12     4  header length (4096)
//!     16     8  offset of the part in the object
//!     24     8  data length
//!     32     4  CRC32C of the data
//!     36     2  key length K
//!     38     2  ETag length E
//!     40     K  object key (UTF-8)
//!   40+K     E  ETag (UTF-8; empty when the store gives none)
//!   ....        zero padding
//!   4092     4  CRC32C of bytes 0..4092
//! ```
//! The header length keeps the data page-aligned, so reads of a part file are aligned
//! reads of the underlying filesystem.

pub const MAGIC: &[u8; 8] = b"SCDLFSPT";
pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_LEN: usize = 4096;
const FIXED_LEN: usize = 40;

/// What a part file's header records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartHeader {
    pub key: String,
    pub etag: String,
    pub object_offset: u64,
    pub data_len: u64,
    pub data_crc32c: u32,
}

impl PartHeader {
    /// Whether the key and ETag fit the fixed-size header.
    pub fn fits(key: &str, etag: &str) -> bool {
        FIXED_LEN + key.len() + etag.len() <= HEADER_LEN - 4
            && key.len() <= u16::MAX as usize
            && etag.len() <= u16::MAX as usize
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        assert!(
            PartHeader::fits(&self.key, &self.etag),
            "caller checks fits()"
        );
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.object_offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.data_len.to_le_bytes());
        out[32..36].copy_from_slice(&self.data_crc32c.to_le_bytes());
        out[36..38].copy_from_slice(&(self.key.len() as u16).to_le_bytes());
        out[38..40].copy_from_slice(&(self.etag.len() as u16).to_le_bytes());
        let key_end = FIXED_LEN + self.key.len();
        out[FIXED_LEN..key_end].copy_from_slice(self.key.as_bytes());
        out[key_end..key_end + self.etag.len()].copy_from_slice(self.etag.as_bytes());
        let crc = crc32c::crc32c(&out[..HEADER_LEN - 4]);
        out[HEADER_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a header; the golden test holds encoder and decoder to the format.
    #[cfg(test)]
    pub fn decode(bytes: &[u8]) -> std::io::Result<PartHeader> {
        let bad = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("part file: {what}"),
            )
        };
        if bytes.len() < HEADER_LEN {
            return Err(bad("shorter than its header"));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap()) as usize;
        if &bytes[0..8] != MAGIC {
            return Err(bad("bad magic"));
        }
        if u32_at(8) != FORMAT_VERSION || u32_at(12) as usize != HEADER_LEN {
            return Err(bad("unknown format version"));
        }
        if crc32c::crc32c(&bytes[..HEADER_LEN - 4]) != u32_at(HEADER_LEN - 4) {
            return Err(bad("header checksum mismatch"));
        }
        let (key_len, etag_len) = (u16_at(36), u16_at(38));
        if FIXED_LEN + key_len + etag_len > HEADER_LEN - 4 {
            return Err(bad("key and ETag overflow the header"));
        }
        let text = |from: usize, len: usize| {
            String::from_utf8(bytes[from..from + len].to_vec())
                .map_err(|_| bad("key or ETag not UTF-8"))
        };
        Ok(PartHeader {
            object_offset: u64_at(16),
            data_len: u64_at(24),
            data_crc32c: u32_at(32),
            key: text(FIXED_LEN, key_len)?,
            etag: text(FIXED_LEN + key_len, etag_len)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PartHeader {
        PartHeader {
            key: "ds/chunk_00001/data.npy".into(),
            etag: "\"abc\"".into(),
            object_offset: 8 << 20,
            data_len: 1234,
            data_crc32c: crc32c::crc32c(b"payload"),
        }
    }

    /// Fails whenever the layout changes: a changed layout needs a new FORMAT_VERSION.
    #[test]
    fn golden_header_v1() {
        let encoded = sample().encode();
        let mut expected = Vec::new();
        expected.extend_from_slice(b"SCDLFSPT");
        expected.extend_from_slice(&[1, 0, 0, 0, 0, 0x10, 0, 0]);
        expected.extend_from_slice(&[0, 0, 0x80, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&[0xd2, 0x04, 0, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&crc32c::crc32c(b"payload").to_le_bytes());
        expected.extend_from_slice(&[23, 0, 5, 0]);
        expected.extend_from_slice(b"ds/chunk_00001/data.npy\"abc\"");
        assert_eq!(&encoded[..expected.len()], &expected[..]);
        assert!(encoded[expected.len()..HEADER_LEN - 4]
            .iter()
            .all(|&b| b == 0));
        assert_eq!(
            u32::from_le_bytes(encoded[HEADER_LEN - 4..].try_into().unwrap()),
            1_001_252_473,
            "header checksum of the golden header"
        );
        assert_eq!(PartHeader::decode(&encoded).unwrap(), sample());
    }

    #[test]
    fn damaged_headers_are_refused() {
        let mut encoded = sample().encode();
        encoded[20] ^= 1;
        assert!(PartHeader::decode(&encoded).is_err());
        let mut encoded = sample().encode();
        encoded[8] = 2;
        assert!(PartHeader::decode(&encoded).is_err());
        assert!(PartHeader::decode(&encoded[..100]).is_err());
    }
}
