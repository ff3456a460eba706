//! Standing by for a proxy from before handovers. Such a proxy (0.1) binds with `SO_REUSEPORT`
//! and does not answer `--handover-socket`, so a new proxy can neither receive its sockets nor
//! bind beside it (the new DaemonSet runs as another user, and a listener that serves never sets
//! `SO_REUSEPORT` any more). Waiting unready for the port would stall a surge rollout for ever
//! (the old pod is deleted only once the new one is ready), so when the admin address is held
//! by a process that answers `/metrics` as this proxy does, the new one reports ready and takes
//! each address the instant the old one lets go of it, trying every [`TAKEOVER_PAUSE`].
//!
//! Connections reaching the node between the old process closing its listeners and the new one
//! binding them are refused: that window (about a millisecond) happens once per node, on the first
//! rollout to a version with handovers. No unprivileged process can close it: joining the old
//! sockets needs `SO_REUSEPORT` with the old user, and a socket bound so can be joined for as
//! long as it lives.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tracing::{info, warn};

/// The pause between two tries of an address a previous version holds.
pub(super) const TAKEOVER_PAUSE: Duration = Duration::from_millis(1);
/// How often the admin address is asked whether a previous version answers there.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long one such question may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// What a proxy's `/metrics` always has.
const BUILD_INFO: &[u8] = b"kubelet_auth_proxy_build_info";

/// Whether this process stands by for a previous version, and since when.
pub(super) struct Standby {
    /// `--handover-socket` is set and nothing was handed over: the rollout expects a takeover.
    enabled: bool,
    /// Readiness: standing by counts as ready.
    standing_by: Arc<AtomicBool>,
    since: Option<Instant>,
    probed: Option<Instant>,
}

impl Standby {
    /// Standing by is possible only when `enabled`; `standing_by` is what readiness reads.
    pub(super) fn new(enabled: bool, standing_by: Arc<AtomicBool>) -> Standby {
        Standby {
            enabled,
            standing_by,
            since: None,
            probed: None,
        }
    }

    /// Whether this process stands by (a previous version holds its addresses).
    pub(super) fn active(&self) -> bool {
        self.since.is_some()
    }

    /// Called while the admin address `admin` is in use: asks it, at most every
    /// [`PROBE_INTERVAL`], whether a previous version of the proxy answers there, and if so stands
    /// by.
    pub(super) async fn consider(&mut self, admin: SocketAddr) {
        if !self.enabled
            || self.active()
            || self.probed.is_some_and(|at| at.elapsed() < PROBE_INTERVAL)
        {
            return;
        }
        self.probed = Some(Instant::now());
        if answers_as_proxy(admin).await {
            warn!(
                %admin,
                "a previous version of the proxy, which cannot hand its sockets over, holds the \
                 addresses: standing by (ready), to take each one the instant it lets go of it. \
                 Connections arriving in that instant are refused, once: later rollouts hand the \
                 sockets over"
            );
            self.since = Some(Instant::now());
            self.standing_by.store(true, Ordering::Release);
        }
    }

    /// Says how long the takeover of `addr` waited.
    pub(super) fn took(&self, flag: &str, addr: SocketAddr) {
        if let Some(since) = self.since {
            info!(flag, %addr, waited = ?since.elapsed(), "took the address over from the previous version");
        }
    }
}

/// Whether a process answering HTTP on `admin` serves this proxy's metrics.
async fn answers_as_proxy(admin: SocketAddr) -> bool {
    let target = match admin.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), admin.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), admin.port())
        }
        _ => admin,
    };
    let asked = async {
        let mut stream = TcpStream::connect(target).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        (&mut stream).take(4 << 20).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer.windows(BUILD_INFO.len()).any(|w| w == BUILD_INFO))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, asked).await,
        Ok(Ok(true))
    )
}
