//! Listening sockets the proxy is given at start instead of binding them: by systemd socket
//! activation (`systemd/kubelet-auth-proxy.socket`), or by the proxy it replaces on `SIGUSR2`
//! ([`crate::server::handover`]). Both use the systemd convention: descriptors
//! `3 .. 3 + LISTEN_FDS`, named by the colon-separated `LISTEN_FDNAMES`.
//!
//! Whom they are for: systemd sets `LISTEN_PID` to the receiving process. A proxy handing over
//! cannot know its successor's pid before `exec` (std's `Command` gives none, and setting a
//! variable between `fork` and `exec` is not async-signal-safe), so it leaves `LISTEN_PID` unset
//! and names itself in `KUBELET_AUTH_PROXY_HANDOVER_FROM` instead: the sockets are taken when that
//! is the parent's pid. Either check keeps a grandchild that inherited the variables from taking
//! descriptors that are not sockets for it.
//!
//! A socket is matched to a listen address by its own local address; a configured port 0 (tests)
//! takes the first inherited socket of its role (`LISTEN_FDNAMES`) on the same IP. Sockets no
//! address claims are closed, with a warning.
#![allow(unsafe_code)]

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::Socket;
use tracing::{info, warn};

/// The first descriptor of the convention.
pub const FIRST_FD: RawFd = 3;
/// systemd's variables.
pub const LISTEN_PID: &str = "LISTEN_PID";
/// How many descriptors, from [`FIRST_FD`].
pub const LISTEN_FDS: &str = "LISTEN_FDS";
/// Their names, colon-separated.
pub const LISTEN_FDNAMES: &str = "LISTEN_FDNAMES";
/// Set by a proxy handing over to its child: the parent's pid, standing in for `LISTEN_PID`.
pub const HANDOVER_FROM: &str = "KUBELET_AUTH_PROXY_HANDOVER_FROM";

/// What a socket serves, as its `LISTEN_FDNAMES` entry names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A `--listen-address`.
    KubeletApi,
    /// The `--admin-listen-address`.
    Admin,
}

impl Role {
    /// The name in `LISTEN_FDNAMES` (and `FileDescriptorName=` in a socket unit).
    pub fn name(self) -> &'static str {
        match self {
            Role::KubeletApi => "kubelet-api",
            Role::Admin => "admin",
        }
    }
}

/// Set once the descriptors have been taken: they belong to one owner for the process's life.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Why inherited descriptors were refused. The proxy then binds its addresses itself.
#[derive(Debug, thiserror::Error)]
pub enum InheritError {
    /// `LISTEN_FDS` is not a count.
    #[error("{LISTEN_FDS}={0:?}: not a number of descriptors")]
    Count(String),
    /// An inherited descriptor is not a listening TCP socket.
    #[error(
        "{LISTEN_FDS}: descriptor {fd} is not a listening TCP socket{}; check the socket unit's ListenStream= lines",
        cause.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
    )]
    NotAListener {
        /// The descriptor.
        fd: RawFd,
        /// What the operating system said, if it said anything.
        #[source]
        cause: Option<std::io::Error>,
    },
}

/// One inherited listening socket.
#[derive(Debug)]
struct InheritedSocket {
    name: String,
    addr: SocketAddr,
    socket: Socket,
}

impl InheritedSocket {
    /// Checks that `fd` is a listening TCP socket and makes it ready to serve: close-on-exec (not
    /// for the proxy's own children, unless handed over on purpose) and non-blocking.
    fn adopt(name: String, fd: OwnedFd) -> Result<InheritedSocket, InheritError> {
        let raw = fd.as_raw_fd();
        let socket = Socket::from(fd);
        let not_a_listener = |cause| InheritError::NotAListener { fd: raw, cause };
        if !socket.is_listener().map_err(|e| not_a_listener(Some(e)))? {
            return Err(not_a_listener(None));
        }
        let addr = socket
            .local_addr()
            .map_err(|e| not_a_listener(Some(e)))?
            .as_socket()
            .ok_or_else(|| not_a_listener(None))?;
        socket
            .set_cloexec(true)
            .map_err(|e| not_a_listener(Some(e)))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| not_a_listener(Some(e)))?;
        if socket.reuse_port().unwrap_or(false) {
            warn!(
                name,
                %addr,
                "this listening socket has SO_REUSEPORT (bound by an earlier version of the proxy, or by a \
                 socket unit with ReusePort=yes): any process of the same user can bind the same \
                 address and take a share of its connections. It stays in service, since closing \
                 it would refuse connections; restart the proxy once (systemctl restart, outside \
                 busy hours) to bind a socket nobody can join, and remove ReusePort= from the \
                 socket unit"
            );
        }
        Ok(InheritedSocket { name, addr, socket })
    }
}

/// The inherited sockets not yet claimed by an address.
#[derive(Debug, Default)]
pub struct Inherited {
    sockets: Vec<InheritedSocket>,
}

impl Inherited {
    /// Takes the descriptors meant for this process, if any (once per process: later calls, and
    /// calls in a process they are not meant for, find none).
    pub fn take() -> Result<Inherited, InheritError> {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let parent = rustix::process::getppid().map(|pid| pid.as_raw_nonzero().get());
        let meant_for_me = match std::env::var(LISTEN_PID) {
            Ok(pid) => pid.parse::<i32>().ok() == Some(me),
            Err(_) => std::env::var(HANDOVER_FROM)
                .ok()
                .and_then(|pid| pid.parse::<i32>().ok())
                .is_some_and(|from| Some(from) == parent),
        };
        let count = std::env::var(LISTEN_FDS).ok();
        let (true, Some(count)) = (meant_for_me, count) else {
            return Ok(Inherited::default());
        };
        if TAKEN.swap(true, Ordering::SeqCst) {
            return Ok(Inherited::default());
        }
        let count: RawFd = count
            .parse()
            .ok()
            .filter(|n| (0..=1024).contains(n))
            .ok_or(InheritError::Count(count.clone()))?;
        let names = std::env::var(LISTEN_FDNAMES).unwrap_or_default();
        let mut names = names.split(':');
        let mut sockets = Vec::new();
        for fd in FIRST_FD..FIRST_FD + count {
            // SAFETY: the variables checked above say descriptors 3 .. 3 + LISTEN_FDS were opened
            // for this process (the systemd convention), and TAKEN makes this the only place that
            // ever owns them.
            let socket = unsafe { OwnedFd::from_raw_fd(fd) };
            let name = names.next().unwrap_or("").to_owned();
            sockets.push(InheritedSocket::adopt(name, socket)?);
        }
        Ok(Inherited::of(sockets, "inherited"))
    }

    /// The sockets a running proxy handed over through `--handover-socket`
    /// ([`crate::server::handover_socket`]), named as in `LISTEN_FDNAMES`.
    pub fn handed_over(sockets: Vec<(String, OwnedFd)>) -> Result<Inherited, InheritError> {
        let sockets = sockets
            .into_iter()
            .map(|(name, fd)| InheritedSocket::adopt(name, fd))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Inherited::of(sockets, "handed over"))
    }

    fn of(sockets: Vec<InheritedSocket>, how: &'static str) -> Inherited {
        info!(
            sockets = ?sockets.iter().map(|s| (s.name.as_str(), s.addr)).collect::<Vec<_>>(),
            "listening sockets {how}"
        );
        Inherited { sockets }
    }

    /// Whether there are sockets not yet claimed.
    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }

    /// The inherited socket for `addr` serving `role`, if there is one: the one bound to exactly
    /// `addr`, or for port 0 the first of `role` on the same IP.
    pub fn claim(&mut self, role: Role, addr: SocketAddr) -> Option<std::net::TcpListener> {
        let at = self
            .sockets
            .iter()
            .position(|s| s.addr == addr)
            .or_else(|| {
                self.sockets.iter().position(|s| {
                    addr.port() == 0 && s.name == role.name() && s.addr.ip() == addr.ip()
                })
            })?;
        Some(self.sockets.remove(at).socket.into())
    }

    /// Closes the sockets no address claimed, saying which.
    pub fn close_unclaimed(self) {
        for socket in self.sockets {
            warn!(
                name = socket.name,
                addr = %socket.addr,
                "inherited socket matches no --listen-address or --admin-listen-address; closed it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(addr: &str) -> Socket {
        let std = std::net::TcpListener::bind(addr).unwrap();
        Socket::from(std)
    }

    #[test]
    fn an_address_claims_its_own_socket_and_port_zero_the_first_of_its_role() {
        let api = listener("127.0.0.1:0");
        let admin = listener("127.0.0.1:0");
        let (api_addr, admin_addr) = (
            api.local_addr().unwrap().as_socket().unwrap(),
            admin.local_addr().unwrap().as_socket().unwrap(),
        );
        let mut inherited = Inherited {
            sockets: vec![
                InheritedSocket {
                    name: "admin".to_owned(),
                    addr: admin_addr,
                    socket: admin,
                },
                InheritedSocket {
                    name: "kubelet-api".to_owned(),
                    addr: api_addr,
                    socket: api,
                },
            ],
        };
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let elsewhere: SocketAddr = "127.0.0.2:0".parse().unwrap();
        assert!(inherited.claim(Role::KubeletApi, elsewhere).is_none());
        let claimed = inherited.claim(Role::KubeletApi, any).unwrap();
        assert_eq!(claimed.local_addr().unwrap(), api_addr);
        let claimed = inherited.claim(Role::Admin, admin_addr).unwrap();
        assert_eq!(claimed.local_addr().unwrap(), admin_addr);
        assert!(inherited.claim(Role::Admin, any).is_none());
    }

    #[test]
    fn descriptors_meant_for_another_process_are_left_alone() {
        // LISTEN_PID is never this test process's pid, and HANDOVER_FROM is not its parent.
        let inherited = Inherited::take().unwrap();
        assert!(inherited.sockets.is_empty());
    }
}
