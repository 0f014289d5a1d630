//! Checks an S3 request's AWS Signature Version 4 the way S3 does, since the test
//! server (moto_server) accepts any signature: the signature is computed again, by the
//! AWS SDK's own signer (`aws-sigv4`, not object_store's, which signed the request),
//! from the request as the proxy saw it and the secret and session token the test knows
//! the credentials carry, and must equal the one sent. A request signed with the wrong
//! secret, or one that dropped its session token or left it out of the signature, fails.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4::SigningParams;

use super::proxy::Request;

/// What the test knows about one set of credentials.
#[derive(Clone, Debug)]
pub struct Secret {
    pub secret_access_key: String,
    /// The session token temporary credentials come with, which S3 wants in
    /// `x-amz-security-token`, signed.
    pub session_token: Option<String>,
}

/// The parts of a SigV4 `Authorization` header.
struct Authorization<'a> {
    access_key_id: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, String> {
    let fields = value
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(|| format!("not a SigV4 authorization: {value}"))?;
    let field = |name: &str| {
        fields
            .split(',')
            .map(str::trim)
            .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("no {name} in {value}"))
    };
    // KEY/DATE/REGION/SERVICE/aws4_request
    let scope: Vec<&str> = field("Credential")?.split('/').collect();
    let [access_key_id, _date, region, service, "aws4_request"] = scope[..] else {
        return Err(format!("malformed credential scope in {value}"));
    };
    Ok(Authorization {
        access_key_id,
        region,
        service,
        signed_headers: field("SignedHeaders")?.split(';').collect(),
        signature: field("Signature")?,
    })
}

/// `20261204T151442Z` as a time.
fn parse_amz_date(value: &str) -> Result<SystemTime, String> {
    let b = value.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return Err(format!("malformed x-amz-date {value}"));
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &value[0..4],
        &value[4..6],
        &value[6..8],
        &value[9..11],
        &value[11..13],
        &value[13..15]
    );
    humantime::parse_rfc3339(&rfc3339).map_err(|e| format!("x-amz-date {value}: {e}"))
}

/// Checks `request`'s signature, with `secrets` naming the secret (and session token)
/// of an access key ID; says what is wrong if the signature is not the one S3 expects.
pub fn verify(request: &Request, secrets: impl Fn(&str) -> Option<Secret>) -> Result<(), String> {
    let authorization = request
        .header("authorization")
        .ok_or("the request is not signed")?;
    let auth = parse_authorization(authorization)?;
    let secret = secrets(auth.access_key_id)
        .ok_or_else(|| format!("signed with unknown key {}", auth.access_key_id))?;
    let sent_token = request.header("x-amz-security-token");
    if sent_token != secret.session_token.as_deref() {
        return Err(format!(
            "x-amz-security-token {sent_token:?}, but the credentials carry {:?}",
            secret.session_token
        ));
    }
    let time = parse_amz_date(request.header("x-amz-date").ok_or("no x-amz-date")?)?;
    let host = request.header("host").ok_or("no host header")?;

    // The signer adds host, x-amz-date, the token and the payload hash itself; every
    // other header the request says it signed is handed over as sent.
    let added_by_signer = [
        "host",
        "x-amz-date",
        "x-amz-security-token",
        "x-amz-content-sha256",
    ];
    let mut headers = Vec::new();
    for name in &auth.signed_headers {
        if added_by_signer.contains(name) {
            continue;
        }
        let value = request
            .header(name)
            .ok_or_else(|| format!("signed header {name} was not sent"))?;
        headers.push((*name, value));
    }
    let payload_hash = request.header("x-amz-content-sha256");
    let mut settings = SigningSettings::default();
    // S3's canonical path: the URI as sent, encoded once, not normalized.
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.excluded_headers = None;
    if payload_hash.is_some() {
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    }
    let body = match payload_hash {
        Some(hash) => SignableBody::Precomputed(hash.to_owned()),
        None => SignableBody::UnsignedPayload,
    };
    let identity = Credentials::new(
        auth.access_key_id,
        secret.secret_access_key,
        secret.session_token,
        None,
        "test",
    )
    .into();
    let params = SigningParams::builder()
        .identity(&identity)
        .region(auth.region)
        .name(auth.service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let uri = format!("http://{host}{}", request.path);
    let signable = SignableRequest::new(&request.method, uri, headers.into_iter(), body)
        .map_err(|e| e.to_string())?;
    let expected = sign(signable, &params).map_err(|e| e.to_string())?;
    if expected.signature() != auth.signature {
        return Err(format!(
            "signature {} where S3 computes {} (signed headers {:?})",
            auth.signature,
            expected.signature(),
            auth.signed_headers
        ));
    }
    Ok(())
}
