//! `scdlfs-bench`: the Rust half of the benchmark suite (bench/run.py drives it).
//!
//! * `gen`: a synthetic chunked dataset and the digest of every row, from (seed, row);
//! * `read`: one epoch of one order over a dataset directory (a scdlfs flat view, or
//!   any chunked layout: local disk, s3fs-fuse, rclone, the raw view), every row
//!   checked against its digest, figures as JSON;
//! * `order`: an epoch's steps as the sampler makes them, for the Python loader;
//! * `proxy`: the emulated cloud link between every client and the S3 server;
//! * `s3probe`: the S3 server's own ceiling for ranged GETs;
//! * `upload`: a dataset into a bucket (for servers that do not serve a folder);
//! * `plot`: the PNG figure of docs/benchmarks.md.

mod gen;
mod lockstep;
mod plot;
mod probe;
mod proxy;
mod read;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "scdlfs-bench",
    about = "Benchmark tools for scdlfs (driven by bench/run.py)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic chunked dataset and its row digests.
    Gen(gen::GenArgs),
    /// Read one epoch through a dataset directory and print the figures as JSON.
    Read(read::ReadArgs),
    /// Write an epoch's steps (rows in visiting order) for the Python loader.
    Order(read::OrderArgs),
    /// Forward TCP to an S3 server, adding latency per response and a shared bandwidth cap.
    Proxy(proxy::ProxyArgs),
    /// Measure an S3 server's throughput for ranged GETs of a prefix's objects.
    S3probe(probe::ProbeArgs),
    /// Upload a directory to a bucket under a prefix.
    Upload(probe::UploadArgs),
    /// Draw the benchmark figure from a summary JSON.
    Plot(plot::PlotArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Gen(args) => gen::run(args),
        Command::Read(args) => read::run(args),
        Command::Order(args) => read::order(args),
        Command::Proxy(args) => proxy::run(args),
        Command::S3probe(args) => probe::run(args),
        Command::Upload(args) => probe::upload(args),
        Command::Plot(args) => plot::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("scdlfs-bench: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}
