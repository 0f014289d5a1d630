//! Servers of the tests that cannot be handed a listening socket (WsgiDAV, the GCS
//! emulator, Python's static server): started on a free port of 127.0.0.1, retried on
//! another when a different process took the port first, and killed with the test.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `bin` directory of the test venv (scripts/setup-python-venv): beside
/// `$SCDLFS_MOTO_SERVER` when set, else the repository's `.venv`.
pub fn venv_bin() -> PathBuf {
    match std::env::var_os("SCDLFS_MOTO_SERVER") {
        Some(moto) => PathBuf::from(moto).parent().unwrap().to_owned(),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin"),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server process of one test, killed when the test ends (or its thread dies).
pub struct Server {
    child: Child,
    pub url: String,
}

impl Server {
    /// Starts the server that `command_for(port)` makes, on a free port. These servers
    /// cannot take a listening socket, so a port found free can be taken by another
    /// process before the server binds it: the server then exits, and another port is
    /// tried.
    pub fn start(command_for: impl Fn(u16) -> Command) -> Server {
        let mut exits = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            let mut command = command_for(port);
            command.stdout(Stdio::null()).stderr(Stdio::null());
            super::process::dies_with_test(&mut command);
            let mut child = command
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
            let started = Instant::now();
            let listening = loop {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    break true;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    exits.push(format!("{command:?} exited ({status}) before listening"));
                    break false;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{command:?} did not listen within 30 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            if listening {
                return Server {
                    child,
                    url: format!("http://127.0.0.1:{port}"),
                };
            }
        }
        panic!("no server started on 5 free ports: {exits:#?}");
    }

    /// WsgiDAV on cheroot serving `root` read-write to anyone.
    pub fn webdav(root: &Path) -> Server {
        Server::start(|port| {
            let mut command = Command::new(venv_bin().join("wsgidav"));
            command.args([
                "--host",
                "127.0.0.1",
                "--auth",
                "anonymous",
                "--server",
                "cheroot",
            ]);
            command.arg("--port").arg(port.to_string());
            command.arg("--root").arg(root);
            command
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
