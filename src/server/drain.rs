//! What a stopped process does with what is still open, in one place for every way it stops.
//!
//! Draining begins at the stop (`base::shutdown`): no new connection, requests finish within
//! `--shutdown-grace-period`. What is still open after it is closed then, unless a successor
//! serves on the sockets this process handed over (a surge rollout over `--handover-socket`, or
//! `SIGUSR2`) and `--session-drain-timeout` is not zero: then the exec, attach and port-forward
//! sessions and followed logs still open are served on until each ends by itself, at most that
//! long after the stop, as HAProxy's `hard-stop-after` and Envoy's `--drain-time-s` bound an old
//! process's connections. A second stop signal or `SIGQUIT` ([`Shutdown::end_now`]) closes them
//! at once, and so does the successor when it drains sessions of its own in turn (a second
//! rollout): a node has at most one draining proxy besides the serving one.
//!
//! In a pod, a DaemonSet's rollout counts the oldest pod on each node, terminating or not, until
//! it is gone (`updateDaemonSetStatus` in the DaemonSet controller), so a pod draining for hours
//! would hold the rollout for hours. With `--drain-release-pod` the process labels its own pod
//! [`DRAINING_LABEL`] at the stop; the shipped DaemonSet's selector excludes that label, so the
//! controller releases the pod (it is no longer counted nor restarted: it is already being
//! deleted) and the rollout goes on. A pod that cannot be labelled within the grace period closes
//! its sessions with it instead: a bounded rollout matters more than a session.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::handover::Parent;
use super::handover_socket;
use super::metrics::ServerMetrics;
use crate::apiserver::{ApiCallError, ApiServerClient};
use crate::base::shutdown::Shutdown;

/// The label a draining proxy sets on its own pod; the shipped DaemonSet selects pods without
/// it.
pub const DRAINING_LABEL: &str = "kubelet-auth-proxy/draining";

/// How often a draining process says in its log what it still serves.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// How often its gauge is brought up to date: a session's end shows within a second, for the
/// price of one timer a second in a process that does nothing else.
const GAUGE_EVERY: Duration = Duration::from_secs(1);

/// `--session-drain-timeout` and `--drain-release-pod`, as the server runs them.
#[derive(Debug)]
pub struct SessionDrain {
    /// How long after the stop sessions may be served on; zero: closed with the grace period.
    pub timeout: Duration,
    /// The proxy's own pod, to release from its DaemonSet.
    pub release: Option<PodRelease>,
}

/// The pod of `--drain-release-pod` and the client that labels it.
#[derive(Debug, Clone)]
pub struct PodRelease {
    /// The API server client (the one TokenReview uses when the credentials are the same).
    pub client: ApiServerClient,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

/// The proxy this one took its sockets over from, which may still be draining sessions.
#[derive(Debug)]
pub enum Predecessor {
    /// Over `--handover-socket`: the line to it.
    Socket(handover_socket::Predecessor),
    /// By `SIGUSR2`: the parent process.
    Parent(Parent),
}

impl Predecessor {
    /// Tells it to close what it still drains.
    async fn end_its_drain(self) {
        match self {
            Predecessor::Socket(line) => line.end_its_drain().await,
            Predecessor::Parent(parent) => parent.end_its_drain(),
        }
    }
}

/// Where the predecessor is put once this process serves, for the drain to find at its stop.
#[derive(Debug, Clone, Default)]
pub(super) struct PredecessorSlot(Arc<Mutex<Option<Predecessor>>>);

impl PredecessorSlot {
    pub(super) fn put(&self, predecessor: Predecessor) {
        // A plain slot, set once and taken once: a panic elsewhere leaves it consistent.
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(predecessor);
    }

    fn take(&self) -> Option<Predecessor> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// What the drain after a stop works with.
pub(super) struct Drain {
    pub(super) sessions: SessionDrain,
    pub(super) grace_period: Duration,
    pub(super) metrics: Arc<ServerMetrics>,
    /// The admin listener on `--admin-listen-address`, which the successor shares: stopped when
    /// the session drain begins, so that for its hours the address answers for the successor
    /// alone (this process's own `--admin-socket` goes on answering).
    pub(super) admin: AbortHandle,
    /// The process this one took its sockets from, once this one serves: it may still be
    /// draining.
    pub(super) predecessor: PredecessorSlot,
}

impl Drain {
    /// Waits for what is open to end within the grace period, then either closes the rest or,
    /// with a successor, serves the sessions on (see the module documentation); returns once
    /// everything is closed.
    pub(super) async fn run(self, shutdown: &Shutdown) {
        let stopped = Instant::now();
        let timeout = self.sessions.timeout;
        let sessions_may_outlive = shutdown.has_successor() && !timeout.is_zero();
        // The release starts with the stop, beside the grace period, so the DaemonSet lets go
        // of the pod before the grace period is over.
        let release = match (&self.sessions.release, sessions_may_outlive) {
            (Some(release), true) => Some(tokio::spawn(release_pod(
                release.clone(),
                stopped + self.grace_period,
            ))),
            _ => None,
        };
        let in_time = shutdown.wait(self.grace_period).await;
        if in_time || shutdown.closing().is_cancelled() {
            // Everything ended, or was ended at once (a second signal): nothing to release.
            if let Some(release) = release {
                release.abort();
            }
            shutdown.close().await;
            return;
        }
        let released = match release {
            None => true,
            Some(release) => release.await.unwrap_or(false),
        };
        if !sessions_may_outlive || !released {
            close_at_grace(shutdown, self.grace_period).await;
            return;
        }
        self.admin.abort();
        if let Some(predecessor) = self.predecessor.take() {
            predecessor.end_its_drain().await;
        }
        let until = stopped + timeout;
        info!(
            open = shutdown.open(),
            session_drain_timeout = ?timeout,
            "a successor serves on the handed-over sockets: serving the sessions still open \
             (exec, attach, port-forward, followed logs) until each ends, at most \
             --session-drain-timeout after the stop; a second SIGTERM or SIGQUIT closes them now"
        );
        notify_systemd(&format!(
            "Draining {} sessions after a handover (at most {timeout:?})",
            shutdown.open()
        ));
        let gauge = self.metrics.draining();
        let mut next_report = Instant::now() + REPORT_EVERY;
        loop {
            let open = shutdown.open();
            gauge.set(i64::try_from(open).unwrap_or(i64::MAX));
            let now = Instant::now();
            if now >= until {
                warn!(
                    open,
                    session_drain_timeout = ?timeout,
                    "--session-drain-timeout is over: closing the sessions still open"
                );
                break;
            }
            if now >= next_report {
                next_report = now + REPORT_EVERY;
                info!(
                    open,
                    left = ?until - now,
                    "draining after a handover: sessions still open; a second SIGTERM or SIGQUIT \
                     closes them now"
                );
            }
            let all_ended = shutdown.wait(GAUGE_EVERY.min(until - now)).await;
            // Ended at once first: what it cut would otherwise look like sessions that ended.
            if shutdown.closing().is_cancelled() {
                info!(
                    open = shutdown.open(),
                    "closing the sessions still open now (a second stop signal, SIGQUIT, or the \
                     successor draining in turn)"
                );
                break;
            }
            if all_ended {
                info!("every session has ended; this process stops");
                break;
            }
        }
        shutdown.close().await;
        gauge.set(0);
    }
}

/// Closes what is still open at the end of the grace period, saying so.
async fn close_at_grace(shutdown: &Shutdown, grace_period: Duration) {
    warn!(
        grace_period = ?grace_period,
        open = shutdown.open(),
        "requests or streams were still open after the shutdown grace period; closed them"
    );
    notify_systemd("Grace period over: closed the requests and streams still open");
    shutdown.close().await;
}

fn notify_systemd(status: &str) {
    if let Err(e) = crate::server::systemd::notify_status(status) {
        debug!(error = %e, "cannot tell systemd the drain's status");
    }
}

/// Labels the pod [`DRAINING_LABEL`], retrying with the API server client's backoff until
/// `deadline`; whether it took.
async fn release_pod(release: PodRelease, deadline: Instant) -> bool {
    let PodRelease {
        client,
        namespace,
        name,
    } = release;
    let mut attempt = 0;
    loop {
        let error = match client
            .label_pod(&namespace, &name, DRAINING_LABEL, "true")
            .await
        {
            Ok(()) => {
                info!(
                    pod = %format_args!("{namespace}/{name}"),
                    "labelled this pod {DRAINING_LABEL}=true: its DaemonSet lets go of it and the \
                     rollout goes on while its sessions drain"
                );
                return true;
            }
            Err(e) => e,
        };
        attempt += 1;
        let wait =
            crate::apiserver::retry_delay(attempt, crate::apiserver::cache::random_fraction());
        if Instant::now() + wait >= deadline {
            warn!(
                pod = %format_args!("{namespace}/{name}"),
                attempts = attempt,
                error = %error,
                "--drain-release-pod: cannot label this pod {DRAINING_LABEL}=true; closing its \
                 sessions with the grace period so the DaemonSet's rollout is not held. {}",
                release_hint(&error)
            );
            return false;
        }
        debug!(error = %error, attempt, "--drain-release-pod: labelling the pod failed; retrying");
        tokio::time::sleep(wait).await;
    }
}

/// What to check when the label was refused.
fn release_hint(error: &ApiCallError) -> &'static str {
    match error {
        ApiCallError::Status { code: 403, .. } => {
            "The API server refused it: the proxy's identity (its service account, or the user of \
             --kubeconfig) needs get and patch on pods in the pod's namespace, and the shipped \
             ValidatingAdmissionPolicy lets it set that label on its own pod only (check the pod \
             name in --drain-release-pod)"
        }
        ApiCallError::Status { code: 404, .. } => {
            "No such pod: --drain-release-pod must name this proxy's own pod \
             ($(POD_NAMESPACE)/$(POD_NAME) from the downward API)"
        }
        _ => "Check that the API server is reachable from the node",
    }
}
