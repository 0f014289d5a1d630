//! S3 credentials as the AWS CLI finds them, through the real `scdlfs mount` against
//! moto_server on 127.0.0.1, with the fault proxy in between to see what each request
//! was signed with. The server accepts any signature, so each request's is computed
//! again from the secret and session token the test handed out (`common::sigv4`) and
//! must match: a mount that signs with the wrong secret or drops the token fails.
//!
//! - a `--profile` whose `credential_process` hands out credentials that expire within
//!   seconds: the mount signs with them, asks the process again before they expire
//!   while a slow reader reads on (never once per request), and serves every byte;
//! - web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`: IRSA on Kubernetes),
//!   assume-role from a `source_profile`, and SSO from a cached `aws sso login`, each
//!   resolved by the SDK against a stub STS or SSO portal on 127.0.0.1
//!   (`AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL_SSO`);
//! - keys in the environment sign directly, `--requester-pays` signed into each request;
//! - no credentials anywhere: the mount fails at start and says so.
//!
//! The instance metadata service is off and no request leaves 127.0.0.1.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use common::cli_mount::{mount_command, CliMount};
use common::proxy::FaultProxy;
use common::s3::{moto, unique_bucket};
use common::sigv4::{self, Secret};
use common::*;

const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/reader";
const ROLE_ARN_ENCODED: &str = "arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Freader";

/// A bucket on moto holding `files` under `data/`, and a proxy in front of the server.
fn bucket_behind_proxy(files: &BTreeMap<String, Vec<u8>>) -> (String, FaultProxy) {
    let bucket = unique_bucket("credentials");
    moto().create_bucket(&bucket);
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), files);
    moto().upload(&bucket, "data", dir.path());
    (bucket, FaultProxy::start(&moto().endpoint))
}

/// The access key IDs of the signed requests the proxy saw, in order.
fn signing_keys(proxy: &FaultProxy) -> Vec<String> {
    proxy
        .seen()
        .iter()
        .filter_map(|request| request.access_key_id().map(str::to_owned))
        .collect()
}

/// Asserts that requests reached the proxy and that each carries the signature S3
/// computes for it from the secret (and session token) `secrets` gives for its key.
#[track_caller]
fn assert_signed_correctly(proxy: &FaultProxy, secrets: impl Fn(&str) -> Option<Secret>) {
    let seen = proxy.seen();
    assert!(!seen.is_empty(), "no request reached the server");
    for request in &seen {
        if let Err(wrong) = sigv4::verify(request, &secrets) {
            panic!("{} {}: {wrong}", request.method, request.path);
        }
    }
}

/// Asserts that requests reached the proxy, all signed with `key` and correctly so for
/// its `secret` and session `token`.
#[track_caller]
fn assert_signed_only_with(proxy: &FaultProxy, key: &str, secret: &str, token: Option<&str>) {
    let keys = signing_keys(proxy);
    assert!(
        !keys.is_empty() && keys.iter().all(|signed| signed == key),
        "not all signed with {key}: {keys:?}"
    );
    assert_signed_correctly(proxy, |signed| {
        (signed == key).then(|| Secret {
            secret_access_key: secret.into(),
            session_token: token.map(str::to_owned),
        })
    });
}

/// Mounts `s3://BUCKET/data` through the proxy with `extra` flags and `env`, reads
/// every file back and checks it, and returns the mount for more checks.
fn mount_and_read_all(
    bucket: &str,
    proxy: &FaultProxy,
    files: &BTreeMap<String, Vec<u8>>,
    extra: &[&str],
    env: &[(&str, &OsString)],
) -> CliMount {
    let endpoint = proxy.endpoint();
    let mut flags = vec!["--endpoint-url", &endpoint];
    flags.extend_from_slice(extra);
    let mount = CliMount::start(&format!("s3://{bucket}/data"), &flags, env);
    for (name, bytes) in files {
        assert!(mount.read(name) == *bytes, "{name}");
    }
    mount
}

fn os(text: impl Into<OsString>) -> OsString {
    text.into()
}

// ---------------------------------------------------------------------------------------
// A stub of the AWS endpoints the SDK asks for credentials: STS (AssumeRole,
// AssumeRoleWithWebIdentity: form-encoded POSTs answered in XML) and the SSO portal
// (GetRoleCredentials: a GET answered in JSON). Each answer carries an access key ID
// naming the operation, valid for an hour.

struct StubRequest {
    method: String,
    path: String,
    headers: String,
    body: String,
}

struct AwsStub {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<StubRequest>>>,
}

impl AwsStub {
    fn start() -> AwsStub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        // Lives as long as the test binary; every connection is one request.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Some(request) = answer(stream) {
                    seen.lock().push(request);
                }
            }
        });
        AwsStub { addr, requests }
    }

    fn url(&self) -> OsString {
        format!("http://{}", self.addr).into()
    }

    /// The first request whose body or path contains `needle`, as (method, headers,
    /// body); fails the test, showing the mount's log, if there was none.
    #[track_caller]
    fn asked(&self, needle: &str, mount: &CliMount) -> (String, String, String) {
        let requests = self.requests.lock();
        let request = requests
            .iter()
            .find(|r| r.body.contains(needle) || r.path.contains(needle))
            .unwrap_or_else(|| panic!("never asked {needle}; the log:\n{}", mount.log()));
        (
            request.method.clone(),
            request.headers.clone(),
            request.body.clone(),
        )
    }
}

fn answer(stream: TcpStream) -> Option<StubRequest> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut words = line.split_whitespace();
    let method = words.next()?.to_owned();
    let path = words.next()?.to_owned();
    let mut headers = String::new();
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
        headers.push_str(&header);
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let body = String::from_utf8_lossy(&body).into_owned();
    let (content_type, reply) = reply_to(&method, &path, &body);
    let mut stream = stream;
    let status = if reply.is_empty() {
        "400 Bad Request"
    } else {
        "200 OK"
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    );
    Some(StubRequest {
        method,
        path,
        headers,
        body,
    })
}

/// What the stub answers: the operation's credentials, or nothing (a 400).
fn reply_to(method: &str, path: &str, body: &str) -> (&'static str, String) {
    let expiration =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3600));
    let sts = |operation: &str, key: &str| {
        format!(
            r#"<{operation}Response xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <{operation}Result>
    <Credentials>
      <AccessKeyId>{key}</AccessKeyId>
      <SecretAccessKey>secret-of-{key}</SecretAccessKey>
      <SessionToken>token-of-{key}</SessionToken>
      <Expiration>{expiration}</Expiration>
    </Credentials>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/reader/session</Arn>
      <AssumedRoleId>AROAEXAMPLE:session</AssumedRoleId>
    </AssumedRoleUser>
  </{operation}Result>
  <ResponseMetadata><RequestId>stub</RequestId></ResponseMetadata>
</{operation}Response>"#
        )
    };
    if method == "POST" && body.contains("Action=AssumeRoleWithWebIdentity") {
        (
            "text/xml",
            sts("AssumeRoleWithWebIdentity", "WEBIDENTITYKEY"),
        )
    } else if method == "POST" && body.contains("Action=AssumeRole&") {
        ("text/xml", sts("AssumeRole", "ASSUMEDROLEKEY"))
    } else if method == "GET" && path.starts_with("/federation/credentials") {
        let expiration_ms = (std::time::SystemTime::now() + Duration::from_secs(3600))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        (
            "application/json",
            format!(
                r#"{{"roleCredentials":{{"accessKeyId":"SSOROLEKEY","secretAccessKey":"secret","sessionToken":"token","expiration":{expiration_ms}}}}}"#
            ),
        )
    } else {
        ("text/plain", String::new())
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn a_credential_process_profile_signs_the_mount_and_is_asked_again_before_expiry() {
    let files = plain_files();
    // 32 parts of 64 KiB, for a slow reader that takes a new one every second.
    let slow = pattern(7, 2 << 20);
    let mut stored = files.clone();
    stored.insert("slow.bin".into(), slow.clone());
    let (bucket, proxy) = bucket_behind_proxy(&stored);

    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    let script = dir.path().join("credentials.sh");
    // Credentials valid for 4 seconds, numbered by call.
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             n=$(( $(cat {calls} 2>/dev/null || echo 0) + 1 ))\n\
             echo $n > {calls}\n\
             printf '{{\"Version\": 1, \"AccessKeyId\": \"PROCESS%s\", \"SecretAccessKey\": \"secret\", \
             \"SessionToken\": \"token%s\", \"Expiration\": \"%s\"}}\\n' \
             $n $n \"$(date -u -d '+4 seconds' +%Y-%m-%dT%H:%M:%SZ)\"\n",
            calls = calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "[profile reader]\ncredential_process = {}\n",
            script.display()
        ),
    )
    .unwrap();
    let call_count = || -> u32 {
        std::fs::read_to_string(&calls)
            .map(|n| n.trim().parse().unwrap())
            .unwrap_or(0)
    };

    let mount = mount_and_read_all(
        &bucket,
        &proxy,
        &files,
        &["--profile", "reader", "--read-part-size", "64KiB"],
        &[("AWS_CONFIG_FILE", &config.into_os_string())],
    );
    let before_slow_read = call_count();
    assert!(before_slow_read >= 1, "credential_process never ran");

    // A slow reader: a new part every second for six seconds, past the credentials' life.
    let file = std::fs::File::open(mount.path().join("slow.bin")).unwrap();
    // SAFETY: a valid descriptor; the advice changes nothing but read-ahead.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    assert_eq!(rc, 0);
    for second in 0..6 {
        let offset = second * (256 << 10);
        let got = read_at(&file, offset as u64, 4096).unwrap();
        assert!(got == slow[offset..offset + 4096], "bytes at {offset}");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(mount.read("slow.bin") == slow, "slow.bin");

    let calls_made = call_count();
    assert!(
        calls_made > before_slow_read,
        "credential_process was not asked again during a 6 s read of 4 s credentials"
    );
    let keys = signing_keys(&proxy);
    assert!(
        keys.iter().all(|key| key.starts_with("PROCESS")),
        "requests signed with other keys: {keys:?}"
    );
    // Each request carries credential N's session token and is signed with its secret.
    assert_signed_correctly(&proxy, |key| {
        let n = key.strip_prefix("PROCESS")?;
        Some(Secret {
            secret_access_key: "secret".into(),
            session_token: Some(format!("token{n}")),
        })
    });
    // The newest credentials signed the last request...
    assert_eq!(
        keys.last(),
        Some(&format!("PROCESS{calls_made}")),
        "{keys:?}"
    );
    // ...and the process was asked far less often than requests were signed.
    assert!(
        (calls_made as usize) * 2 < keys.len(),
        "{calls_made} calls for {} signed requests",
        keys.len()
    );
}

#[test]
fn web_identity_credentials_come_from_sts() {
    let files = plain_files();
    let (bucket, proxy) = bucket_behind_proxy(&files);
    let sts = AwsStub::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "header.payload.signature").unwrap();
    let mount = mount_and_read_all(
        &bucket,
        &proxy,
        &files,
        &[],
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", &token.into_os_string()),
            ("AWS_ROLE_ARN", &os(ROLE_ARN)),
            ("AWS_ROLE_SESSION_NAME", &os("scdlfs-test")),
            ("AWS_REGION", &os("us-east-1")),
            ("AWS_ENDPOINT_URL_STS", &sts.url()),
        ],
    );
    let (_, _, body) = sts.asked("Action=AssumeRoleWithWebIdentity", &mount);
    assert!(
        body.contains("WebIdentityToken=header.payload.signature"),
        "{body}"
    );
    assert!(body.contains(ROLE_ARN_ENCODED), "{body}");
    assert_signed_only_with(
        &proxy,
        "WEBIDENTITYKEY",
        "secret-of-WEBIDENTITYKEY",
        Some("token-of-WEBIDENTITYKEY"),
    );
}

#[test]
fn an_assume_role_profile_asks_sts_with_its_source_profile_keys() {
    let files = plain_files();
    let (bucket, proxy) = bucket_behind_proxy(&files);
    let sts = AwsStub::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "[profile base]\naws_access_key_id = BASEKEY\naws_secret_access_key = base-secret\n\n\
             [profile reader]\nrole_arn = {ROLE_ARN}\nsource_profile = base\nregion = us-east-1\n"
        ),
    )
    .unwrap();
    // Keys in the environment lose to --profile, as with `aws --profile`.
    let mount = mount_and_read_all(
        &bucket,
        &proxy,
        &files,
        &["--profile", "reader"],
        &[
            ("AWS_CONFIG_FILE", &config.into_os_string()),
            ("AWS_ENDPOINT_URL_STS", &sts.url()),
            ("AWS_ACCESS_KEY_ID", &os("ENVIRONMENTKEY")),
            ("AWS_SECRET_ACCESS_KEY", &os("environment-secret")),
        ],
    );
    let (method, headers, body) = sts.asked("Action=AssumeRole&", &mount);
    assert_eq!(method, "POST");
    assert!(body.contains(ROLE_ARN_ENCODED), "{body}");
    assert!(
        headers.contains("Credential=BASEKEY/"),
        "AssumeRole not signed with the source profile's keys:\n{headers}"
    );
    assert_signed_only_with(
        &proxy,
        "ASSUMEDROLEKEY",
        "secret-of-ASSUMEDROLEKEY",
        Some("token-of-ASSUMEDROLEKEY"),
    );
}

#[test]
fn an_sso_profile_takes_role_credentials_with_the_cached_login_token() {
    let files = plain_files();
    let (bucket, proxy) = bucket_behind_proxy(&files);
    let portal = AwsStub::start();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config");
    std::fs::write(
        &config,
        "[profile sso-reader]\nsso_session = lab\nsso_account_id = 123456789012\n\
         sso_role_name = Reader\nregion = us-east-1\n\n\
         [sso-session lab]\nsso_start_url = https://lab.example.invalid/start\nsso_region = us-east-1\n",
    )
    .unwrap();
    // What `aws sso login --sso-session lab` leaves: the token under the SHA-1 of the
    // session's name.
    let output = std::process::Command::new("sh")
        .args(["-c", "printf lab | sha1sum"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let digest = String::from_utf8(output.stdout).unwrap();
    let digest = digest.split_whitespace().next().unwrap();
    let cache = home.path().join(".aws/sso/cache");
    std::fs::create_dir_all(&cache).unwrap();
    let expires =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3600));
    std::fs::write(
        cache.join(format!("{digest}.json")),
        format!(
            r#"{{"accessToken": "sso-login-token", "expiresAt": "{expires}", "region": "us-east-1", "startUrl": "https://lab.example.invalid/start"}}"#
        ),
    )
    .unwrap();
    let mount = mount_and_read_all(
        &bucket,
        &proxy,
        &files,
        &["--profile", "sso-reader"],
        &[
            ("HOME", &home.path().as_os_str().to_owned()),
            ("AWS_CONFIG_FILE", &config.into_os_string()),
            ("AWS_ENDPOINT_URL_SSO", &portal.url()),
        ],
    );
    let (_, headers, _) = portal.asked("/federation/credentials", &mount);
    assert!(
        headers
            .to_lowercase()
            .contains("x-amz-sso_bearer_token: sso-login-token"),
        "{headers}"
    );
    assert_signed_only_with(&proxy, "SSOROLEKEY", "secret", Some("token"));
}

#[test]
fn requester_pays_is_signed_into_every_request() {
    let files = plain_files();
    let (bucket, proxy) = bucket_behind_proxy(&files);
    mount_and_read_all(
        &bucket,
        &proxy,
        &files,
        &["--requester-pays"],
        &[
            ("AWS_ACCESS_KEY_ID", &os("ENVIRONMENTKEY")),
            ("AWS_SECRET_ACCESS_KEY", &os("environment-secret")),
        ],
    );
    let seen = proxy.seen();
    assert!(!seen.is_empty());
    for request in seen {
        assert_eq!(
            request.header("x-amz-request-payer"),
            Some("requester"),
            "{} {}",
            request.method,
            request.path
        );
        let authorization = request.header("authorization").unwrap_or_default();
        assert!(
            authorization.contains("x-amz-request-payer")
                && request.access_key_id() == Some("ENVIRONMENTKEY"),
            "{authorization}"
        );
    }
    // Keys without a session token send none.
    assert_signed_only_with(&proxy, "ENVIRONMENTKEY", "environment-secret", None);
}

#[test]
fn no_credentials_anywhere_fails_the_mount_saying_so() {
    let files = plain_files();
    let (bucket, proxy) = bucket_behind_proxy(&files);
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("mnt")).unwrap();
    let mut command = mount_command(
        &format!("s3://{bucket}/data"),
        work.path(),
        &["--endpoint-url", &proxy.endpoint()],
        &[("HOME", &work.path().as_os_str().to_owned())],
    );
    command.stderr(Stdio::piped());
    common::process::dies_with_test(&mut command);
    let out = command.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "mounted without credentials: {said}");
    assert!(
        !common::process::is_mount_point(&work.path().join("mnt")),
        "{said}"
    );
    // Once, on one line, with what the chain tried and what to do.
    let verdict = said.lines().last().unwrap_or_default();
    assert_eq!(verdict.matches("no AWS credentials").count(), 1, "{said}");
    for words in [
        "tried Environment (",
        "Profile (",
        "AWS_ACCESS_KEY_ID",
        "--profile",
        "--no-sign-request",
    ] {
        assert!(verdict.contains(words), "{words:?} not in: {verdict}");
    }
    assert!(
        proxy.seen().iter().all(|r| r.access_key_id().is_none()),
        "a request was signed"
    );
}
