//! Handing the listening sockets to a proxy in another pod, over `--handover-socket`, instead of
//! sharing the port: the DaemonSet's surge rollout, as HAProxy's seamless reload (`-x`: sockets
//! fetched over its stats socket with `SCM_RIGHTS`) and Envoy's hot restart do it.
//!
//! On a node, step by step:
//!
//! 1. The running proxy answers on `--handover-socket`, a unix socket in a host directory only the
//!    proxy's user can reach ([`check_directory`]; never an abstract socket, which every pod on the
//!    host network could reach).
//! 2. A new proxy with the same flag connects to it before binding anything ([`fetch`]), checks
//!    that the process answering runs as its own user (`SO_PEERCRED`), asks, and receives copies
//!    of the listening sockets (`SCM_RIGHTS`), each named by its role as in `LISTEN_FDNAMES`. The
//!    running proxy checks the asker's user the same way before it sends anything ([`Donor`]).
//! 3. The new proxy serves on them. Both processes now hold the same sockets, with one accept
//!    queue each socket: a connection is accepted by one or the other, never refused, and none
//!    queued is lost when one of them closes its copy (no `tcp_migrate_req` needed).
//! 4. The new proxy takes the path over (a socket bound beside it, renamed over it) and says it
//!    serves; the old one counts the handover and stops answering there. It serves until it is
//!    stopped (the rollout deletes its pod once the new one is ready), then drains, serving the
//!    sessions still open after the grace period on (`server::drain`). The line between the two
//!    stays open: when the new one is replaced in turn and drains sessions of its own, it tells
//!    the old one to close what it still drains.
//!
//! When nobody answers (the first proxy on the node, or a version from before handovers) the new
//! proxy binds its addresses itself (`server::listeners`); while a version from before handovers
//! holds them, it stands by (`server::standby`).
//!
//! The handover never stops a start: when the directory is not the proxy's alone, or something
//! else than the proxy's socket is at the path or the name beside it ([`check`]), the proxy says
//! why and serves on addresses it binds itself, neither asking nor answering there.

mod acl;
mod directory;
mod donor;
mod fetch;
mod place;
mod wire;

use std::time::Duration;

pub use acl::AclError;
pub use directory::{DirectoryError, check_directory};
pub use donor::Donor;
pub use fetch::{FetchError, Fetched, Predecessor, fetch};
pub use place::PlaceError;

/// Why `--handover-socket` is off: this process neither asks nor answers there.
#[derive(Debug, thiserror::Error)]
pub enum Unusable {
    /// Its directory is not the proxy's alone.
    #[error(transparent)]
    Directory(#[from] DirectoryError),
    /// Something else than the proxy's socket is at the path or the name beside it.
    #[error(transparent)]
    Place(#[from] PlaceError),
}

impl Unusable {
    /// The `cause` label of the handover-socket-off metric: `directory`, `taken` or `io`.
    pub fn cause(&self) -> &'static str {
        match self {
            Unusable::Directory(_) => "directory",
            Unusable::Place(e) => e.cause(),
        }
    }
}

/// Whether `path` can be the handover socket, reading only: its directory is the proxy's alone
/// ([`check_directory`]) and the path and the name beside it hold nothing or a socket of the
/// proxy's user. The one gate before this process asks or answers there.
pub fn check(path: &std::path::Path) -> Result<(), Unusable> {
    check_directory(path)?;
    place::examine(path)?;
    Ok(())
}

/// How long either side waits for the other to connect, ask or answer; the new process then binds
/// its addresses itself, the old one goes on serving.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `uid` is this process's effective user: the one check both sides make of the other.
fn is_our_user(uid: u32) -> bool {
    uid == rustix::process::geteuid().as_raw()
}
