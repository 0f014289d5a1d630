//! scdlfs as a service: readiness and shutdown reported to systemd, plain log lines for
//! the journal, `scdlfs status` and the Prometheus endpoint of a live mount, the fstab
//! mount helper, the install script, and the unit as `systemd-analyze verify` sees it.
//!
//! These run the real binary on a small local folder and mount for real (as root, with
//! /dev/fuse). Every daemon is held by a guard that detaches its mount and kills it,
//! so a failing test leaves no mount behind.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use common::process::{
    exit_of, foreground_mount, is_mount_point, run_ok, status_json, unmount, wait_for,
    wait_until_mounted, Cleanup, PATIENCE, SCDLFS,
};

const HELLO: &[u8] = b"hello through the mount\n";

/// A source folder with two files, an empty mountpoint and a cache directory.
struct Folders {
    dir: tempfile::TempDir,
}

impl Folders {
    fn new() -> Folders {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("source/sub")).unwrap();
        std::fs::write(dir.path().join("source/hello.txt"), HELLO).unwrap();
        std::fs::write(dir.path().join("source/sub/data.bin"), data_bytes()).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        Folders { dir }
    }

    fn source(&self) -> PathBuf {
        self.dir.path().join("source")
    }

    fn mountpoint(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// 300 KB that no two offsets confuse.
fn data_bytes() -> Vec<u8> {
    (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect()
}

/// `scdlfs mount --foreground`, killed and unmounted when dropped; its log is printed
/// if the test failed.
struct Daemon {
    log: PathBuf,
    guard: Cleanup,
}

impl Daemon {
    /// Starts the daemon on `folders` with `extra` flags and `notify_socket` as
    /// NOTIFY_SOCKET (none: unset); its stderr goes to the file `log`, as it would go
    /// to the journal.
    fn start(
        folders: &Folders,
        extra: &[&str],
        notify_socket: Option<&Path>,
        log: &Path,
    ) -> Daemon {
        let (source, mountpoint) = (folders.source(), folders.mountpoint());
        let mut command = foreground_mount(
            &source,
            &mountpoint,
            &folders.cache(),
            &["--cache-size", "64MiB"],
        );
        command
            .args(extra)
            .env_remove("NOTIFY_SOCKET")
            .stderr(std::fs::File::create(log).unwrap());
        if let Some(socket) = notify_socket {
            command.env("NOTIFY_SOCKET", socket);
        }
        let mut guard = Cleanup::unmounting(mountpoint);
        guard.spawn(&mut command);
        Daemon {
            log: log.to_owned(),
            guard,
        }
    }

    fn child(&mut self) -> &mut Child {
        &mut self.guard.children[0]
    }

    /// Waits until the mountpoint lists (for tests that do not listen to systemd's
    /// socket).
    fn wait_until_mounted(&mut self, folders: &Folders) {
        wait_until_mounted(&folders.mountpoint(), self.child());
    }

    fn signal(&mut self, signal: libc::c_int) {
        let pid = self.child().id() as i32;
        // SAFETY: kill on the pid of a child we have not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    fn wait_for_exit(&mut self) -> ExitStatus {
        exit_of(self.child(), "the daemon to exit", PATIENCE)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- the daemon's log ---\n{log}--- end of the daemon's log ---");
        }
    }
}

/// A socket standing in for systemd's notification socket.
fn notify_socket(folders: &Folders) -> (UnixDatagram, PathBuf) {
    let path = folders.path("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    (socket, path)
}

fn receive(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let len = socket
        .recv(&mut buf)
        .expect("no notification from the daemon");
    String::from_utf8(buf[..len].to_vec()).unwrap()
}

/// The port the daemon logged it serves metrics on (it was given port 0: the kernel
/// picks a free one, so no other process can take it in between).
fn logged_metrics_port(log: &Path) -> u16 {
    let mut port = None;
    wait_for("a metrics address in the log", || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        port = text
            .split("http://127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|port| port.parse().ok());
        port.is_some()
    });
    port.unwrap()
}

/// One raw HTTP/1.1 exchange: (status line, headers and body as one string).
fn http_get(port: u16, target: &str) -> (String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (status_line, rest) = response.split_once("\r\n").unwrap();
    (status_line.to_owned(), rest.to_owned())
}

/// The value of the sample line `name VALUE` in a Prometheus text page.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name} in:\n{page}"))
        .parse()
        .unwrap()
}

#[test]
fn systemd_hears_ready_only_once_the_mount_answers() {
    let folders = Folders::new();
    let (systemd, socket_path) = notify_socket(&folders);
    assert!(!is_mount_point(&folders.mountpoint()));
    let _daemon = Daemon::start(&folders, &[], Some(&socket_path), &folders.path("log"));

    let message = receive(&systemd);

    assert!(message.lines().any(|l| l == "READY=1"), "{message:?}");
    assert!(
        message.lines().any(|l| l.starts_with("STATUS=Mounted ")),
        "{message:?}"
    );
    assert!(is_mount_point(&folders.mountpoint()));
    assert_eq!(
        std::fs::read(folders.mountpoint().join("hello.txt")).unwrap(),
        HELLO
    );
}

#[test]
fn sigterm_tells_systemd_stopping_then_unmounts_and_exits_zero() {
    let folders = Folders::new();
    let (systemd, socket_path) = notify_socket(&folders);
    let mut daemon = Daemon::start(&folders, &[], Some(&socket_path), &folders.path("log"));
    assert!(receive(&systemd).starts_with("READY=1"));

    daemon.signal(libc::SIGTERM);

    let message = receive(&systemd);
    assert!(message.lines().any(|l| l == "STOPPING=1"), "{message:?}");
    assert!(daemon.wait_for_exit().success());
    assert!(!is_mount_point(&folders.mountpoint()));
}

#[test]
fn the_log_for_the_journal_is_plain_text_one_line_per_event() {
    let folders = Folders::new();
    let log = folders.path("log");
    // Stopped once it reported ready, as systemd would: a SIGTERM between the mount
    // appearing and the handlers being installed would kill it.
    let (systemd, socket_path) = notify_socket(&folders);
    let mut daemon = Daemon::start(&folders, &[], Some(&socket_path), &log);
    assert!(receive(&systemd).starts_with("READY=1"));
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_for_exit().success());

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains('\x1b'), "colour codes in:\n{text}");
    assert!(text.contains("mounted"), "{text}");
    for line in text.lines() {
        let level = line.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
            "not an event line: {line:?}"
        );
    }
}

#[test]
fn status_json_shows_bytes_read_and_fetched_moving() {
    let folders = Folders::new();
    let mut daemon = Daemon::start(&folders, &[], None, &folders.path("log"));
    daemon.wait_until_mounted(&folders);
    let before = status_json(&folders.mountpoint());

    let data = std::fs::read(folders.mountpoint().join("sub/data.bin")).unwrap();
    assert_eq!(data, data_bytes());

    let counter =
        |status: &serde_json::Value, name: &str| status["counters"][name].as_u64().unwrap();
    // A read is answered as its bytes arrive; the download is counted once it ends.
    let mut after = status_json(&folders.mountpoint());
    wait_for("the download counted", || {
        after = status_json(&folders.mountpoint());
        counter(&after, "bytes_fetched") >= counter(&before, "bytes_fetched") + 300_000
    });
    // A read the disk cache answers may store the bytes around it into the page cache
    // (`--cache-read-around`), and the reads those bytes spare never reach the daemon.
    let delivered = |status: &serde_json::Value| {
        counter(status, "bytes_read") + counter(status, "read_around_bytes")
    };
    assert!(delivered(&after) >= delivered(&before) + 300_000);
    assert!(counter(&after, "bytes_fetched") >= counter(&before, "bytes_fetched") + 300_000);
    let rates = &after["rates"];
    assert!(rates["fetched_bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(rates["recent_fetched_bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(rates["recent_seconds"].as_f64().unwrap() > 0.0);
    let hit_ratio = rates["cache_hit_ratio"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hit_ratio));
}

/// A mounted daemon serving its metrics on a free port of 127.0.0.1, and that port.
fn mounted_with_metrics() -> (Folders, Daemon, u16) {
    let folders = Folders::new();
    let mut daemon = Daemon::start(
        &folders,
        &["--metrics-addr", "127.0.0.1:0"],
        None,
        &folders.path("log"),
    );
    daemon.wait_until_mounted(&folders);
    let port = logged_metrics_port(&folders.path("log"));
    (folders, daemon, port)
}

#[test]
fn prometheus_counters_are_served_and_move_with_reads() {
    let (folders, _daemon, port) = mounted_with_metrics();
    std::fs::read(folders.mountpoint().join("hello.txt")).unwrap();

    let (status_line, first) = http_get(port, "/metrics");
    assert_eq!(status_line, "HTTP/1.1 200 OK");
    assert!(first.contains("Content-Type: text/plain; version=0.0.4"));
    assert!(first.contains("# TYPE scdlfs_read_bytes_total counter\n"));
    assert!(first.contains("# HELP scdlfs_fetched_bytes_total "));
    assert!(first.contains("# TYPE scdlfs_cache_bytes gauge\n"));
    // The client libraries' standard process metrics, as a dashboard expects them.
    assert!(sample(&first, "process_cpu_seconds_total") >= 0.0);
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(sample(&first, name) > 0.0, "{name}");
    }
    // Bytes reach readers as replies or stored around a read from the disk cache.
    let delivered = |metrics: &str| {
        sample(metrics, "scdlfs_read_bytes_total")
            + sample(metrics, "scdlfs_read_around_bytes_total")
    };
    let delivered_before = delivered(&first);
    let fetched_before = sample(&first, "scdlfs_fetched_bytes_total");
    assert!(delivered_before >= HELLO.len() as f64);

    std::fs::read(folders.mountpoint().join("sub/data.bin")).unwrap();

    // A read is answered as its bytes arrive; the download is counted once it ends.
    let mut second = String::new();
    wait_for("the download counted", || {
        second = http_get(port, "/metrics").1;
        sample(&second, "scdlfs_fetched_bytes_total") >= fetched_before + 300_000.0
    });
    assert!(delivered(&second) >= delivered_before + 300_000.0);
    assert!(sample(&second, "scdlfs_fetched_bytes_total") >= fetched_before + 300_000.0);
    assert_eq!(http_get(port, "/").0, "HTTP/1.1 404 Not Found");
}

/// The metrics page as Prometheus's own checker reads it: no problem reported
/// (counters end in `_total`, names in base units, help on everything), durations as
/// histograms in seconds that count what happened, a high-water mark as a gauge.
#[test]
fn the_metrics_page_passes_promtool_with_durations_as_histograms() {
    let (folders, _daemon, port) = mounted_with_metrics();
    let data = std::fs::read(folders.mountpoint().join("sub/data.bin")).unwrap();
    assert!(data == data_bytes());

    let mut page = String::new();
    wait_for("the GETs counted", || {
        let (_, response) = http_get(port, "/metrics");
        page = response.split_once("\r\n\r\n").unwrap().1.to_owned();
        sample(&page, "scdlfs_store_get_seconds_count") >= 1.0
    });
    let checked = promtool_check_metrics(&page);
    assert!(
        checked.status.success(),
        "promtool check metrics: {checked:?}\n{page}"
    );

    for histogram in ["scdlfs_demand_wait_seconds", "scdlfs_store_get_seconds"] {
        assert!(page.contains(&format!("# TYPE {histogram} histogram\n")));
        let count = sample(&page, &format!("{histogram}_count"));
        assert!(
            count >= 1.0,
            "{histogram}: the first read of a file waits on a GET"
        );
        assert_eq!(
            sample(&page, &format!("{histogram}_bucket{{le=\"+Inf\"}}")),
            count
        );
        assert!(sample(&page, &format!("{histogram}_sum")) > 0.0);
    }
    assert!(page.contains("# TYPE scdlfs_fetch_memory_peak_bytes gauge\n"));
    assert!(sample(&page, "scdlfs_fetch_memory_peak_bytes") > 0.0);
}

/// `promtool check metrics` of `page`. promtool is `$SCDLFS_PROMTOOL`, else where
/// scripts/setup-promtool puts it; scripts/test-all installs it, so a missing one
/// fails the test rather than skipping it.
fn promtool_check_metrics(page: &str) -> std::process::Output {
    let promtool = std::env::var_os("SCDLFS_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/promtool"));
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run promtool at {} ({error}): run scripts/setup-promtool or set SCDLFS_PROMTOOL",
                promtool.display()
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn the_fstab_helper_mounts_with_mount_options_turned_into_flags() {
    let folders = Folders::new();
    let _mount = Cleanup::unmounting(folders.mountpoint());
    let cache_dir = format!("cache-dir={}", folders.cache().display());
    let options = [
        "rw",
        "_netdev",
        "nofail",
        "x-systemd.automount",
        &cache_dir,
        "cache_size=64MiB",
        "view=raw",
    ]
    .join(",");

    run_ok(
        Command::new("sh")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/mount.scdlfs"))
            .arg(folders.source())
            .arg(folders.mountpoint())
            .args(["-o", &options])
            .env("SCDLFS_BIN", SCDLFS),
    );
    assert_eq!(
        std::fs::read(folders.mountpoint().join("hello.txt")).unwrap(),
        HELLO
    );
    let status = status_json(&folders.mountpoint());
    assert_eq!(status["cache"]["budget_bytes"], 64 << 20);
    // The detached daemon logs into its cache directory: cache-dir was passed on.
    assert!(folders.cache().join("scdlfs.log").exists());
    unmount(&folders.mountpoint());
}

#[test]
fn the_install_script_puts_binary_unit_helper_and_example_config_in_place() {
    let folders = Folders::new();
    let root = folders.path("root");
    let binary = folders.path("scdlfs-binary");
    std::fs::write(&binary, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();

    run_ok(
        Command::new("sh")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/install.sh"))
            .arg(&binary)
            .env("DESTDIR", &root)
            .env("BINDIR", "/opt/scdlfs/bin"),
    );
    let mode = |path: &str| {
        std::fs::metadata(root.join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("opt/scdlfs/bin/scdlfs"), 0o755);
    assert_eq!(mode("sbin/mount.scdlfs"), 0o755);
    assert_eq!(mode("etc/systemd/system/scdlfs@.service"), 0o644);
    assert_eq!(mode("etc/scdlfs"), 0o700);
    assert_eq!(mode("etc/scdlfs/example.conf"), 0o600);
    let unit = std::fs::read_to_string(root.join("etc/systemd/system/scdlfs@.service")).unwrap();
    assert!(unit.contains("ExecStart=/opt/scdlfs/bin/scdlfs mount --foreground "));
    assert!(!unit.contains("/usr/local/bin"));
    let helper = std::fs::read_to_string(root.join("sbin/mount.scdlfs")).unwrap();
    assert!(helper.contains("${SCDLFS_BIN:-/opt/scdlfs/bin/scdlfs}"));
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let folders = Folders::new();
    // A template verifies as one of its instances; ExecStart must name a real binary.
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/scdlfs@.service"),
    )
    .unwrap()
    .replace("/usr/local/bin/scdlfs", SCDLFS);
    let instance = folders.path("scdlfs@example.service");
    std::fs::write(&instance, unit).unwrap();

    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&instance)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run systemd-analyze ({e}); install it: apt-get install -y systemd")
        });

    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    // Unknown keys and bad values are only warnings, with the exit status still 0.
    let about_our_unit: Vec<&str> = said.lines().filter(|l| l.contains("scdlfs")).collect();
    assert!(about_our_unit.is_empty(), "{}", about_our_unit.join("\n"));
}
