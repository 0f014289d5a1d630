//! Credentials never leave the process in text: URLs in anything shown (the mount
//! table's fsname, `status`, log lines, error messages) lose their userinfo
//! (`user:password@`) and their query (a presigned URL's signature and credential).

use std::io;

const HIDDEN: &str = "REDACTED";

/// A log writer that redacts URLs in what passes through it (the log formatter writes
/// each event in one call, so a URL is never split between writes).
pub struct Redacting<W>(pub W);

impl<W: io::Write> io::Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(redact_urls(&text).as_bytes())?;
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
