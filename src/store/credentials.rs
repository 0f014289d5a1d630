//! AWS shared-credentials profiles, which `object_store` does not read by itself.
//!
//! The AWS CLI takes keys from `AWS_*` variables first and then from the profile named
//! by `AWS_PROFILE` (default `default`) in `AWS_SHARED_CREDENTIALS_FILE` (default
//! `~/.aws/credentials`). `AmazonS3Builder::from_env` covers the variables; this fills
//! in the profile when no key came from them.

use std::path::PathBuf;

use object_store::aws::AmazonS3Builder;

pub(super) fn apply_aws_profile(builder: AmazonS3Builder) -> AmazonS3Builder {
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        return builder;
    }
    let Some(path) = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws/credentials")))
    else {
        return builder;
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return builder;
    };
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let keys = profile_keys(&text, &profile);
    let mut builder = builder;
    if let (Some(id), Some(secret)) = (
        keys.get("aws_access_key_id"),
        keys.get("aws_secret_access_key"),
    ) {
        builder = builder
            .with_access_key_id(id)
            .with_secret_access_key(secret);
        if let Some(token) = keys.get("aws_session_token") {
            builder = builder.with_token(token);
        }
    }
    builder
}

/// The `key = value` pairs of `[profile]` in an INI-style credentials file.
fn profile_keys(text: &str, profile: &str) -> std::collections::HashMap<String, String> {
    let mut in_profile = false;
    let mut keys = std::collections::HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = name.trim() == profile;
        } else if in_profile {
            if let Some((k, v)) = line.split_once('=') {
                keys.insert(k.trim().to_lowercase(), v.trim().to_owned());
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_named_profile_only() {
        let text = "[default]\naws_access_key_id = A\naws_secret_access_key=B\n\n[other]\naws_access_key_id=C\n";
        let keys = profile_keys(text, "default");
        assert_eq!(keys["aws_access_key_id"], "A");
        assert_eq!(keys["aws_secret_access_key"], "B");
        assert_eq!(profile_keys(text, "other")["aws_access_key_id"], "C");
        assert!(profile_keys(text, "missing").is_empty());
    }
}
