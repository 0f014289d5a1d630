//! Telling systemd how the service is doing (`Type=notify` units), as `sd_notify(3)`
//! does: one datagram of `KEY=value` lines to the unix socket named by `NOTIFY_SOCKET`.
//!
//! The protocol is a single `sendto`, so it is written here rather than taken from a
//! crate. Outside systemd `NOTIFY_SOCKET` is unset and nothing is sent. A notification
//! that cannot be delivered is logged and otherwise ignored: the mount works either way,
//! and systemd reports a service that never became ready by itself.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Tells systemd that the mount answers, with a line for `systemctl status`.
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={}", one_line(status)));
}

/// Tells systemd that the service is shutting down (before unmounting, which may take
/// a while if files are open).
pub fn stopping(status: &str) {
    notify(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
}

fn notify(message: &str) {
    let Some(socket_path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(error) = send(socket_path.as_bytes(), message.as_bytes()) {
        tracing::warn!(%error, socket = ?socket_path, "cannot notify systemd");
    }
}

fn send(socket_path: &[u8], message: &[u8]) -> io::Result<()> {
    // A leading '@' names a socket in the abstract namespace, as in sd_notify(3).
    let address = match socket_path.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(socket_path))?,
    };
    let socket = UnixDatagram::unbound()?;
    let sent = socket.send_to_addr(message, &address)?;
    if sent != message.len() {
        return Err(io::Error::other("notification truncated"));
    }
    Ok(())
}

/// A newline would end the `STATUS=` assignment and start a bogus one.
fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_one_datagram_to_a_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let systemd = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str().as_bytes(), b"READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 64];
        let len = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=up");
    }

    #[test]
    fn reaches_abstract_sockets_named_with_an_at_sign() {
        let name = format!("scdlfs-notify-test-{}", std::process::id());
        let systemd =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        send(format!("@{name}").as_bytes(), b"STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let len = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
    }

    #[test]
    fn status_text_stays_on_its_line() {
        assert_eq!(one_line("cannot\nmount"), "cannot mount");
    }
}
