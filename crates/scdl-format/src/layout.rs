//! Names and geometry of SCDL archives: which file holds which array, how a chunked
//! archive names its chunk directories, and which chunk holds which row.

/// The three CSR arrays of an SCDL archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArrayKind {
    Data,
    RowPtr,
    ColPtr,
}

impl ArrayKind {
    pub const ALL: [ArrayKind; 3] = [ArrayKind::Data, ArrayKind::RowPtr, ArrayKind::ColPtr];

    /// The file that holds the array, in an archive's root or a chunk directory.
    pub fn file_name(self) -> &'static str {
        match self {
            ArrayKind::Data => "data.npy",
            ArrayKind::RowPtr => "row_ptr.npy",
            ArrayKind::ColPtr => "col_ptr.npy",
        }
    }

    /// The name `header.sch` records for the array.
    pub fn header_name(self) -> &'static str {
        match self {
            ArrayKind::Data => "DATA",
            ArrayKind::RowPtr => "ROWPTR",
            ArrayKind::ColPtr => "COLPTR",
        }
    }

    /// The array's position in [`ArrayKind::ALL`], the order SCDL writes them in.
    pub fn index(self) -> usize {
        match self {
            ArrayKind::Data => 0,
            ArrayKind::RowPtr => 1,
            ArrayKind::ColPtr => 2,
        }
    }

    pub fn from_file_name(name: &str) -> Option<ArrayKind> {
        ArrayKind::ALL.into_iter().find(|k| k.file_name() == name)
    }

    /// What the array is, for messages.
    pub fn role(self) -> &'static str {
        match self {
            ArrayKind::Data => "value array",
            ArrayKind::RowPtr => "row index",
            ArrayKind::ColPtr => "column index",
        }
    }
}

/// The name of an archive's header file.
pub const HEADER_FILE: &str = "header.sch";

/// In an scdlfs mount's flat view, the directory under a dataset that shows its objects
/// as stored in the chunked layout.
pub const CHUNKED_DIR: &str = ".chunked";

/// The directory name of chunk `index`: `chunk_00042`.
pub fn chunk_dir_name(index: u32) -> String {
    format!("chunk_{index:05}")
}

/// The chunk index a directory name stands for, if it is a chunk directory name.
pub fn parse_chunk_dir_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("chunk_")?;
    if digits.len() < 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index: u32 = digits.parse().ok()?;
    (chunk_dir_name(index) == name).then_some(index)
}

/// How the rows of a chunked archive fall into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkGeometry {
    pub total_rows: u64,
    pub chunk_size: u64,
}

impl ChunkGeometry {
    /// `None` for a zero chunk size, which would place no row anywhere.
    pub fn new(total_rows: u64, chunk_size: u64) -> Option<ChunkGeometry> {
        (chunk_size > 0).then_some(ChunkGeometry {
            total_rows,
            chunk_size,
        })
    }

    pub fn num_chunks(&self) -> u64 {
        self.total_rows.div_ceil(self.chunk_size)
    }

    /// The rows `[start, end)` of chunk `chunk`.
    pub fn chunk_rows(&self, chunk: u64) -> std::ops::Range<u64> {
        let start = (chunk * self.chunk_size).min(self.total_rows);
        let end = ((chunk + 1) * self.chunk_size).min(self.total_rows);
        start..end
    }

    /// The chunks holding rows `rows` (none for an empty range).
    pub fn chunks_of_rows(&self, rows: std::ops::Range<u64>) -> std::ops::Range<u64> {
        if rows.is_empty() {
            return 0..0;
        }
        rows.start / self.chunk_size..(rows.end - 1) / self.chunk_size + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chunk_names_are_five_digits_and_parse_back() {
        assert_eq!(chunk_dir_name(7), "chunk_00007");
        assert_eq!(parse_chunk_dir_name("chunk_00007"), Some(7));
        assert_eq!(chunk_dir_name(123_456), "chunk_123456");
        assert_eq!(parse_chunk_dir_name("chunk_123456"), Some(123_456));
        for bad in [
            "chunk_7",
            "chunk_0007",
            "chunk_000x7",
            "chunk_",
            "data",
            "chunk_012345",
        ] {
            assert_eq!(parse_chunk_dir_name(bad), None, "{bad}");
        }
    }

    /// One row into the chunk after `chunk`, if there is one.
    fn next_end(g: &ChunkGeometry, chunk: u64) -> u64 {
        (g.chunk_rows(chunk).end + 1).min(g.total_rows)
    }

    proptest! {
        #[test]
        fn chunks_tile_the_rows(total in 0u64..10_000, size in 1u64..500) {
            let g = ChunkGeometry::new(total, size).unwrap();
            let mut next = 0;
            for c in 0..g.num_chunks() {
                let rows = g.chunk_rows(c);
                prop_assert_eq!(rows.start, next);
                prop_assert!(!rows.is_empty());
                prop_assert!(rows.end - rows.start <= size);
                for row in [rows.start, rows.end - 1] {
                    prop_assert_eq!(row / size, c, "row {} belongs to chunk {}", row, c);
                }
                prop_assert_eq!(g.chunks_of_rows(rows.clone()), c..c + 1);
                prop_assert_eq!(g.chunks_of_rows(rows.start..next_end(&g, c)), c..(c + 2).min(g.num_chunks()));
                next = rows.end;
            }
            prop_assert_eq!(next, total);
        }
    }
}
