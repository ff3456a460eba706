//! The `RBAC` authorizer's metrics: per watched kind, whether it is synced, when the API server
//! last said something about it, how many objects are held, how many lists and failures there
//! were; and when the policy in force was built. Registered with the proxy's others whether or
//! not the mode is configured: families stay empty without it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::kinds::WatchKind;
use crate::base::metrics::register;

/// Labels of the per-kind families.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `clusterroles`, `clusterrolebindings`, `roles` or `rolebindings`.
    pub kind: &'static str,
}

/// Labels of the list counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListLabels {
    /// As [`KindLabels::kind`].
    pub kind: &'static str,
    /// `start` (the first list), `gone` (the API server no longer had the version a watch
    /// asked from: `410 Gone`), or `failed` (a list failed part way and started over).
    pub reason: &'static str,
}

/// The `RBAC` authorizer's metric families.
#[derive(Debug, Clone, Default)]
pub struct RbacMetrics {
    synced: Family<KindLabels, Gauge>,
    last_contact: Family<KindLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    objects: Family<KindLabels, Gauge>,
    lists: Family<ListLabels, Counter>,
    watches: Family<KindLabels, Counter>,
    failures: Family<KindLabels, Counter>,
    snapshot_built: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl RbacMetrics {
    /// Registers the families.
    pub fn register(registry: &mut Registry) -> RbacMetrics {
        let metrics = RbacMetrics::default();
        register! { registry, metrics;
            synced => "rbac_synced", "1 when the RBAC authorizer holds a complete, current copy of the kind (listed, and its watch healthy), else 0";
            last_contact => "rbac_last_contact_timestamp_seconds", "When the API server last answered about the kind (a list, a watch started, an event or a bookmark), in seconds since the Unix epoch: time() minus this is the age of the last event";
            objects => "rbac_objects", "Objects of the kind the RBAC authorizer holds (roles only when a rule can grant a kubelet attribute, or for aggregation)";
            lists => "rbac_lists", "Complete lists of the kind from the API server, by reason: start, gone (410: relisted), failed";
            watches => "rbac_watches", "Watches of the kind started (each resumes from the last resource version or bookmark)";
            failures => "rbac_watch_failures", "Failed lists and watches of the kind (each followed by a jittered back-off)";
            snapshot_built => "rbac_policy_built_timestamp_seconds", "When the RBAC authorizer last rebuilt its policy from the watched objects, in seconds since the Unix epoch";
        }
        metrics
    }

    pub(super) fn set_synced(&self, kind: WatchKind, synced: bool) {
        self.synced
            .get_or_create(&labels(kind))
            .set(i64::from(synced));
    }

    pub(super) fn contact(&self, kind: WatchKind) {
        self.last_contact
            .get_or_create(&labels(kind))
            .set(unix_now());
    }

    pub(super) fn set_objects(&self, kind: WatchKind, count: usize) {
        self.objects
            .get_or_create(&labels(kind))
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub(super) fn listed(&self, kind: WatchKind, reason: &'static str) {
        self.lists
            .get_or_create(&ListLabels {
                kind: kind.resource(),
                reason,
            })
            .inc();
    }

    pub(super) fn watch_started(&self, kind: WatchKind) {
        self.watches.get_or_create(&labels(kind)).inc();
    }

    pub(super) fn failed(&self, kind: WatchKind) {
        self.failures.get_or_create(&labels(kind)).inc();
    }

    pub(super) fn built(&self) {
        self.snapshot_built.set(unix_now());
    }
}

fn labels(kind: WatchKind) -> KindLabels {
    KindLabels {
        kind: kind.resource(),
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}
