//! Element types of SCDL arrays, with the codes `header.sch` stores for them.

use std::fmt;

/// The element type of an SCDL array (the `u32` dtype code of `header.sch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
    String,
    FixedString,
}

impl Dtype {
    /// The code `header.sch` stores for this type.
    pub fn code(self) -> u32 {
        match self {
            Dtype::U8 => 1,
            Dtype::U16 => 2,
            Dtype::U32 => 3,
            Dtype::U64 => 4,
            Dtype::F16 => 5,
            Dtype::F32 => 6,
            Dtype::F64 => 7,
            Dtype::String => 8,
            Dtype::FixedString => 9,
        }
    }

    pub fn from_code(code: u32) -> Option<Dtype> {
        Some(match code {
            1 => Dtype::U8,
            2 => Dtype::U16,
            3 => Dtype::U32,
            4 => Dtype::U64,
            5 => Dtype::F16,
            6 => Dtype::F32,
            7 => Dtype::F64,
            8 => Dtype::String,
            9 => Dtype::FixedString,
            _ => return None,
        })
    }

    /// Bytes per element of a raw array of this type; `None` for the string types,
    /// which never back a raw array.
    pub fn size(self) -> Option<u64> {
        match self {
            Dtype::U8 => Some(1),
            Dtype::U16 | Dtype::F16 => Some(2),
            Dtype::U32 | Dtype::F32 => Some(4),
            Dtype::U64 | Dtype::F64 => Some(8),
            Dtype::String | Dtype::FixedString => None,
        }
    }

    /// Whether this is an unsigned integer type, the only kind an index array may have.
    pub fn is_unsigned_int(self) -> bool {
        matches!(self, Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64)
    }

    /// Reads element `index` of a little-endian unsigned-integer array.
    ///
    /// # Panics
    /// If the type is not an unsigned integer or the slice is too short; callers size
    /// their buffers from [`Dtype::size`].
    pub fn read_uint(self, bytes: &[u8], index: usize) -> u64 {
        let width = self.size().expect("read_uint on a string dtype") as usize;
        let at = &bytes[index * width..(index + 1) * width];
        match self {
            Dtype::U8 => at[0] as u64,
            Dtype::U16 => u16::from_le_bytes([at[0], at[1]]) as u64,
            Dtype::U32 => u32::from_le_bytes(at.try_into().unwrap()) as u64,
            Dtype::U64 => u64::from_le_bytes(at.try_into().unwrap()),
            other => panic!("read_uint on {other}"),
        }
    }

    /// Writes `value` as element `index` of a little-endian unsigned-integer array;
    /// `false` when the value does not fit the type.
    pub fn write_uint(self, bytes: &mut [u8], index: usize, value: u64) -> bool {
        let width = self.size().expect("write_uint on a string dtype") as usize;
        let at = &mut bytes[index * width..(index + 1) * width];
        match self {
            Dtype::U8 => u8::try_from(value)
                .map(|v| at.copy_from_slice(&[v]))
                .is_ok(),
            Dtype::U16 => u16::try_from(value)
                .map(|v| at.copy_from_slice(&v.to_le_bytes()))
                .is_ok(),
            Dtype::U32 => u32::try_from(value)
                .map(|v| at.copy_from_slice(&v.to_le_bytes()))
                .is_ok(),
            Dtype::U64 => {
                at.copy_from_slice(&value.to_le_bytes());
                true
            }
            other => panic!("write_uint on {other}"),
        }
    }

    /// The smallest unsigned type that holds `max_value`, as the SCDL writer downcasts.
    pub fn smallest_uint_for(max_value: u64) -> Dtype {
        if max_value <= u8::MAX as u64 {
            Dtype::U8
        } else if max_value <= u16::MAX as u64 {
            Dtype::U16
        } else if max_value <= u32::MAX as u64 {
            Dtype::U32
        } else {
            Dtype::U64
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::String => "string",
            Dtype::FixedString => "fixed_string",
        };
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codes_round_trip() {
        for code in 1..=9 {
            assert_eq!(Dtype::from_code(code).unwrap().code(), code);
        }
        assert_eq!(Dtype::from_code(0), None);
        assert_eq!(Dtype::from_code(10), None);
    }

    #[test]
    fn smallest_uint_matches_the_writer_downcast() {
        assert_eq!(Dtype::smallest_uint_for(255), Dtype::U8);
        assert_eq!(Dtype::smallest_uint_for(256), Dtype::U16);
        assert_eq!(Dtype::smallest_uint_for(65_536), Dtype::U32);
        assert_eq!(Dtype::smallest_uint_for(1 << 32), Dtype::U64);
    }

    proptest! {
        #[test]
        fn uint_write_then_read(value in any::<u64>(), index in 0usize..4) {
            for dtype in [Dtype::U8, Dtype::U16, Dtype::U32, Dtype::U64] {
                let mut buf = vec![0u8; 4 * dtype.size().unwrap() as usize];
                let fits = dtype.write_uint(&mut buf, index, value);
                prop_assert_eq!(fits, Dtype::smallest_uint_for(value).size() <= dtype.size());
                if fits {
                    prop_assert_eq!(dtype.read_uint(&buf, index), value);
                }
            }
        }
    }
}
