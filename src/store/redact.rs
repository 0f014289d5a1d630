//! Credentials never leave the process in text: URLs in anything shown (the mount
//! table's fsname, `status`, log lines, error messages) lose their userinfo
//! (`user:password@`) and their query (a presigned URL's signature and credential).
//!
//! Not every message shows a secret inside a URL: hyper's connection pool names a
//! host as `user:password@host`, the AWS SDK prints `access_key_id: "..."`. So every
//! log line and every error printed also passes [`redact`], which hides besides
//! the URLs each secret this process was given (registered with [`register_secret`]
//! where it enters: the command line's URLs, the `AWS_*` keys, the credentials the
//! SDK's chain hands out) and the value of any field named like a credential.

use std::io;
use std::sync::{PoisonError, RwLock};

const HIDDEN: &str = "REDACTED";

/// A log writer that redacts URLs in what passes through it (the log formatter writes
/// each event in one call, so a URL is never split between writes).
pub struct Redacting<W>(pub W);

impl<W: io::Write> io::Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(redact(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// A log destination (anything tracing can make writers from: stderr, a rolling file)
/// whose every writer is [`Redacting`].
pub struct RedactingWriter<M>(pub M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for RedactingWriter<M>
{
    type Writer = Redacting<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting(self.0.make_writer())
    }
}

/// The secrets this process holds, longest first (so that one containing another is
/// hidden whole).
static KNOWN_SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Fields whose values are credentials, as the AWS SDK's and our own log lines name
/// them (`access_key_id: "AKIA..."`, `session_token=...`).
const CREDENTIAL_FIELDS: [&str; 5] = [
    "access_key_id",
    "secret_access_key",
    "session_token",
    "security_token",
    "password",
];

/// From now on, [`redact`] hides `secret` wherever it appears.
pub fn register_secret(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut known = KNOWN_SECRETS
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    if !known.iter().any(|k| k == secret) {
        known.push(secret.to_owned());
        known.sort_by_key(|k| std::cmp::Reverse(k.len()));
    }
}

/// Registers the password of every URL in `text` (a command-line argument, a source),
/// as written and percent-decoded.
pub fn register_url_secrets(text: &str) {
    let mut rest = text;
    while let Some(scheme_end) = rest.find("://") {
        let after = &rest[scheme_end + 3..];
        let authority = &after[..after.find(['/', '?', '#']).unwrap_or(after.len())];
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                register_secret(password);
                register_secret(&percent_decoded(password));
            }
        }
        rest = &after[authority.len()..];
    }
}

/// Registers the AWS credentials found in the environment.
pub fn register_environment_secrets() {
    for name in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        if let Some(value) = std::env::var_os(name) {
            register_secret(&value.to_string_lossy());
        }
    }
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|digits| u8::from_str_radix(digits, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` as it may be shown: URLs redacted ([`redact_urls`]), every registered
/// secret and every credential field's value replaced by `REDACTED`.
pub fn redact(text: &str) -> String {
    let mut out = redact_urls(text);
    for secret in KNOWN_SECRETS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), HIDDEN);
        }
    }
    for field in CREDENTIAL_FIELDS {
        out = redact_field(&out, field);
    }
    out
}

/// `text` with the value after each `field` (`field: "v"`, `field="v"`, `field=v`)
/// replaced.
fn redact_field(text: &str, field: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(field) {
        let (before, after) = rest.split_at(at + field.len());
        out.push_str(before);
        let separator_len = after.len() - after.trim_start_matches([':', '=', ' ']).len();
        // Prose ("the password is wrong") names a field without giving its value.
        if !after[..separator_len].contains([':', '=']) {
            rest = after;
            continue;
        }
        out.push_str(&after[..separator_len]);
        let value = &after[separator_len..];
        let value_len = match value.strip_prefix('"') {
            Some(quoted) => quoted.find('"').map_or(value.len(), |end| end + 2),
            None => value
                .find(|c: char| c.is_whitespace() || matches!(c, ',' | '}' | ')' | ';'))
                .unwrap_or(value.len()),
        };
        if value_len > 0 {
            out.push_str(HIDDEN);
        }
        rest = &value[value_len..];
    }
    out.push_str(rest);
    out
}

/// `text` with every URL's userinfo and query replaced by `REDACTED`.
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(scheme_end) = rest.find("://") {
        let (before, after) = rest.split_at(scheme_end + 3);
        out.push_str(before);
        let url_len = after
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')' | ','))
            .unwrap_or(after.len());
        let (url, tail) = after.split_at(url_len);
        out.push_str(&redact_one(url));
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// One URL after its `scheme://`.
fn redact_one(url: &str) -> String {
    let authority_len = url.find(['/', '?', '#']).unwrap_or(url.len());
    let (authority, path) = url.split_at(authority_len);
    let mut out = match authority.rfind('@') {
        Some(at) => format!("{HIDDEN}@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    match path.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            out.push_str(HIDDEN);
            if let Some((_, fragment)) = query.split_once('#') {
                out.push('#');
                out.push_str(fragment);
            }
        }
        None => out.push_str(path),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn userinfo_and_queries_are_hidden() {
        assert_eq!(
            redact_urls("https://alice:s3cr3t@example.test/data/x.npy"),
            "https://REDACTED@example.test/data/x.npy"
        );
        assert_eq!(
            redact_urls(
                "GET http://127.0.0.1:9/b/k?X-Amz-Credential=AKIA&X-Amz-Signature=abc failed"
            ),
            "GET http://127.0.0.1:9/b/k?REDACTED failed"
        );
        assert_eq!(
            redact_urls("error sending request for url (http://u:p@h/k?sig=1), retrying"),
            "error sending request for url (http://REDACTED@h/k?REDACTED), retrying"
        );
        assert_eq!(redact_urls("s3://bucket/prefix"), "s3://bucket/prefix");
        assert_eq!(redact_urls("no url here"), "no url here");
    }

    #[test]
    fn registered_secrets_and_credential_fields_are_hidden_wherever_they_appear() {
        register_url_secrets("mount https://reader:p%40ss-9f3k@host.test/x /mnt");
        assert_eq!(
            redact(r#"checkout waiting for idle connection: ("https", reader:p%40ss-9f3k@h:1)"#),
            r#"checkout waiting for idle connection: ("https", reader:REDACTED@h:1)"#
        );
        assert_eq!(redact("decoded p@ss-9f3k too"), "decoded REDACTED too");
        assert_eq!(
            redact(
                r#"Credentials { access_key_id: "AKIA1", secret_access_key: "** redacted **" }"#
            ),
            r#"Credentials { access_key_id: REDACTED, secret_access_key: REDACTED }"#
        );
        assert_eq!(
            redact("loaded session_token=abc, expires_in=5"),
            "loaded session_token=REDACTED, expires_in=5"
        );
        assert_eq!(
            redact("the password is wrong"),
            "the password is wrong",
            "prose naming a field keeps its words"
        );
    }

    #[test]
    fn log_lines_are_redacted() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(RedactingWriter(move || writer.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(source = "https://u:hunter2@h/x?sig=s3cret", "cannot list");
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(
            log.contains("cannot list") && log.contains("REDACTED@h/x"),
            "{log}"
        );
        assert!(!log.contains("hunter2") && !log.contains("s3cret"), "{log}");
    }

    proptest! {
        #[test]
        fn a_secret_in_a_url_never_survives(
            // Userinfo and query values as URLs carry them (no '/', '@', '?', '#').
            secret in "[A-Za-z0-9+=_.~-]{8,24}",
            prefix in "[ a-z:(]{0,10}",
            host in "[a-z0-9.]{1,12}(:[0-9]{1,5})?",
            path in "(/[a-z0-9._-]{0,8}){0,3}",
            suffix in "[ a-z,)]{0,10}",
        ) {
            for url in [
                format!("https://user:{secret}@{host}{path}"),
                format!("http://{host}{path}?X-Amz-Signature={secret}&x=1"),
                format!("http://{secret}@{host}{path}?token={secret}#frag"),
            ] {
                let text = format!("{prefix}{url}{suffix}");
                let redacted = redact_urls(&text);
                prop_assert!(!redacted.contains(&secret), "{} -> {}", text, redacted);
                prop_assert!(redacted.contains(&host), "{} -> {}", text, redacted);
            }
        }
    }
}
