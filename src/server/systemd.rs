//! Readiness and shutdown notifications to systemd (`Type=notify` units), the `sd_notify` protocol
//! without a C library: one datagram of `KEY=value` lines to the socket named by `NOTIFY_SOCKET`.
//! Outside systemd the variable is unset and every call is a no-op.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The environment variable systemd sets for services that may notify it.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Bound on one send: the service manager drains its socket promptly, and a stuck one must not
/// stall start-up or shutdown for longer than this.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a notification could not be sent. Never fatal for the proxy: the caller logs it (systemd then
/// reports the start as timed out, which names the problem on its side too).
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is set to something other than an absolute path or `@abstract` name (for
    /// example systemd's `vsock:` form, which this build does not speak).
    #[error("{NOTIFY_SOCKET}={0:?}: not an absolute socket path or an @abstract socket name")]
    UnsupportedAddress(String),
    /// The address has the right form but cannot be a unix socket address (too long, NUL byte).
    #[error("{NOTIFY_SOCKET}={value:?}: {source}")]
    InvalidAddress {
        /// The variable's value, lossily decoded.
        value: String,
        /// What the socket layer said.
        #[source]
        source: io::Error,
    },
    /// A status text with a line break would be read as further `KEY=value` assignments (a forged
    /// `READY=1` or `MAINPID=`), so it is refused rather than sent.
    #[error("status text {0:?} contains a control character")]
    InvalidStatus(String),
    /// Creating the socket or sending the datagram failed (no listener, permission, timeout).
    #[error("notifying systemd of {state}: {source}")]
    Send {
        /// The state being announced (`READY=1`, `STOPPING=1`, `STATUS`).
        state: &'static str,
        /// What the socket layer said.
        #[source]
        source: io::Error,
    },
}

/// Tells systemd the proxy is serving: both listeners are bound, so dependent units may start.
/// A no-op outside systemd.
pub fn notify_ready() -> Result<(), NotifyError> {
    match from_environment()? {
        Some(socket) => socket.ready(),
        None => Ok(()),
    }
}

/// Tells systemd the proxy is shutting down (draining connections), so the stop is shown as such
/// rather than as a crash. A no-op outside systemd.
pub fn notify_stopping() -> Result<(), NotifyError> {
    match from_environment()? {
        Some(socket) => socket.stopping(),
        None => Ok(()),
    }
}

/// Tells systemd that `pid`, the process this one handed its sockets to, is the service's main
/// process from now on, so that it follows the new process and this one may exit. A no-op
/// outside systemd.
pub fn notify_main_pid(pid: u32) -> Result<(), NotifyError> {
    match from_environment()? {
        Some(socket) => socket.main_pid(pid),
        None => Ok(()),
    }
}

/// Sets the one-line status `systemctl status` shows. A no-op outside systemd.
pub fn notify_status(status: &str) -> Result<(), NotifyError> {
    match from_environment()? {
        Some(socket) => socket.status(status),
        None => Ok(()),
    }
}

fn from_environment() -> Result<Option<NotifySocket>, NotifyError> {
    NotifySocket::from_value(std::env::var_os(NOTIFY_SOCKET).as_deref())
}

/// The service manager's notification socket, as named by `NOTIFY_SOCKET`.
#[derive(Debug)]
pub struct NotifySocket {
    address: SocketAddr,
}

impl NotifySocket {
    /// Parses a `NOTIFY_SOCKET` value: `None` or an empty value means "not under systemd"; a value
    /// starting with `/` is a filesystem socket, one starting with `@` a Linux abstract socket.
    pub fn from_value(value: Option<&OsStr>) -> Result<Option<NotifySocket>, NotifyError> {
        let Some(value) = value.filter(|value| !value.is_empty()) else {
            return Ok(None);
        };
        let invalid = |source| NotifyError::InvalidAddress {
            value: value.to_string_lossy().into_owned(),
            source,
        };
        let address = match value.as_bytes() {
            [b'/', ..] => SocketAddr::from_pathname(value).map_err(invalid)?,
            [b'@', name @ ..] => abstract_address(name).map_err(invalid)?,
            _ => {
                return Err(NotifyError::UnsupportedAddress(
                    value.to_string_lossy().into_owned(),
                ));
            }
        };
        Ok(Some(NotifySocket { address }))
    }

    /// Sends `READY=1` with a status line.
    pub fn ready(&self) -> Result<(), NotifyError> {
        self.send("READY=1", b"READY=1\nSTATUS=Serving")
    }

    /// Sends `STOPPING=1` with a status line.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.send("STOPPING=1", b"STOPPING=1\nSTATUS=Draining connections")
    }

    /// Sends `MAINPID=<pid>` with a status line.
    pub fn main_pid(&self, pid: u32) -> Result<(), NotifyError> {
        let message = format!("MAINPID={pid}\nSTATUS=Handed over to process {pid}");
        self.send("MAINPID", message.as_bytes())
    }

    /// Sends `STATUS=<status>`; refuses a status containing control characters.
    pub fn status(&self, status: &str) -> Result<(), NotifyError> {
        if status.chars().any(char::is_control) {
            return Err(NotifyError::InvalidStatus(status.to_owned()));
        }
        self.send("STATUS", format!("STATUS={status}").as_bytes())
    }

    /// One datagram from a fresh unbound socket, as `sd_notify` does: systemd identifies the
    /// sender by its credentials, not by an address.
    fn send(&self, state: &'static str, message: &[u8]) -> Result<(), NotifyError> {
        let failed = |source| NotifyError::Send { state, source };
        let socket = UnixDatagram::unbound().map_err(failed)?;
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(failed)?;
        socket
            .send_to_addr(message, &self.address)
            .map_err(failed)?;
        Ok(())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_address(name: &[u8]) -> io::Result<SocketAddr> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_address(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract unix sockets exist only on Linux",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    use crate::test_fixtures::TempDir;

    /// A listener standing in for systemd's notification socket.
    fn listener(dir: &TempDir) -> (UnixDatagram, NotifySocket) {
        let path = dir.0.join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let socket = NotifySocket::from_value(Some(path.as_os_str()))
            .unwrap()
            .unwrap();
        (listener, socket)
    }

    fn receive(listener: &UnixDatagram) -> String {
        let mut buffer = [0u8; 512];
        let n = listener.recv(&mut buffer).unwrap();
        String::from_utf8(buffer[..n].to_vec()).unwrap()
    }

    #[test]
    fn ready_and_stopping_reach_the_socket_as_sd_notify_datagrams() {
        let dir = TempDir::new("states");
        let (listener, socket) = listener(&dir);
        socket.ready().unwrap();
        assert_eq!(receive(&listener), "READY=1\nSTATUS=Serving");
        socket.stopping().unwrap();
        assert_eq!(
            receive(&listener),
            "STOPPING=1\nSTATUS=Draining connections"
        );
        socket.main_pid(4242).unwrap();
        assert_eq!(
            receive(&listener),
            "MAINPID=4242\nSTATUS=Handed over to process 4242"
        );
        socket.status("Serving 3 connections").unwrap();
        assert_eq!(receive(&listener), "STATUS=Serving 3 connections");
    }

    #[test]
    fn a_status_that_could_forge_other_assignments_is_refused_unsent() {
        let dir = TempDir::new("forged");
        let (listener, socket) = listener(&dir);
        let err = socket.status("ok\nREADY=1").unwrap_err();
        assert!(matches!(err, NotifyError::InvalidStatus(_)), "{err}");
        listener.set_nonblocking(true).unwrap();
        let mut buffer = [0u8; 64];
        let nothing = listener.recv(&mut buffer).unwrap_err();
        assert_eq!(nothing.kind(), io::ErrorKind::WouldBlock);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn abstract_sockets_are_reached_by_their_at_name() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("kubelet-auth-proxy-test-{}", std::process::id());
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let value = OsString::from(format!("@{name}"));
        let socket = NotifySocket::from_value(Some(&value)).unwrap().unwrap();
        socket.ready().unwrap();
        assert_eq!(receive(&listener), "READY=1\nSTATUS=Serving");
    }

    #[test]
    fn unset_or_empty_variable_means_not_under_systemd() {
        assert!(NotifySocket::from_value(None).unwrap().is_none());
        assert!(
            NotifySocket::from_value(Some(OsStr::new("")))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn relative_paths_and_vsock_addresses_are_refused() {
        for value in ["run/notify", "vsock:2:1234", "notify"] {
            let err = NotifySocket::from_value(Some(OsStr::new(value))).unwrap_err();
            assert!(
                matches!(err, NotifyError::UnsupportedAddress(_)),
                "{value}: {err}"
            );
            assert!(err.to_string().contains(value), "{err}");
        }
    }

    #[test]
    fn a_path_too_long_for_a_socket_address_is_an_error_not_a_panic() {
        let long = OsString::from(format!("/{}", "a".repeat(200)));
        let err = NotifySocket::from_value(Some(&long)).unwrap_err();
        assert!(matches!(err, NotifyError::InvalidAddress { .. }), "{err}");
    }

    #[test]
    fn nobody_listening_is_reported_as_a_send_error() {
        let dir = TempDir::new("absent");
        let path = dir.0.join("nobody");
        let socket = NotifySocket::from_value(Some(path.as_os_str()))
            .unwrap()
            .unwrap();
        let err = socket.ready().unwrap_err();
        assert!(
            matches!(
                err,
                NotifyError::Send {
                    state: "READY=1",
                    ..
                }
            ),
            "{err}"
        );
    }
}
