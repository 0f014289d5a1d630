//! AWS credentials and region, found the way the AWS CLI and SDKs find them.
//!
//! object_store signs S3 requests with whatever [`CredentialProvider`] it is given; the
//! AWS SDK's loaders (`aws-config`) know every place credentials come from: the
//! `AWS_*` variables, `~/.aws/config` and `~/.aws/credentials` profiles (static keys,
//! `credential_process`, SSO, assume-role with `source_profile` or
//! `credential_source`, web identity), the web-identity variables that Kubernetes
//! (IRSA) sets, the ECS container endpoint and the EC2 instance metadata service.
//! [`SdkCredentials`] puts the one behind the other: it asks the SDK's chain once,
//! keeps the answer, and asks again before the credentials expire, so that a mount
//! lives longer than its credentials.
//!
//! Keys given in `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (without `--profile`)
//! never go through the chain: object_store signs with them directly, as the chain's
//! first link would.
//!
//! The region is the first of: `--region`; the SDK's configured region
//! (`AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`); the bucket's own
//! region, asked from S3 (only without `--endpoint-url`); `us-east-1`. The instance
//! metadata's region, which the SDK's chain would try next, is skipped on purpose: it
//! is where the machine runs, not where the bucket lives, and a wrong region fails
//! every request.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::meta::ProviderChainError;
use aws_config::profile::{ProfileFileCredentialsProvider, ProfileFileRegionProvider};
use aws_config::provider_config::ProviderConfig;
use aws_config::Region;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use object_store::aws::AwsCredential;
use object_store::CredentialProvider;

/// The region used when nothing names one and the bucket cannot be asked.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Credentials are renewed this long before they expire...
const REFRESH_AHEAD: Duration = Duration::from_secs(5 * 60);
/// ...or halfway through their life, for credentials that live shorter than twice that.
const MIN_LIFE_FRACTION_LEFT: u32 = 2;
/// After a failed renewal, credentials still valid are used this long before the next try.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);
/// The longest one request for credentials may take (a `credential_process`, STS, SSO).
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(30);

/// The SDK's credential sources for this mount: the profile named by `--profile`, as
/// the AWS CLI reads it when given `--profile` (its credentials win over the `AWS_*`
/// key variables), else the SDK's default chain.
pub async fn credential_chain(profile: Option<&str>, region: &str) -> SharedCredentialsProvider {
    let config = ProviderConfig::default().with_region(Some(Region::new(region.to_owned())));
    match profile {
        Some(name) => SharedCredentialsProvider::new(
            ProfileFileCredentialsProvider::builder()
                .configure(&config)
                .profile_name(name)
                .build(),
        ),
        None => SharedCredentialsProvider::new(
            aws_config::default_provider::credentials::DefaultCredentialsChain::builder()
                .configure(config)
                .build()
                .await,
        ),
    }
}

/// Whether object_store can sign with keys from the environment, without the chain.
pub fn keys_in_environment(profile: Option<&str>) -> bool {
    profile.is_none()
        && std::env::var_os("AWS_ACCESS_KEY_ID").is_some()
        && std::env::var_os("AWS_SECRET_ACCESS_KEY").is_some()
}

/// The region configured for the SDK: `AWS_REGION`, `AWS_DEFAULT_REGION`, then the
/// profile's `region` (`--profile`, else `AWS_PROFILE`, else `default`).
pub async fn configured_region(profile: Option<&str>) -> Option<String> {
    let mut from_profile = ProfileFileRegionProvider::builder();
    if let Some(name) = profile {
        from_profile = from_profile.profile_name(name);
    }
    RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(from_profile.build())
        .region()
        .await
        .map(|region| region.to_string())
}

/// The SDK's credentials as object_store's [`CredentialProvider`]: cached, renewed
/// ahead of expiry, one renewal at a time.
#[derive(Debug)]
pub struct SdkCredentials {
    chain: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<Cached>>,
}

#[derive(Debug)]
struct Cached {
    credential: Arc<AwsCredential>,
    expiry: Option<SystemTime>,
    /// When to ask the chain again.
    renew_at: Option<SystemTime>,
}

impl SdkCredentials {
    pub fn new(chain: SharedCredentialsProvider) -> SdkCredentials {
        SdkCredentials {
            chain,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// The credential to sign with at `now`.
    async fn credential_at(&self, now: SystemTime) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        if let Some(current) = cached.as_ref() {
            if current.renew_at.is_none_or(|at| now < at) {
                return Ok(current.credential.clone());
            }
        }
        let answer = tokio::time::timeout(PROVIDER_TIMEOUT, self.chain.provide_credentials()).await;
        let failure = match answer {
            Ok(Ok(credentials)) => {
                let expiry = credentials.expiry();
                let fresh = Cached {
                    credential: Arc::new(AwsCredential {
                        key_id: credentials.access_key_id().to_owned(),
                        secret_key: credentials.secret_access_key().to_owned(),
                        token: credentials.session_token().map(str::to_owned),
                    }),
                    expiry,
                    renew_at: expiry.map(|expiry| renewal_time(now, expiry)),
                };
                for secret in [&fresh.credential.key_id, &fresh.credential.secret_key]
                    .into_iter()
                    .chain(&fresh.credential.token)
                {
                    super::redact::register_secret(secret);
                }
                tracing::debug!(
                    expires_in = ?expiry.and_then(|e| e.duration_since(now).ok()),
                    "AWS credentials loaded"
                );
                let credential = fresh.credential.clone();
                *cached = Some(fresh);
                return Ok(credential);
            }
            Ok(Err(error)) => what_the_chain_tried(&error).unwrap_or_else(|| error_chain(&error)),
            Err(_) => format!(
                "no answer from the credential provider within {}s",
                PROVIDER_TIMEOUT.as_secs()
            ),
        };
        match cached.as_mut() {
            // Still valid: keep signing with it, and try again a little later.
            Some(current) if current.expiry.is_some_and(|expiry| now < expiry) => {
                tracing::warn!(
                    "cannot renew the AWS credentials ({failure}); using the current ones until they expire"
                );
                current.renew_at = Some(now + RETRY_AFTER_FAILURE);
                Ok(current.credential.clone())
            }
            _ => Err(object_store::Error::Generic {
                store: "S3",
                source: format!("no AWS credentials: {failure}").into(),
            }),
        }
    }
}

#[async_trait::async_trait]
impl CredentialProvider for SdkCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        self.credential_at(SystemTime::now()).await
    }
}

/// When credentials fetched at `now` that expire at `expiry` are renewed:
/// [`REFRESH_AHEAD`] before they expire, or halfway through a shorter life.
fn renewal_time(now: SystemTime, expiry: SystemTime) -> SystemTime {
    let life = expiry.duration_since(now).unwrap_or_default();
    expiry - REFRESH_AHEAD.min(life / MIN_LIFE_FRACTION_LEFT)
}

/// Each source the SDK's chain tried and why it gave nothing, on one line, and what to
/// do; None when `error` is not the chain's. The chain's own text lists them one a line,
/// which a message of one line (the mount's verdict, a log line) cuts off.
fn what_the_chain_tried(error: &CredentialsError) -> Option<String> {
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        if let Some(chain) = error.downcast_ref::<ProviderChainError<CredentialsError>>() {
            let tried: Vec<String> = chain
                .attempts()
                .iter()
                .map(|attempt| format!("{} ({})", attempt.name(), deepest(attempt.error())))
                .collect();
            return Some(format!(
                "none found; tried {}. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, name a \
                 profile with --profile or AWS_PROFILE, or read a public bucket with \
                 --no-sign-request",
                tried.join(", ")
            ));
        }
        cause = error.source();
    }
    None
}

/// The innermost cause's words: what actually went wrong.
fn deepest(error: &dyn std::error::Error) -> String {
    let mut deepest = error;
    while let Some(cause) = deepest.source() {
        deepest = cause;
    }
    deepest.to_string()
}

/// An error and its causes on one line (the SDK's errors say the most in their sources).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let more = error.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::{error::CredentialsError, future};
    use aws_credential_types::Credentials;
    use parking_lot::Mutex;

    const HOUR: Duration = Duration::from_secs(3600);

    /// A credential source that hands out numbered keys, or fails, as the test says.
    #[derive(Debug, Default)]
    struct Source {
        calls: Mutex<u32>,
        lifetime: Option<Duration>,
        failing: Mutex<bool>,
        issued_at: Mutex<Option<SystemTime>>,
    }

    impl ProvideCredentials for Source {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            let mut calls = self.calls.lock();
            *calls += 1;
            if *self.failing.lock() {
                return future::ProvideCredentials::ready(Err(CredentialsError::not_loaded(
                    "the token endpoint is down",
                )));
            }
            let issued = self.issued_at.lock().unwrap_or(SystemTime::UNIX_EPOCH);
            future::ProvideCredentials::ready(Ok(Credentials::new(
                format!("KEY{calls}"),
                // Distinct from any word: the process redacts them from every message.
                "test-secret-key-7f3a",
                Some("test-session-token-7f3a".into()),
                self.lifetime.map(|life| issued + life),
                "test",
            )))
        }
    }

    /// A source of credentials that live an hour, issued at the returned time.
    fn hour_long_credentials() -> (Arc<Source>, SystemTime) {
        let t0 = SystemTime::UNIX_EPOCH + HOUR;
        let source = Source {
            lifetime: Some(HOUR),
            issued_at: Mutex::new(Some(t0)),
            ..Default::default()
        };
        (Arc::new(source), t0)
    }

    fn adapter(source: &Arc<Source>) -> SdkCredentials {
        SdkCredentials::new(SharedCredentialsProvider::new(SharedSource(source.clone())))
    }

    #[derive(Debug)]
    struct SharedSource(Arc<Source>);
    impl ProvideCredentials for SharedSource {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            self.0.provide_credentials()
        }
    }

    #[test]
    fn renewal_is_five_minutes_ahead_or_halfway_through_a_short_life() {
        let now = SystemTime::UNIX_EPOCH + HOUR;
        assert_eq!(renewal_time(now, now + HOUR), now + HOUR - REFRESH_AHEAD);
        let short = Duration::from_secs(8);
        assert_eq!(renewal_time(now, now + short), now + short / 2);
        // Already expired: renewed at once.
        assert_eq!(renewal_time(now, now - short), now - short);
    }

    #[tokio::test]
    async fn credentials_are_kept_until_they_are_due_then_renewed() {
        let (source, t0) = hour_long_credentials();
        let credentials = adapter(&source);
        for minutes in [0, 1, 54] {
            let key = credentials
                .credential_at(t0 + Duration::from_secs(60 * minutes))
                .await
                .unwrap();
            assert_eq!(key.key_id, "KEY1");
            assert_eq!(key.token.as_deref(), Some("test-session-token-7f3a"));
        }
        assert_eq!(*source.calls.lock(), 1);
        let renewed = t0 + HOUR - REFRESH_AHEAD;
        *source.issued_at.lock() = Some(renewed);
        assert_eq!(
            credentials.credential_at(renewed).await.unwrap().key_id,
            "KEY2"
        );
        assert_eq!(*source.calls.lock(), 2);
    }

    #[tokio::test]
    async fn credentials_without_expiry_are_asked_for_once() {
        let source = Arc::new(Source::default());
        let credentials = adapter(&source);
        for days in [0, 1, 400] {
            let at = SystemTime::UNIX_EPOCH + HOUR * 24 * days;
            assert_eq!(credentials.credential_at(at).await.unwrap().key_id, "KEY1");
        }
        assert_eq!(*source.calls.lock(), 1);
    }

    #[tokio::test]
    async fn a_failed_renewal_keeps_valid_credentials_and_retries_later() {
        let (source, t0) = hour_long_credentials();
        let credentials = adapter(&source);
        credentials.credential_at(t0).await.unwrap();
        *source.failing.lock() = true;
        let due = t0 + HOUR - REFRESH_AHEAD;
        assert_eq!(credentials.credential_at(due).await.unwrap().key_id, "KEY1");
        // Not asked again at every request while the source is down...
        let soon = due + RETRY_AFTER_FAILURE / 2;
        assert_eq!(
            credentials.credential_at(soon).await.unwrap().key_id,
            "KEY1"
        );
        assert_eq!(*source.calls.lock(), 2);
        // ...and once the credentials expired, requests fail saying why.
        let error = credentials
            .credential_at(t0 + HOUR)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("the token endpoint is down"), "{error}");
        *source.failing.lock() = false;
        *source.issued_at.lock() = Some(t0 + HOUR);
        let back = credentials.credential_at(t0 + HOUR).await.unwrap();
        assert_eq!(back.key_id, "KEY4");
    }

    #[tokio::test]
    async fn no_credentials_anywhere_is_an_error_that_says_so() {
        let source = Arc::new(Source::default());
        *source.failing.lock() = true;
        let error = adapter(&source)
            .get_credential()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("no AWS credentials"), "{error}");
    }
}
