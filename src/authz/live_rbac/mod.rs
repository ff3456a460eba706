//! The `RBAC` authorizer: the cluster's own ClusterRoles and ClusterRoleBindings (and, with
//! `--pod-scoped-authz`, Roles and RoleBindings), watched from the API server and decided on the
//! node with the `Policy` authorizer's evaluator, as kube-apiserver's RBAC authorizer decides from
//! the objects it watches. No review per request, fresh within the time an event takes to arrive,
//! and through an API server outage for at most `--rbac-max-staleness`.
//!
//! - [`objects`]: what is kept of each object (rules that can grant what the proxy asks about);
//! - [`kinds`]: the four kinds; [`store`]: what the watches hold;
//! - [`watch`]: one kind's list and watch, its back-off and jitter;
//! - [`health`]: whether the held state may decide (synced, not stale);
//! - [`metrics`]: what operators see.
//!
//! Like RBAC it never denies: no rule allowing is no opinion, and the next authorizer is asked.

mod health;
mod kinds;
pub mod metrics;
mod objects;
mod store;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use k8s_openapi::api::rbac::v1 as rbac;
use tokio::sync::{Mutex, MutexGuard, Notify};
use tokio_util::sync::CancellationToken;

use super::policy::{ObjectKey, PolicyAuthorizer};
use super::{Attributes, Decision, Reason};
use crate::apiserver::ApiServerSettings;
use crate::base::reports::Reports;
use health::Health;
pub use health::State;
pub use kinds::WatchKind;
use kinds::Watched;
use metrics::RbacMetrics;
pub use objects::{Scope, binding as hold_binding};
use store::Store;
use watch::{Failure, WatchSettings};

/// The reason when no watched binding allows a node-level set.
const NO_BINDING_ALLOWS: Reason =
    Reason::Static("RBAC: no ClusterRoleBinding of the cluster allows the request");
/// The reason when no watched binding allows a pod-level set.
const NO_BINDING_ALLOWS_IN_NAMESPACE: Reason =
    Reason::Static("RBAC: no ClusterRoleBinding or RoleBinding of the cluster allows the request");
/// The reason before every watched kind has been listed once.
const NOT_SYNCED: Reason =
    Reason::Static("RBAC: no opinion: roles and bindings not listed from the API server yet");
/// The reason once a watch has been broken longer than `--rbac-max-staleness`.
const EXPIRED: Reason = Reason::Static(
    "RBAC: no opinion: a watch of the API server has been broken for longer than --rbac-max-staleness",
);
/// Changes arriving within this of each other are built into one policy: a burst of events (a
/// Helm release of many bindings) costs one rebuild, and a single change still decides within a
/// fraction of a second.
const REBUILD_COALESCE: Duration = Duration::from_millis(20);

/// The default of `--rbac-max-staleness`.
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(10 * 60);
/// The default of `--rbac-start-jitter`.
pub const DEFAULT_START_JITTER: Duration = Duration::from_secs(5);
/// How long `/readyz` waits for the first complete sync before reporting ready anyway (the mode
/// has no opinion meanwhile; later authorizers decide).
pub const READY_WAIT: Duration = Duration::from_secs(30);

/// What `/readyz` answers while [`RbacAuthorizer::holds_readiness`].
pub fn not_ready_reason() -> String {
    format!(
        "waiting for the RBAC authorizer's first list of roles and bindings (at most {}s)",
        READY_WAIT.as_secs()
    )
}

/// How the `RBAC` authorizer is set up.
#[derive(Clone)]
pub struct RbacSettings {
    /// Where to list and watch (`--kubeconfig`, or in-cluster), reads unbounded.
    pub apiserver: ApiServerSettings,
    /// Which resources are asked about, so which rules are kept and which kinds watched.
    pub scope: Scope,
    /// `--rbac-max-staleness`.
    pub max_staleness: Duration,
    /// `--rbac-start-jitter`.
    pub start_jitter: Duration,
}

/// The state the watch tasks, the rebuild task and requests share.
struct Shared {
    scope: Scope,
    health: Health,
    metrics: RbacMetrics,
    /// What the watches hold; only the watch tasks and the rebuild take this lock (an async
    /// one: a watch task waiting for a rebuild to finish parks, it does not block its thread).
    store: Mutex<Held>,
    /// Wakes the rebuild task.
    changed: Notify,
    /// The policy in force, and when it was built.
    policy: ArcSwap<Snapshot>,
    /// Failures already said this minute, by kind and status.
    reports: Reports<(WatchKind, u16)>,
}

/// The store, and which kinds it holds completely.
#[derive(Default)]
struct Held {
    store: Store,
    complete: [bool; 4],
}

/// A policy built from the watched objects.
struct Snapshot {
    policy: PolicyAuthorizer,
    built: Instant,
}

impl Shared {
    async fn held(&self) -> MutexGuard<'_, Held> {
        self.store.lock().await
    }

    fn contact(&self, kind: WatchKind) {
        self.health.contact(kind);
        self.metrics.contact(kind);
        self.metrics
            .set_synced(kind, self.health.kind_healthy(kind));
    }

    /// A list or watch of `kind` failed: the staleness clock runs, and the log says why, once a
    /// minute per kind and status.
    fn failed(&self, kind: WatchKind, failure: &Failure, silent: bool) {
        self.health.broken(kind, silent);
        self.metrics.failed(kind);
        self.metrics.set_synced(kind, false);
        if self.reports.admit((kind, failure.code)) {
            tracing::warn!(
                kind = kind.resource(),
                cause = %failure.cause,
                hint = failure.hint(),
                retry_after = ?failure.retry_after,
                "RBAC authorizer: cannot list or watch; deciding from the last state for at most --rbac-max-staleness (said once a minute)"
            );
        }
    }

    /// A complete list of `K` replaces what was held of it.
    async fn replace<K: Watched>(&self, objects: BTreeMap<ObjectKey, K::Held>) {
        let count = objects.len();
        {
            let mut held = self.held().await;
            *K::slot(&mut held.store) = objects;
            held.complete[K::KIND.index()] = true;
        }
        self.metrics.set_objects(K::KIND, count);
        self.changed.notify_one();
    }

    /// One object of `K` changed: kept as `object`, or dropped (deleted, or nothing left worth
    /// keeping).
    async fn apply<K: Watched>(&self, key: ObjectKey, object: Option<K::Held>) {
        self.contact(K::KIND);
        let count = {
            let mut held = self.held().await;
            let slot = K::slot(&mut held.store);
            match object {
                Some(object) => {
                    slot.insert(key, object);
                }
                None => {
                    slot.remove(&key);
                }
            }
            slot.len()
        };
        self.metrics.set_objects(K::KIND, count);
        self.changed.notify_one();
    }

    /// Rebuilds the policy whenever the store changed, at most once per [`REBUILD_COALESCE`],
    /// and never busier than half of one core: after a build that took `d`, the next waits at
    /// least `d` (a large cluster's build takes about 0.1 s: docs/BENCHMARKS.md), so a stream of
    /// changes costs bounded CPU on every node. A kind counts as synced once a policy including
    /// its complete list is in force.
    async fn rebuild(self: Arc<Self>) {
        let mut last_build = Duration::ZERO;
        loop {
            self.changed.notified().await;
            tokio::time::sleep(REBUILD_COALESCE.max(last_build)).await;
            let shared = Arc::clone(&self);
            let started = Instant::now();
            let built = tokio::task::spawn_blocking(move || {
                let held = shared.store.blocking_lock();
                (held.store.build(), held.complete)
            })
            .await;
            last_build = started.elapsed();
            let (policy, complete) = match built {
                Ok(built) => built,
                Err(e) => {
                    tracing::error!(error = %e, "RBAC authorizer: rebuilding the policy failed");
                    continue;
                }
            };
            match policy {
                Ok(policy) => {
                    self.policy.store(Arc::new(Snapshot {
                        policy,
                        built: Instant::now(),
                    }));
                    self.metrics.built();
                }
                Err(e) => {
                    tracing::error!(error = %e, "RBAC authorizer: the watched objects make no policy; keeping the previous one");
                    continue;
                }
            }
            for kind in WatchKind::ALL {
                if complete[kind.index()] {
                    self.health.synced(kind);
                    self.metrics
                        .set_synced(kind, self.health.kind_healthy(kind));
                }
            }
        }
    }
}

/// Decides from the cluster's RBAC objects, watched. Cheap to share: requests read an atomic and
/// the policy in force.
pub struct RbacAuthorizer {
    shared: Arc<Shared>,
    /// Stops the watch and rebuild tasks when the authorizer is dropped.
    _stop: tokio_util::sync::DropGuard,
}

/// What `explain` and `/readyz` say about the watched state.
#[derive(Debug, Clone)]
pub struct RbacStatus {
    /// Where it stands.
    pub state: State,
    /// How long ago the policy in force was built; `None` before the first build.
    pub policy_age: Option<Duration>,
    /// Per watched kind: how long ago the API server last answered about it, `None` if never.
    pub contact: Vec<(WatchKind, Option<Duration>)>,
}

impl RbacAuthorizer {
    /// Starts watching (on the current Tokio runtime) and returns at once: until every kind is
    /// listed, the authorizer has no opinion. The tasks end when the authorizer is dropped or
    /// `stop` is cancelled.
    pub fn start(settings: RbacSettings, metrics: RbacMetrics, stop: CancellationToken) -> Self {
        let watched = WatchKind::watched(settings.scope);
        let empty = PolicyAuthorizer::from_watched([], []);
        let shared = Arc::new(Shared {
            scope: settings.scope,
            health: Health::new(watched, settings.max_staleness),
            metrics,
            store: Mutex::new(Held::default()),
            changed: Notify::new(),
            reports: Reports::default(),
            policy: ArcSwap::from_pointee(Snapshot {
                // Nothing to resolve in an empty store: building it cannot fail.
                policy: empty.unwrap_or_else(|_| unreachable!("an empty policy always builds")),
                built: Instant::now(),
            }),
        });
        for &kind in watched {
            shared.metrics.set_synced(kind, false);
        }
        let stop = stop.child_token();
        let watch = WatchSettings {
            apiserver: settings.apiserver,
            start_jitter: settings.start_jitter,
        };
        spawn_until(&stop, Arc::clone(&shared).rebuild());
        for &kind in watched {
            let shared = Arc::clone(&shared);
            let watch = watch.clone();
            match kind {
                WatchKind::ClusterRoles => {
                    spawn_until(&stop, watch::run::<rbac::ClusterRole>(shared, watch));
                }
                WatchKind::ClusterRoleBindings => {
                    spawn_until(&stop, watch::run::<rbac::ClusterRoleBinding>(shared, watch));
                }
                WatchKind::Roles => spawn_until(&stop, watch::run::<rbac::Role>(shared, watch)),
                WatchKind::RoleBindings => {
                    spawn_until(&stop, watch::run::<rbac::RoleBinding>(shared, watch));
                }
            }
        }
        RbacAuthorizer {
            shared,
            _stop: stop.drop_guard(),
        }
    }

    /// Decides one attribute set: `Allow` with RBAC's own reason (naming the binding, its role
    /// and the subject), else `NoOpinion`, also whenever the watched state may not decide (not
    /// synced yet, or stale beyond the bound). Never `Deny`.
    pub fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        if !self.shared.health.usable() {
            return Decision::NoOpinion(if self.shared.health.all_synced() {
                EXPIRED
            } else {
                NOT_SYNCED
            });
        }
        match self.shared.policy.load().policy.authorize(attrs) {
            allow @ Decision::Allow(_) => allow,
            _ if attrs.namespace.is_empty() => Decision::NoOpinion(NO_BINDING_ALLOWS),
            _ => Decision::NoOpinion(NO_BINDING_ALLOWS_IN_NAMESPACE),
        }
    }

    /// Where the watched state stands, for `explain` and `/readyz`.
    pub fn status(&self) -> RbacStatus {
        let health = &self.shared.health;
        let built = self.shared.policy.load().built;
        RbacStatus {
            state: health.state(),
            policy_age: health.all_synced().then(|| built.elapsed()),
            contact: WatchKind::watched(self.shared.scope)
                .iter()
                .map(|&kind| (kind, health.since_contact(kind)))
                .collect(),
        }
    }

    /// Whether `/readyz` should wait for this authorizer: not every kind listed yet, and
    /// started less than [`READY_WAIT`] ago.
    pub fn holds_readiness(&self) -> bool {
        !self.shared.health.all_synced() && self.shared.health.age() < READY_WAIT
    }

    /// Waits until every kind is synced, at most `timeout`; whether they are.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.shared.health.usable() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

/// Runs `task` until `stop` is cancelled.
fn spawn_until(stop: &CancellationToken, task: impl Future<Output = ()> + Send + 'static) {
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = task => {}
        }
    });
}

#[cfg(test)]
mod tests;
