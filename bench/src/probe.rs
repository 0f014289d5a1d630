//! The S3 server's own ceiling (so that the results say whether the server or the
//! emulated link bounds them), and uploads for servers that do not serve a folder.
//! Explicit dummy keys always: no client here ever asks a metadata service.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload};

fn store(endpoint: &str, bucket: &str) -> Result<Arc<dyn ObjectStore>, String> {
    Ok(Arc::new(
        AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_endpoint(endpoint)
            .with_region("us-east-1")
            .with_access_key_id("bench")
            .with_secret_access_key("benchbench")
            .with_virtual_hosted_style_request(false)
            .with_client_options(ClientOptions::new().with_allow_http(true))
            .build()
            .map_err(|e| e.to_string())?,
    ))
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

#[derive(Args)]
pub struct ProbeArgs {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    bucket: String,
    #[arg(long, default_value = "")]
    prefix: String,
    /// Ranged GETs in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Bytes per ranged GET.
    #[arg(long, default_value_t = 8 << 20)]
    part_size: u64,
    /// Stop after this many bytes (MB).
    #[arg(long, default_value_t = 600)]
    max_mb: u64,
}

pub fn run(args: ProbeArgs) -> Result<(), String> {
    let store = store(&args.endpoint, &args.bucket)?;
    runtime()?.block_on(async {
        let prefix = ObjectPath::from(args.prefix.as_str());
        let objects: Vec<_> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| e.to_string())?;
        let mut ranges = Vec::new();
        let mut total = 0;
        'objects: for object in &objects {
            let mut at = 0;
            while at < object.size {
                let end = (at + args.part_size).min(object.size);
                ranges.push((object.location.clone(), at..end));
                total += end - at;
                at = end;
                if total >= args.max_mb * 1_000_000 {
                    break 'objects;
                }
            }
        }
        let started = Instant::now();
        let fetched: u64 = futures::stream::iter(ranges)
            .map(|(path, range)| {
                let store = store.clone();
                async move {
                    store
                        .get_range(&path, range)
                        .await
                        .map(|b| b.len() as u64)
                        .map_err(|e| e.to_string())
                }
            })
            .buffer_unordered(args.concurrency)
            .try_fold(0, |a, b| async move { Ok(a + b) })
            .await?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{{\"bytes\": {fetched}, \"seconds\": {seconds:.3}, \"mb_per_s\": {:.1}, \"concurrency\": {}, \"part_size\": {}}}",
            fetched as f64 / seconds / 1e6,
            args.concurrency,
            args.part_size
        );
        Ok(())
    })
}

#[derive(Args)]
pub struct UploadArgs {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    bucket: String,
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    src: PathBuf,
}

pub fn upload(args: UploadArgs) -> Result<(), String> {
    let store = store(&args.endpoint, &args.bucket)?;
    let mut files = Vec::new();
    let mut stack = vec![args.src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    runtime()?.block_on(async {
        futures::stream::iter(files)
            .map(|path| {
                let store = store.clone();
                let key = format!(
                    "{}/{}",
                    args.prefix.trim_end_matches('/'),
                    path.strip_prefix(&args.src).unwrap().display()
                );
                async move {
                    let bytes = tokio::fs::read(&path).await.map_err(|e| e.to_string())?;
                    store
                        .put(&ObjectPath::from(key.as_str()), PutPayload::from(bytes))
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("{key}: {e}"))
                }
            })
            .buffer_unordered(4)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    })
}
