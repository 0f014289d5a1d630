//! `scdlfs manifest DATASET`: write the manifest of a chunked dataset that another tool
//! chunked (see [`crate::chunker::manifest`]), so that a mount opens it with one GET
//! instead of listing its objects. `scdlfs chunk` writes one itself.

use anyhow::Context;
use clap::Args;

use super::StoreArgs;
use crate::chunker::manifest::write_for_published;
use crate::chunker::Location;
use crate::store::Source;
use crate::units::format_size;

#[derive(Args, Debug)]
pub struct ManifestArgs {
    /// The chunked dataset, the directory of its header.sch: a store URL or a local
    /// folder, or env:VAR to read it from the variable VAR (a URL with a password).
    pub dataset: String,

    #[command(flatten)]
    pub store: StoreArgs,
}

pub fn run(args: ManifestArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start")?;
    let settings = args.store.client_settings();
    let text = super::resolve_source(&args.dataset)?;
    let source = Source::parse(&text).with_context(|| text.clone())?;
    let (store, prefix) = runtime
        .block_on(source.open(&settings))
        .with_context(|| text.clone())?;
    let report = runtime
        .block_on(write_for_published(Location { store, prefix }))
        .map_err(anyhow::Error::msg)?;
    println!(
        "wrote the manifest of {} ({} rows in {} chunks): {} objects, {}",
        crate::store::redact::redact(&text),
        report.rows,
        report.chunks,
        report.objects,
        format_size(report.bytes as u64),
    );
    Ok(())
}
