//! What a part is, for every layer that names one: the ids of objects, groups and parts
//! (the catalog hands them out, the fetcher and the cache key by them) and the geometry
//! of fixed-length spans of bytes, used for parts of an object (`--read-part-size`) and
//! for the checksummed blocks inside a part file alike.

use std::ops::Range;

/// Identifies an object within one mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u64);

/// Identifies a group of parts that are cached and evicted together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

/// One fetch unit: part `index` of an object (bytes `index * part_size ..`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartKey {
    pub object: ObjectId,
    pub index: u64,
}

/// The indices of the `span_len`-byte spans that bytes `range` fall in (none if the
/// range is empty).
pub fn spans_touched(range: &Range<u64>, span_len: u64) -> Range<u64> {
    if range.is_empty() {
        return 0..0;
    }
    range.start / span_len..(range.end - 1) / span_len + 1
}

/// The bytes span `index` holds of `total_len` bytes cut into `span_len`-byte spans.
pub fn span(index: u64, span_len: u64, total_len: u64) -> Range<u64> {
    let start = index * span_len;
    start..(start + span_len).min(total_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn spans_touched_are_exactly_the_spans_overlapping_the_range(start in 0u64..10_000, len in 0u64..10_000, span_len in 1u64..3000) {
            let range = start..start + len;
            let touched = spans_touched(&range, span_len);
            for index in 0..(20_000 / span_len + 2) {
                let bytes = span(index, span_len, u64::MAX);
                let overlaps = !range.is_empty() && bytes.start < range.end && range.start < bytes.end;
                prop_assert_eq!(touched.contains(&index), overlaps, "span {}", index);
            }
        }

        #[test]
        fn spans_tile_the_bytes(span_len in 1u64..3000, total in 0u64..20_000) {
            let mut next = 0;
            for index in spans_touched(&(0..total), span_len) {
                let bytes = span(index, span_len, total);
                prop_assert_eq!(bytes.start, next);
                prop_assert!(!bytes.is_empty() && bytes.end - bytes.start <= span_len);
                next = bytes.end;
            }
            prop_assert_eq!(next, total);
        }
    }
}
