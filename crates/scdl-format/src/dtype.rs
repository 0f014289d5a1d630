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

    /// Every whole element of a little-endian unsigned-integer array, in order. One
    /// match for the whole array, not one an element: decoding and shifting row offsets
    /// element by element through [`Dtype::read_uint`] and [`Dtype::write_uint`] was a
    /// tenth of the daemon's time under plans of single rows.
    ///
    /// # Panics
    /// If the type is not an unsigned integer.
    pub fn read_uints(self, bytes: &[u8]) -> Vec<u64> {
        fn decode<const W: usize>(bytes: &[u8], value: fn([u8; W]) -> u64) -> Vec<u64> {
            bytes
                .chunks_exact(W)
                .map(|entry| value(entry.try_into().unwrap()))
                .collect()
        }
        match self {
            Dtype::U8 => bytes.iter().map(|&b| b as u64).collect(),
            Dtype::U16 => decode(bytes, |b| u16::from_le_bytes(b) as u64),
            Dtype::U32 => decode(bytes, |b| u32::from_le_bytes(b) as u64),
            Dtype::U64 => decode(bytes, u64::from_le_bytes),
            other => panic!("read_uints on {other}"),
        }
    }

    /// Adds `add` to every whole element of a little-endian unsigned-integer array;
    /// `false` (the array then partly changed) if a sum does not fit the type.
    ///
    /// # Panics
    /// If the type is not an unsigned integer.
    pub fn add_to_uints(self, bytes: &mut [u8], add: u64) -> bool {
        fn shift<const W: usize>(
            bytes: &mut [u8],
            add: u64,
            value: fn([u8; W]) -> u64,
            encoded: fn(u64) -> Option<[u8; W]>,
        ) -> bool {
            bytes.chunks_exact_mut(W).all(|entry| {
                let sum = value((&*entry).try_into().unwrap()).checked_add(add);
                sum.and_then(encoded)
                    .map(|sum| entry.copy_from_slice(&sum))
                    .is_some()
            })
        }
        match self {
            Dtype::U8 => shift(
                bytes,
                add,
                |[b]| b as u64,
                |v| Some([u8::try_from(v).ok()?]),
            ),
            Dtype::U16 => shift(
                bytes,
                add,
                |b| u16::from_le_bytes(b) as u64,
                |v| u16::try_from(v).ok().map(u16::to_le_bytes),
            ),
            Dtype::U32 => shift(
                bytes,
                add,
                |b| u32::from_le_bytes(b) as u64,
                |v| u32::try_from(v).ok().map(u32::to_le_bytes),
            ),
            Dtype::U64 => shift(bytes, add, u64::from_le_bytes, |v| Some(v.to_le_bytes())),
            other => panic!("add_to_uints on {other}"),
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
        /// The whole-array forms agree with the element-by-element ones.
        #[test]
        fn whole_arrays_read_and_shift_as_their_elements_do(
            values in proptest::collection::vec(any::<u64>(), 0..40),
            add in prop_oneof![0u64..300, any::<u64>()],
        ) {
            for dtype in [Dtype::U8, Dtype::U16, Dtype::U32, Dtype::U64] {
                let width = dtype.size().unwrap() as usize;
                let mut bytes = vec![0u8; values.len() * width + width - 1];
                let fitting: Vec<u64> = values
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| if dtype.write_uint(&mut bytes, i, v) { v } else { 0 })
                    .collect();
                prop_assert_eq!(dtype.read_uints(&bytes), fitting.clone());
                let each_fits = fitting.iter().all(|&v| {
                    v.checked_add(add).is_some_and(|s| Dtype::smallest_uint_for(s).size() <= dtype.size())
                });
                prop_assert_eq!(dtype.add_to_uints(&mut bytes, add), each_fits);
                if each_fits {
                    let shifted: Vec<u64> = fitting.iter().map(|v| v + add).collect();
                    prop_assert_eq!(dtype.read_uints(&bytes), shifted);
                }
            }
        }

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
