//! The benchmark dataset: `SyntheticDataset` rows of realistic length (genes and values
//! per cell as in 10x-style atlases), written chunked, plus a table of one digest per
//! row computed from the generator (not from the files), which every reader checks.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use scdlfs::synthetic::SyntheticDataset;
use serde::{Deserialize, Serialize};

#[derive(Args)]
pub struct GenArgs {
    /// The chunked dataset directory to write (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// Where to write the row digests (u64 little-endian per row) and, beside them with
    /// `.json` appended, the dataset's description.
    #[arg(long)]
    digests: PathBuf,
    /// Approximate dataset size in MB (10^6 bytes).
    #[arg(long, default_value_t = 1500)]
    size_mb: u64,
    /// Average stored values per row (rows range from half to one and a half times it).
    #[arg(long, default_value_t = 1000)]
    mean_values: u32,
    #[arg(long, default_value_t = 20_000)]
    genes: u32,
    #[arg(long, default_value_t = 4096)]
    chunk_rows: u32,
    #[arg(long, default_value_t = 2026)]
    seed: u64,
}

/// What `gen` wrote, for the driver and the Python loader.
#[derive(Serialize, Deserialize)]
pub struct DatasetInfo {
    pub rows: u64,
    pub genes: u32,
    pub chunk_rows: u32,
    pub mean_values: u32,
    pub seed: u64,
    pub values: u64,
    pub bytes: u64,
    pub num_chunks: u64,
}

/// A row's digest: CRC-32 of its values' bytes, and of its column ids' bytes, as stored.
pub fn digest(values: &[u8], columns: &[u8]) -> u64 {
    crc32fast::hash(values) as u64 | (crc32fast::hash(columns) as u64) << 32
}

pub fn run(args: GenArgs) -> Result<(), String> {
    // Bytes per row: values (f32) and column ids (u16 for up to 65,536 genes).
    let spec0 = SyntheticDataset {
        rows: 1,
        genes: args.genes,
        chunk_rows: args.chunk_rows,
        mean_values: args.mean_values,
        seed: args.seed,
    };
    let per_value = 4 + spec0.column_dtype().size().unwrap();
    let rows = (args.size_mb * 1_000_000 / (args.mean_values as u64 * per_value)).max(1);
    let spec = SyntheticDataset { rows, ..spec0 };
    let started = Instant::now();
    spec.write_chunked(&args.out).map_err(|e| e.to_string())?;
    let write_s = started.elapsed().as_secs_f64();

    let col_dtype = spec.column_dtype();
    let width = col_dtype.size().unwrap() as usize;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let per = rows.div_ceil(threads);
    let parts: Vec<(Vec<u8>, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let (first, last) = ((t * per).min(rows), ((t + 1) * per).min(rows));
                    let mut out = Vec::with_capacity(((last - first) * 8) as usize);
                    let mut values = 0u64;
                    for r in first..last {
                        let row = spec.row(r);
                        let v: Vec<u8> = row.values.iter().flat_map(|x| x.to_le_bytes()).collect();
                        let mut c = vec![0u8; row.columns.len() * width];
                        for (i, col) in row.columns.iter().enumerate() {
                            col_dtype.write_uint(&mut c, i, *col as u64);
                        }
                        out.extend_from_slice(&digest(&v, &c).to_le_bytes());
                        values += row.columns.len() as u64;
                    }
                    (out, values)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let values: u64 = parts.iter().map(|p| p.1).sum();
    let table: Vec<u8> = parts.into_iter().flat_map(|p| p.0).collect();
    std::fs::write(&args.digests, &table).map_err(|e| e.to_string())?;
    let info = DatasetInfo {
        rows,
        genes: spec.genes,
        chunk_rows: spec.chunk_rows,
        mean_values: spec.mean_values,
        seed: spec.seed,
        values,
        bytes: scdlfs::synthetic::stored_bytes(&args.out),
        num_chunks: rows.div_ceil(spec.chunk_rows as u64),
    };
    let json = serde_json::to_string_pretty(&info).unwrap();
    let mut info_path = args.digests.clone().into_os_string();
    info_path.push(".json");
    std::fs::write(&info_path, &json).map_err(|e| e.to_string())?;
    eprintln!(
        "wrote {} rows, {} values, {:.2} GB in {} chunks ({:.1} s to write, {:.1} s in all)",
        rows,
        values,
        info.bytes as f64 / 1e9,
        info.num_chunks,
        write_s,
        started.elapsed().as_secs_f64()
    );
    println!("{json}");
    Ok(())
}
