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
//!    stopped (the rollout deletes its pod once the new one is ready), then drains as always.
//!
//! When nobody answers (the first proxy on the node, or a version from before handovers) the new
//! proxy binds its addresses itself (`server::listeners`); while a version from before handovers
//! holds them, it stands by (`server::standby`).

mod acl;
mod directory;
mod donor;
mod fetch;
mod wire;

use std::time::Duration;

pub use acl::AclError;
pub use directory::{DirectoryError, check_directory};
pub use donor::Donor;
pub use fetch::{FetchError, Fetched, fetch};

/// How long either side waits for the other to connect, ask or answer; the new process then binds
/// its addresses itself, the old one goes on serving.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `uid` is this process's effective user: the one check both sides make of the other.
fn is_our_user(uid: u32) -> bool {
    uid == rustix::process::geteuid().as_raw()
}
