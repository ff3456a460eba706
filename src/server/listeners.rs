//! The listening sockets: bound here (IPv6 only on IPv6 addresses, retried while the kubelet
//! still holds the address during a rollout) or taken from those systemd or the process handing
//! over passed in ([`super::listen_fds`]).

use std::net::SocketAddr;
use std::time::Instant;

use tokio::net::TcpListener;
use tracing::warn;

use super::StartError;
use super::listen_fds::{Inherited, Role};
use super::port_holder;
use super::standby::Standby;

/// A hint for the bind errors operators meet.
pub(super) fn bind_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another process (the kubelet itself?) listens there: move the kubelet to the other \
             family's loopback (address: \"::1\" beside 0.0.0.0) first, or choose another \
             --listen-address"
        }
        std::io::ErrorKind::AddrNotAvailable => "; it is not an address of this host",
        std::io::ErrorKind::PermissionDenied => {
            "; ports below 1024 need CAP_NET_BIND_SERVICE (the shipped unit grants it)"
        }
        _ => "",
    }
}

/// A listening socket on `addr`. An IPv6 address serves IPv6 only (`IPV6_V6ONLY`), so that
/// `[::]:10250` and `0.0.0.0:10250` can be served side by side, and so that `0.0.0.0:10250`
/// (or `[::]:10250`) coexists with a kubelet on the other family's loopback (`[::1]:10250`, or
/// `127.0.0.1:10250`): the kernel only refuses a wildcard beside a specific address of the same
/// family. `SO_REUSEADDR` as Tokio sets it (a restart rebinds while old connections linger in
/// TIME_WAIT; Linux never lets a second socket listen on an address through it).
///
/// Never `SO_REUSEPORT`: with it any process of the same user could bind the same address and
/// take a share of the connections (all of them, with its own steering program), tokens
/// included. A successor gets these very sockets instead, by `SIGUSR2` ([`super::handover`]) or
/// over `--handover-socket` ([`super::handover_socket`]). The backlog is Tokio's.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// How long the admin address is retried while in use (a previous instance letting go of it).
pub(super) const ADMIN_BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest pause between two tries of an address in use: the most a client can be refused
/// between the kubelet letting go of the port and the proxy taking it.
const MAX_BIND_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// The admin listener's flag, which names its role among inherited sockets.
pub(super) const ADMIN_FLAG: &str = "--admin-listen-address";

/// Binds `addr` for `flag`, or takes the socket for it that systemd or the proxy handing over
/// passed in ([`crate::server::listen_fds`]). While another process holds the address (the kubelet
/// still on the port during a rollout), retries with a backoff from 100 ms to 500 ms for up to
/// `retry`, saying why once and then every minute; any other error, or still in use after that, is
/// a [`StartError::Bind`]. While standing by ([`Standby`]: for a previous version of the proxy,
/// ready, or for another process, not ready), retries for as long as it holds the address.
pub(super) async fn bind(
    flag: &'static str,
    addr: SocketAddr,
    retry: std::time::Duration,
    inherited: &mut Inherited,
    standby: &mut Standby,
) -> Result<TcpListener, StartError> {
    let role = if flag == ADMIN_FLAG {
        Role::Admin
    } else {
        Role::KubeletApi
    };
    if let Some(listener) = inherited.claim(role, addr) {
        return TcpListener::from_std(listener).map_err(|source| StartError::Bind {
            flag,
            addr,
            source,
        });
    }
    let started = Instant::now();
    let mut pause = std::time::Duration::from_millis(100);
    let mut said: Option<Instant> = None;
    loop {
        match listen(addr) {
            Ok(listener) => {
                standby.took(flag, addr);
                return Ok(listener);
            }
            Err(source) if source.kind() == std::io::ErrorKind::AddrInUse => {
                standby.consider(flag, addr).await;
                if standby.active() {
                    tokio::time::sleep(standby.pause()).await;
                    continue;
                }
                if started.elapsed() >= retry {
                    return Err(StartError::Bind { flag, addr, source });
                }
                if said.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(60)) {
                    let held_by = port_holder::find(addr).await;
                    warn!(flag, %addr, %held_by, waited = ?started.elapsed(), ?retry, "address in use; retrying until it is free");
                    said = Some(Instant::now());
                }
                tokio::time::sleep(pause.min(retry.saturating_sub(started.elapsed()))).await;
                pause = (pause * 2).min(MAX_BIND_PAUSE);
            }
            Err(source) => return Err(StartError::Bind { flag, addr, source }),
        }
    }
}
