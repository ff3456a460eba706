//! Standing by for a proxy from before handovers. Such a proxy (0.1) binds with `SO_REUSEPORT`
//! and does not answer `--handover-socket`, so a new proxy can neither receive its sockets nor
//! bind beside it (the new DaemonSet runs as another user, and a listener that serves never sets
//! `SO_REUSEPORT` any more). Waiting unready for the port would stall a surge rollout for ever
//! (the old pod is deleted only once the new one is ready), so when the admin address is held
//! by a process that answers `/metrics` as this proxy does, the new one reports ready and takes
//! each address the instant the old one lets go of it, trying every [`TAKEOVER_PAUSE`].
//!
//! Standing by is ready only while it is for the previous version: the holder of every address
//! is looked up ([`super::port_holder`]) and must be the process that answers `/metrics` as the
//! proxy on the admin address (the same process when both are seen, else the same user). Any
//! other holder of an address (the kubelet, anything not answering as the proxy, or a process
//! that took a port the previous version let go of) makes the process not ready, named on
//! `/readyz` and in the log once per change, and counted (`kubelet_auth_proxy_standby`); it goes
//! on trying the address, and takes it once that process lets go.
//!
//! Connections reaching the node between the old process closing its listeners and the new one
//! binding them are refused: that window (about a millisecond) happens once per node, on the first
//! rollout to a version with handovers. No unprivileged process can close it: joining the old
//! sockets needs `SO_REUSEPORT` with the old user, and a socket bound so can be joined for as
//! long as it lives.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tracing::{info, warn};

use super::listeners::ADMIN_FLAG;
use super::metrics::ServerMetrics;
use super::port_holder::{self, Holder};
use crate::admin::listener::Waiting;

/// The pause between two tries of an address a previous version holds.
const TAKEOVER_PAUSE: Duration = Duration::from_millis(1);
/// The pause between two tries of an address another process holds.
const BLOCKED_PAUSE: Duration = Duration::from_millis(100);
/// How often the holder of an address is looked at again while standing by for it.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long one question to the admin address may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// What a proxy's `/metrics` always has.
const BUILD_INFO: &[u8] = b"kubelet_auth_proxy_build_info";

/// Whom this process stands by for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// A previous version of the proxy holds the addresses: ready.
    Previous,
    /// Another process holds `addr` (`flag`'s): not ready, for `reason`.
    Other {
        /// The flag of the address.
        flag: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Who holds it, and why that is not the previous version.
        reason: String,
    },
}

/// Whether this process stands by for the holder of its addresses, and since when.
pub(super) struct Standby {
    /// `--handover-socket` is set and nothing was handed over: the rollout expects a takeover.
    enabled: bool,
    /// Every `--listen-address`, whose holders must be the previous version's too.
    listen_addresses: Vec<SocketAddr>,
    /// What readiness reads.
    waiting: Arc<ArcSwap<Waiting>>,
    metrics: Arc<ServerMetrics>,
    /// Who held the admin address while it answered as the proxy.
    previous: Option<Holder>,
    verdict: Option<Verdict>,
    since: Option<Instant>,
    /// When, and which address, the holder was last looked at.
    probed: Option<(Instant, SocketAddr)>,
}

impl Standby {
    /// Standing by is possible only when `enabled`; `waiting` is what readiness reads, and
    /// `metrics` counts whom this process stands by for.
    pub(super) fn new(
        enabled: bool,
        listen_addresses: Vec<SocketAddr>,
        waiting: Arc<ArcSwap<Waiting>>,
        metrics: Arc<ServerMetrics>,
    ) -> Standby {
        Standby {
            enabled,
            listen_addresses,
            waiting,
            metrics,
            previous: None,
            verdict: None,
            since: None,
            probed: None,
        }
    }

    /// Whether this process stands by (another process holds its addresses, and it keeps trying
    /// them for as long as it does).
    pub(super) fn active(&self) -> bool {
        self.verdict.is_some()
    }

    /// The pause before the next try of an address: short while a previous version, which is
    /// about to let go, holds it.
    pub(super) fn pause(&self) -> Duration {
        match self.verdict {
            Some(Verdict::Previous) => TAKEOVER_PAUSE,
            _ => BLOCKED_PAUSE,
        }
    }

    /// Called while `addr` (`flag`'s) is in use: looks, at most every [`PROBE_INTERVAL`] for one
    /// address, at who holds it, and stands by accordingly.
    pub(super) async fn consider(&mut self, flag: &'static str, addr: SocketAddr) {
        if !self.enabled
            || self
                .probed
                .is_some_and(|(at, probed)| probed == addr && at.elapsed() < PROBE_INTERVAL)
        {
            return;
        }
        // A listen address is stood by for only once the admin address answered as the proxy.
        if flag != ADMIN_FLAG && self.previous.is_none() {
            return;
        }
        self.probed = Some((Instant::now(), addr));
        let holder = port_holder::find(addr).await;
        if holder.is_nobody() {
            // Let go of meanwhile: the next try takes it.
            return;
        }
        let verdict = if flag == ADMIN_FLAG {
            self.on_admin(addr, holder).await
        } else {
            self.on_listen(flag, addr, &holder)
        };
        self.settle(verdict);
    }

    /// The admin address is held by `holder`: the previous version if it answers as the proxy
    /// and holds the listen addresses too; another process if it does not, once this process
    /// stood by.
    async fn on_admin(&mut self, admin: SocketAddr, holder: Holder) -> Option<Verdict> {
        if !answers_as_proxy(admin).await {
            return self.verdict.as_ref().map(|_| Verdict::Other {
                flag: ADMIN_FLAG,
                addr: admin,
                reason: format!(
                    "held by {holder}, which does not answer /metrics as the proxy does"
                ),
            });
        }
        self.previous = Some(holder.clone());
        for &addr in &self.listen_addresses {
            let held = port_holder::find(addr).await;
            if !held.is_nobody() && !held.same_as(&holder) {
                return Some(Verdict::Other {
                    flag: "--listen-address",
                    addr,
                    reason: format!(
                        "held by {held}, not by the previous version of the proxy ({holder}, \
                         on {ADMIN_FLAG} {admin})"
                    ),
                });
            }
        }
        Some(Verdict::Previous)
    }

    /// A listen address is held by `holder`: the previous version if it is the process that
    /// answered as the proxy on the admin address; not standing by if none did.
    fn on_listen(&self, flag: &'static str, addr: SocketAddr, holder: &Holder) -> Option<Verdict> {
        let previous = self.previous.as_ref()?;
        if holder.same_as(previous) {
            return Some(Verdict::Previous);
        }
        Some(Verdict::Other {
            flag,
            addr,
            reason: format!(
                "held by {holder}, not by the previous version of the proxy ({previous}), which \
                 let go of {ADMIN_FLAG}"
            ),
        })
    }

    /// Takes `verdict` on, saying so when it changes.
    fn settle(&mut self, verdict: Option<Verdict>) {
        if verdict == self.verdict {
            return;
        }
        match &verdict {
            Some(Verdict::Previous) => {
                warn!(
                    "a previous version of the proxy, which cannot hand its sockets over, holds \
                     the addresses: standing by (ready), to take each one the instant it lets go \
                     of it. Connections arriving in that instant are refused, once: later \
                     rollouts hand the sockets over"
                );
                self.waiting.store(Arc::new(Waiting::ForTakeover));
                self.metrics.standing_by(Some("previous_version"));
            }
            Some(Verdict::Other { flag, addr, reason }) => {
                let said = format!("standing by, not ready: {flag} {addr} is {reason}");
                warn!(
                    flag,
                    %addr,
                    "{said}; trying the addresses every {BLOCKED_PAUSE:?} until they are let \
                     go of. Find out why that process holds it (ss -ltnp 'sport = :{}')",
                    addr.port()
                );
                self.waiting.store(Arc::new(Waiting::Blocked(said.into())));
                self.metrics.standing_by(Some("other_process"));
            }
            None => {
                self.waiting.store(Arc::new(Waiting::Held));
                self.metrics.standing_by(None);
            }
        }
        self.since.get_or_insert_with(Instant::now);
        self.verdict = verdict;
    }

    /// Says how long the takeover of `addr` waited.
    pub(super) fn took(&self, flag: &str, addr: SocketAddr) {
        let Some(since) = self.since else {
            return;
        };
        let waited = since.elapsed();
        match self.verdict {
            Some(Verdict::Previous) => {
                info!(flag, %addr, ?waited, "took the address over from the previous version");
            }
            _ => info!(flag, %addr, ?waited, "took the address over once its holder let go of it"),
        }
    }

    /// Every address is bound: no longer standing by (readiness then reads that it listens).
    pub(super) fn done(&self) {
        if self.verdict.is_some() {
            self.metrics.standing_by(None);
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
