//! `scdlfs chunk SOURCE TARGET`: partition a monolithic archive from a local folder or
//! any store into the chunked layout at any store (see [`crate::chunker`]). Ctrl-C
//! stops between parts, aborting the uploads in flight; running the same command again
//! resumes.

use anyhow::{anyhow, Context};
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::StoreArgs;
use crate::chunker::{ChunkError, ChunkJob, ChunkOptions, Location};
use crate::store::Source;
use crate::units::{format_size, parse_size};

#[derive(Args, Debug)]
pub struct ChunkArgs {
    /// The monolithic archive (header.sch backend 1): a local folder or a store URL, or
    /// env:VAR to read it from the variable VAR (a URL with a password).
    pub source: String,
    /// Where the chunked archive goes: an empty local folder or store prefix (or one an
    /// interrupted run of the same job left); env:VAR as for SOURCE.
    pub target: String,
    /// Rows per chunk.
    #[arg(long, default_value_t = 8192)]
    pub chunk_rows: u32,

    /// Bytes per multipart part; objects up to this size go in one PUT.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "8MiB", help_heading = "Performance")]
    pub part_size: u64,
    /// Objects uploaded at once, each with two parts in flight.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 4,
        help_heading = "Performance"
    )]
    pub objects_in_flight: usize,

    /// Also read back every uploaded object and compare its checksum (the row
    /// offsets always are).
    #[arg(long)]
    pub verify_data: bool,
    /// No progress output.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    #[command(flatten)]
    pub store: StoreArgs,
}

pub fn run(args: ChunkArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start")?;
    let cancel = CancellationToken::new();
    let on_interrupt = cancel.clone();
    runtime.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("scdlfs chunk: interrupted; stopping the uploads in flight");
            on_interrupt.cancel();
        }
    });
    let options = ChunkOptions {
        part_size: usize::try_from(args.part_size)
            .map_err(|_| anyhow!("--part-size is too large"))?,
        objects_in_flight: args.objects_in_flight,
        verify_data: args.verify_data,
        quiet: args.quiet,
    };
    let settings = args.store.client_settings();
    let (source_text, target_text) = (
        super::resolve_source(&args.source)?,
        super::resolve_source(&args.target)?,
    );
    let open = |text: &str| -> anyhow::Result<Location> {
        let source = Source::parse(text).with_context(|| text.to_owned())?;
        let (store, prefix) = runtime
            .block_on(source.open(&settings))
            .with_context(|| text.to_owned())?;
        Ok(Location { store, prefix })
    };
    let job = runtime
        .block_on(ChunkJob::prepare(open(&source_text)?, args.chunk_rows))
        .map_err(anyhow::Error::msg)?;
    // Only a source that passed its checks gets a target folder made for it.
    if let Source::Local { root } = Source::parse(&target_text).map_err(anyhow::Error::msg)? {
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
    }
    let target_shown = crate::store::redact::redact(&target_text);
    let report = runtime
        .block_on(job.run(open(&target_text)?, &options, cancel))
        .map_err(|error| match error {
            ChunkError::TargetOccupied(_) => anyhow!("{target_shown}: {error}"),
            _ if error.resumable() => anyhow!("{error}; run the same command again to resume"),
            _ => anyhow!("{error}"),
        })?;
    if report.already_published {
        println!(
            "{} already holds this dataset ({} rows in {} chunks); nothing to do",
            target_shown, report.rows, report.chunks
        );
    } else {
        println!(
            "chunked {} rows into {} chunks at {}: uploaded {} objects ({}), reused {}; \
             verified sizes and ETags of all {} objects and the checksums of {} read back; \
             header.sch published",
            report.rows,
            report.chunks,
            target_shown,
            report.uploaded_objects,
            format_size(report.uploaded_bytes),
            report.reused_objects,
            report.objects,
            report.read_back_objects,
        );
    }
    Ok(())
}
