//! Sets of integers kept as sorted, disjoint, non-adjacent ranges, with the count of
//! members before each range: the rows of a subset, the chunks that hold them, the
//! units a cache-aware epoch reads first. A set of whole chunks of a 10^8-row dataset
//! costs one range per run of chunks, and "the `n`-th member", "how many members lie
//! below `x`" and their counterparts for non-members are binary searches, which is
//! what lets an order find the unit at any position of an epoch without listing the
//! epoch.

use std::ops::Range;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    ranges: Vec<Range<u64>>,
    /// `starts[i]`: how many members lie before `ranges[i]`.
    starts: Vec<u64>,
    len: u64,
}

impl RangeSet {
    /// The members of `ranges`, in any order, overlapping or not; empty ranges are
    /// ignored.
    pub(crate) fn from_ranges(ranges: impl IntoIterator<Item = Range<u64>>) -> RangeSet {
        let mut sorted: Vec<Range<u64>> = ranges.into_iter().filter(|r| r.start < r.end).collect();
        sorted.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
        for range in sorted {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        let mut starts = Vec::with_capacity(merged.len());
        let mut len = 0;
        for range in &merged {
            starts.push(len);
            len += range.end - range.start;
        }
        RangeSet {
            ranges: merged,
            starts,
            len,
        }
    }

    pub(crate) fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// `starts()[i]`: how many members lie before `ranges()[i]`.
    pub(crate) fn starts(&self) -> &[u64] {
        &self.starts
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn contains(&self, x: u64) -> bool {
        let after = self.ranges.partition_point(|r| r.start <= x);
        after > 0 && x < self.ranges[after - 1].end
    }

    /// How many members are below `x`.
    pub(crate) fn rank(&self, x: u64) -> u64 {
        let i = self.ranges.partition_point(|r| r.end <= x);
        match self.ranges.get(i) {
            Some(r) => self.starts[i] + x.saturating_sub(r.start),
            None => self.len,
        }
    }

    /// The member with `n` members below it (`n` below [`RangeSet::len`]).
    pub(crate) fn nth(&self, n: u64) -> u64 {
        let i = self.starts.partition_point(|&s| s <= n) - 1;
        self.ranges[i].start + (n - self.starts[i])
    }

    /// The non-member (of the naturals) with `n` non-members below it.
    pub(crate) fn nth_outside(&self, n: u64) -> u64 {
        // Range i has `start - starts[i]` non-members below it, a count that grows with
        // i; the ranges where it is at most `n` lie wholly below the answer.
        let (mut below, mut above) = (0, self.ranges.len());
        while below < above {
            let mid = (below + above) / 2;
            if self.ranges[mid].start - self.starts[mid] <= n {
                below = mid + 1;
            } else {
                above = mid;
            }
        }
        n + self.starts.get(below).copied().unwrap_or(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every query agrees with the set listed member by member.
        #[test]
        fn queries_agree_with_the_listed_members(
            given in proptest::collection::vec((0u64..300, 0u64..40), 0..10),
        ) {
            let set = RangeSet::from_ranges(given.iter().map(|&(s, l)| s..s + l));
            let members: Vec<u64> = (0..400).filter(|x| given.iter().any(|&(s, l)| (s..s + l).contains(x))).collect();
            let outside: Vec<u64> = (0..400).filter(|x| !members.contains(x)).collect();
            prop_assert_eq!(set.len(), members.len() as u64);
            for (n, &m) in members.iter().enumerate() {
                prop_assert_eq!(set.nth(n as u64), m);
            }
            for (n, &m) in outside.iter().enumerate() {
                prop_assert_eq!(set.nth_outside(n as u64), m);
            }
            for x in 0..400 {
                prop_assert_eq!(set.contains(x), members.contains(&x));
                prop_assert_eq!(set.rank(x), members.iter().filter(|&&m| m < x).count() as u64);
            }
            for pair in set.ranges().windows(2) {
                prop_assert!(pair[0].end < pair[1].start);
            }
        }
    }
}
