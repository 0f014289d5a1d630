//! The object client: where the bytes come from.
//!
//! scdlfs talks to every backend through one trait, `object_store::ObjectStore`. This
//! module turns a user's SOURCE (`s3://`, `gs://`, `http(s)://`, `file://` or a plain
//! path) into such a store plus the key prefix under which the mount's tree lives, with
//! credentials taken the way each cloud's own tools take them: for S3 the AWS SDK's
//! loaders ([`aws`]), for GCS object_store's own service-account and application
//! default credentials.
//!
//! Beside it, behind the `test-support` feature (so the daemon is built without them),
//! live the test doubles that wrap any store: `counting` counts requests, `throttled`
//! adds latency and a bandwidth cap, `faulty` injects failures, all through [`wrapper`].
//! The tests use them; the daemon never does, but it uses the wrapper itself, for
//! two hooks: the timing of its GETs (`mount::assemble`), and on every network store
//! [`short_answers`]' hook, a ranged GET answered with less than its range asked
//! again, which object_store's retry layer does not do. S3 and GCS list a directory
//! page by page ([`paged_listings`]), no further than the catalog's cap on entries,
//! each page that brings entries telling the listing's waiters that it advances
//! ([`listing_progress`]).

pub(crate) mod aws;
pub(crate) mod bounds;
#[cfg(any(test, feature = "test-support"))]
pub mod counting;
#[cfg(any(test, feature = "test-support"))]
pub mod faulty;
pub(crate) mod listing_progress;
pub(crate) mod paged_listings;
pub(crate) mod redact;
pub(crate) mod short_answers;
#[cfg(any(test, feature = "test-support"))]
pub mod throttled;
pub mod wrapper;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use object_store::aws::AmazonS3Builder;
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::list::PaginatedListStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore};
use paged_listings::PagedListings;

pub use bounds::NetworkBounds;
pub use redact::redact_urls;

use short_answers::{AskAgainWhenShort, SHORT_ANSWER_TRIES};
use wrapper::HookedStore;

/// Where a mount's objects live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    S3 {
        bucket: String,
        prefix: String,
    },
    Gcs {
        bucket: String,
        prefix: String,
    },
    /// `origin` is `scheme://host[:port]`; `prefix` the URL's path, where the tree lives.
    /// object_store's HTTP store names listed objects by their path from the server's
    /// root, so it is given the origin and the path goes in as the key prefix (given a
    /// URL with a path, it would fetch listed objects under that path twice).
    Http {
        origin: String,
        prefix: String,
    },
    Local {
        root: PathBuf,
    },
}

/// Options that shape the client, from the command line.
#[derive(Clone, Debug, Default)]
pub struct ClientSettings {
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    pub no_sign_request: bool,
    /// S3: the AWS profile to take credentials and region from.
    pub profile: Option<String>,
    /// S3: the requester pays for the requests and downloads.
    pub requester_pays: bool,
    /// S3: `https://s3.REGION.amazonaws.com/BUCKET/KEY` instead of `BUCKET.s3...`.
    pub force_path_style: bool,
    /// S3: the account that must own the bucket.
    pub expected_bucket_owner: Option<String>,
    /// GCS: a service-account key file.
    pub key_file: Option<PathBuf>,
    /// GCS: the project billed for requests to a requester-pays bucket.
    pub billing_project: Option<String>,
    pub bounds: NetworkBounds,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("unsupported source {0:?}: use s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, http(s)://HOST/PREFIX, file:///PATH or a local path")]
    Unsupported(String),
    #[error("source {given:?} is a malformed URL: did you mean {meant:?}?")]
    MalformedUrl { given: String, meant: String },
    #[error("source {0:?} is neither a URL nor a local path: write s3://{0} or gs://{0} for a bucket, and ./{0}, an absolute path or file:// for a local folder")]
    BareName(String),
    #[error("source {0:?} names no bucket")]
    NoBucket(String),
    #[error("local source {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("cannot open the store: {}", redact_urls(&.0.to_string()))]
    Client(#[from] object_store::Error),
    #[error("--billing-project {0:?} is not a valid header value")]
    BillingProject(String),
    #[error("--expected-bucket-owner is not supported: object_store 0.14 signs extra headers on object requests but sends them unsigned on listings, which S3 refuses; restrict the bucket with a policy (aws:ResourceAccount) instead")]
    ExpectedBucketOwner,
}

/// Whether `text` is unmistakably a local path: absolute, or relative from `.` or `..`.
/// A bare name (`my-bucket`) is refused rather than read as a folder of that name.
fn is_explicit_path(text: &str) -> bool {
    Path::new(text).is_absolute()
        || matches!(text, "." | "..")
        || text.starts_with("./")
        || text.starts_with("../")
}

/// The URL a slip of the keyboard was meant to be (`s3:/bucket`, `s3//bucket`,
/// `s3:bucket` for `s3://bucket`), for the schemes a source can have.
fn malformed_url(text: &str) -> Option<String> {
    ["s3", "gs", "http", "https", "file"]
        .iter()
        .find_map(|scheme| {
            let rest = text
                .get(..scheme.len())
                .filter(|head| head.eq_ignore_ascii_case(scheme))
                .map(|_| &text[scheme.len()..])?;
            let path = rest
                .strip_prefix(":/")
                .or_else(|| rest.strip_prefix("//"))
                .or_else(|| rest.strip_prefix(':'))?;
            // A file URL's path is absolute: file:///PATH.
            let root = if *scheme == "file" { "/" } else { "" };
            Some(format!("{scheme}://{root}{}", path.trim_start_matches('/')))
        })
}

impl Source {
    pub fn parse(text: &str) -> Result<Source, SourceError> {
        let split_bucket = |rest: &str| -> Result<(String, String), SourceError> {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(SourceError::NoBucket(redact_urls(text)));
            }
            Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
        };
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = split_bucket(rest)?;
            Ok(Source::S3 { bucket, prefix })
        } else if let Some(rest) = text.strip_prefix("gs://") {
            let (bucket, prefix) = split_bucket(rest)?;
            Ok(Source::Gcs { bucket, prefix })
        } else if let Some((scheme, rest)) = text
            .split_once("://")
            .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
        {
            let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
            Ok(Source::Http {
                origin: format!("{scheme}://{host}"),
                prefix: path.trim_matches('/').to_owned(),
            })
        } else if let Some(path) = text.strip_prefix("file://") {
            Ok(Source::Local {
                root: PathBuf::from(path),
            })
        } else if text.contains("://") {
            Err(SourceError::Unsupported(redact_urls(text)))
        } else if let Some(meant) = malformed_url(text) {
            Err(SourceError::MalformedUrl {
                given: redact_urls(text),
                meant: redact_urls(&meant),
            })
        } else if is_explicit_path(text) {
            Ok(Source::Local {
                root: PathBuf::from(text),
            })
        } else {
            Err(SourceError::BareName(text.to_owned()))
        }
    }

    /// Whether the store lists keys in key order, a page at a time, so that a listing
    /// can be cut into key ranges listed at once: S3 and GCS. A local folder lists in
    /// the order its directories give, and HTTP (WebDAV) a level at a time.
    pub fn lists_in_key_order(&self) -> bool {
        matches!(self, Source::S3 { .. } | Source::Gcs { .. })
    }

    /// A short name for the mount table (`fsname`), `status` and logs: without the
    /// credentials a URL may carry.
    pub fn display_name(&self) -> String {
        let name = match self {
            Source::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            Source::Gcs { bucket, prefix } => format!("gs://{bucket}/{prefix}"),
            Source::Http { origin, prefix } => format!("{origin}/{prefix}"),
            Source::Local { root } => root.display().to_string(),
        };
        redact_urls(&name)
    }

    /// Builds the client and the prefix of the mount's root inside it. For S3 this may
    /// ask the bucket's region from S3 (no `--region`, no configured region, no
    /// `--endpoint-url`); nothing else touches the network before the first request.
    pub async fn open(
        &self,
        settings: &ClientSettings,
    ) -> Result<(Arc<dyn ObjectStore>, ObjectPath), SourceError> {
        match self {
            Source::S3 { bucket, prefix } => Ok((
                open_s3(bucket, settings).await?,
                ObjectPath::from(prefix.as_str()),
            )),
            Source::Gcs { bucket, prefix } => Ok((
                open_gcs(bucket, settings)?,
                ObjectPath::from(prefix.as_str()),
            )),
            Source::Http { origin, prefix } => {
                let mut options = client_options(settings);
                if origin.starts_with("http://") {
                    options = options.with_allow_http(true);
                }
                let store = HttpBuilder::new()
                    .with_url(origin)
                    .with_client_options(options)
                    .with_retry(settings.bounds.retry_config())
                    .build()?;
                let prefix =
                    ObjectPath::from_url_path(prefix).map_err(object_store::Error::from)?;
                Ok((asking_again_when_short(store), prefix))
            }
            Source::Local { root } => {
                if !root.is_dir() {
                    return Err(SourceError::NotADirectory(root.clone()));
                }
                let root = root
                    .canonicalize()
                    .map_err(|_| SourceError::NotADirectory(root.clone()))?;
                let store = LocalFileSystem::new_with_prefix(root)?;
                Ok((Arc::new(store), ObjectPath::default()))
            }
        }
    }
}

/// The HTTP client's options of every store: the bounds' timeouts, and plain HTTP
/// allowed for an `http://` endpoint.
fn client_options(settings: &ClientSettings) -> ClientOptions {
    let mut options = settings.bounds.client_options();
    if settings
        .endpoint_url
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"))
    {
        options = options.with_allow_http(true);
    }
    options
}

/// The client of S3 bucket `bucket`: its region, addressing and credentials as the
/// settings and the AWS SDK's chain give them.
async fn open_s3(
    bucket: &str,
    settings: &ClientSettings,
) -> Result<Arc<dyn ObjectStore>, SourceError> {
    if settings.expected_bucket_owner.is_some() {
        return Err(SourceError::ExpectedBucketOwner);
    }
    let profile = settings.profile.as_deref();
    let region = s3_region(bucket, settings, &client_options(settings)).await;
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_region(&region)
        .with_request_payer(settings.requester_pays)
        .with_client_options(client_options(settings))
        .with_retry(settings.bounds.retry_config());
    if let Some(endpoint) = &settings.endpoint_url {
        // Custom endpoints (MinIO, Ceph, test servers) expect path-style URLs.
        builder = builder
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(false);
    } else if settings.force_path_style {
        builder = builder.with_virtual_hosted_style_request(false);
    }
    if settings.no_sign_request {
        builder = builder.with_skip_signature(true);
    } else if !aws::keys_in_environment(profile) {
        let chain = aws::credential_chain(profile, &region).await;
        builder = builder.with_credentials(Arc::new(aws::SdkCredentials::new(chain)));
    }
    Ok(asking_again_when_short(listed_a_page_at_a_time(
        builder.build()?,
    )))
}

/// The client of GCS bucket `bucket`, billing `--billing-project` if given.
fn open_gcs(bucket: &str, settings: &ClientSettings) -> Result<Arc<dyn ObjectStore>, SourceError> {
    let mut options = client_options(settings);
    if let Some(project) = &settings.billing_project {
        // Requester-pays buckets bill the project this header names; GCS
        // authenticates with a bearer token, so an added header needs no
        // signature.
        let value = HeaderValue::from_str(project)
            .map_err(|_| SourceError::BillingProject(project.clone()))?;
        let mut headers = HeaderMap::new();
        headers.insert("x-goog-user-project", value);
        options = options.with_default_headers(headers);
    }
    let mut builder = GoogleCloudStorageBuilder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(options)
        .with_retry(settings.bounds.retry_config());
    if let Some(endpoint) = &settings.endpoint_url {
        // An emulator or a private endpoint instead of storage.googleapis.com.
        builder = builder.with_config(GoogleConfigKey::BaseUrl, endpoint);
    }
    if let Some(key_file) = &settings.key_file {
        builder = builder.with_service_account_path(key_file.to_string_lossy());
    }
    if settings.no_sign_request {
        builder = builder.with_skip_signature(true);
    }
    Ok(asking_again_when_short(listed_a_page_at_a_time(
        builder.build()?,
    )))
}

/// A store that lists a page at a time, its delimited listings walked by
/// [`PagedListings`] so that no listing holds more than the catalog takes.
fn listed_a_page_at_a_time(
    store: impl ObjectStore + PaginatedListStore,
) -> HookedStore<PagedListings> {
    let store = Arc::new(store);
    HookedStore::new(store.clone(), PagedListings::new(store))
}

/// A network store behind the one hook of the retry layer that object_store lacks:
/// a ranged GET answered short is asked again ([`short_answers`]).
fn asking_again_when_short(store: impl ObjectStore) -> Arc<dyn ObjectStore> {
    Arc::new(HookedStore::new(
        Arc::new(store),
        AskAgainWhenShort {
            tries: SHORT_ANSWER_TRIES,
        },
    ))
}

/// The region of an S3 bucket: `--region`, the SDK's configured region, the bucket's
/// own (asked from AWS; never with a custom endpoint), else [`aws::DEFAULT_REGION`].
async fn s3_region(bucket: &str, settings: &ClientSettings, options: &ClientOptions) -> String {
    if let Some(region) = &settings.region {
        return region.clone();
    }
    if let Some(region) = aws::configured_region(settings.profile.as_deref()).await {
        return region;
    }
    if settings.endpoint_url.is_some() {
        return aws::DEFAULT_REGION.to_owned();
    }
    // An anonymous HEAD of the bucket, which S3 answers with its region even when the
    // bucket is not readable anonymously.
    match object_store::aws::resolve_bucket_region(bucket, options).await {
        Ok(region) => {
            tracing::info!(bucket, region, "bucket region detected");
            region
        }
        Err(error) => {
            tracing::warn!(
                bucket,
                "cannot detect the bucket's region ({error}); using {}, give --region if that is wrong",
                aws::DEFAULT_REGION
            );
            aws::DEFAULT_REGION.to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_by_scheme() {
        let s3 = |bucket: &str, prefix: &str| Source::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        };
        let gcs = |bucket: &str, prefix: &str| Source::Gcs {
            bucket: bucket.into(),
            prefix: prefix.into(),
        };
        let http = |origin: &str, prefix: &str| Source::Http {
            origin: origin.into(),
            prefix: prefix.into(),
        };
        let local = |root: &str| Source::Local { root: root.into() };
        for (text, source) in [
            ("s3://bucket/a/b/", s3("bucket", "a/b")),
            ("gs://b", gcs("b", "")),
            (
                "http://127.0.0.1:8080/team/run%201/",
                http("http://127.0.0.1:8080", "team/run%201"),
            ),
            ("https://host", http("https://host", "")),
            ("file:///data/x", local("/data/x")),
            ("./rel", local("./rel")),
        ] {
            assert_eq!(Source::parse(text).unwrap(), source, "{text}");
        }
        assert!(matches!(
            Source::parse("s3:///x"),
            Err(SourceError::NoBucket(_))
        ));
        assert!(matches!(
            Source::parse("ftp://x/y"),
            Err(SourceError::Unsupported(_))
        ));
    }

    #[test]
    fn a_local_folder_must_be_written_as_a_path() {
        for path in ["/abs/x", ".", "..", "./x", "../x"] {
            assert_eq!(
                Source::parse(path).unwrap(),
                Source::Local { root: path.into() }
            );
        }
        let refused = Source::parse("my-bucket").unwrap_err().to_string();
        assert_eq!(
            refused,
            "source \"my-bucket\" is neither a URL nor a local path: write s3://my-bucket or \
             gs://my-bucket for a bucket, and ./my-bucket, an absolute path or file:// for a \
             local folder"
        );
        assert!(matches!(
            Source::parse("data/sets"),
            Err(SourceError::BareName(_))
        ));
    }

    #[test]
    fn a_slip_in_a_url_is_refused_with_the_url_meant() {
        for (given, meant) in [
            ("s3:/bucket/x", "s3://bucket/x"),
            ("s3//bucket/x", "s3://bucket/x"),
            ("s3:bucket", "s3://bucket"),
            ("S3:/bucket", "s3://bucket"),
            ("gs:/b", "gs://b"),
            ("https:/host/p", "https://host/p"),
            ("file:/data", "file:///data"),
        ] {
            match Source::parse(given) {
                Err(SourceError::MalformedUrl { given: g, meant: m }) => {
                    assert_eq!((g.as_str(), m.as_str()), (given, meant))
                }
                other => panic!("{given}: {other:?}"),
            }
        }
        assert!(matches!(
            Source::parse("s3x:/y"),
            Err(SourceError::BareName(_))
        ));
    }

    #[test]
    fn credentials_in_a_source_are_never_shown() {
        let source = Source::parse("https://reader:hunter2@data.example/atlas?sig=abc").unwrap();
        let shown = source.display_name();
        assert!(
            !shown.contains("hunter2") && !shown.contains("sig=abc"),
            "{shown}"
        );
        assert_eq!(shown, "https://REDACTED@data.example/atlas?REDACTED");
        let refused = Source::parse("ftp://reader:hunter2@x/y")
            .unwrap_err()
            .to_string();
        assert!(!refused.contains("hunter2"), "{refused}");
    }

    /// The head of the first request a client sends to `listener`, answered with 404.
    fn first_request_head(listener: std::net::TcpListener) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            while !head.ends_with("\r\n\r\n") {
                if reader.read_line(&mut head).unwrap() == 0 {
                    break;
                }
            }
            let mut stream = stream;
            let _ = stream.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            head
        })
    }

    #[tokio::test]
    async fn gcs_bills_the_billing_project_and_authenticates_with_the_key_file() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let head = first_request_head(listener);
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key.json");
        // disable_oauth: no token is asked from Google for this key.
        std::fs::write(
            &key_file,
            r#"{"disable_oauth": true, "client_email": "t@example.invalid", "private_key": "unused", "private_key_id": "unused"}"#,
        )
        .unwrap();
        let settings = ClientSettings {
            endpoint_url: Some(endpoint),
            key_file: Some(key_file),
            billing_project: Some("lab-42".into()),
            bounds: NetworkBounds {
                max_attempts: 1,
                ..NetworkBounds::default()
            },
            ..ClientSettings::default()
        };
        let (store, prefix) = Source::parse("gs://bucket/atlas")
            .unwrap()
            .open(&settings)
            .await
            .unwrap();
        let _ = store.list_with_delimiter(Some(&prefix)).await;
        let head = head.join().unwrap().to_lowercase();
        assert!(head.contains("x-goog-user-project: lab-42"), "{head}");
        assert!(head.contains("/bucket"), "{head}");
    }

    #[tokio::test]
    async fn an_expected_bucket_owner_is_refused_rather_than_ignored() {
        let settings = ClientSettings {
            expected_bucket_owner: Some("123456789012".into()),
            region: Some("us-east-1".into()),
            ..ClientSettings::default()
        };
        let error = Source::parse("s3://bucket/atlas")
            .unwrap()
            .open(&settings)
            .await
            .expect_err("an expected bucket owner is refused")
            .to_string();
        assert!(error.contains("--expected-bucket-owner"), "{error}");
    }
}
