//! Which generation of the proxy serves: the build (version and commit), when this process
//! started, and its upgrades in place ([`crate::server::handover`]). During a surge rollout or a
//! handover two processes serve one node; these say which one a scrape reached, and whether an
//! upgrade took.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::base::metrics::register;

/// The release and commit this binary was built from (set by `build.rs`).
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("KUBELET_AUTH_PROXY_COMMIT");

/// Labels of the build information.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// Every cause of a failed handover: [`crate::server::handover::HandoverError::cause`], the
/// handover socket's (`protocol`, and `stranger` for an asker of another user). Their series
/// exist at 0 from the start, so an alert's `increase()` sees the first failure.
const HANDOVER_FAILURE_CAUSES: [&str; 6] =
    ["spawn", "exited", "timeout", "protocol", "stranger", "io"];

/// Labels of a failed handover.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandoverFailureLabels {
    /// `spawn`, `exited`, `timeout`, `protocol`, `stranger` or `io`: the causes the handover code
    /// gives, each created at 0 (`HANDOVER_FAILURE_CAUSES`).
    pub cause: &'static str,
}

/// Every cause of `--handover-socket` being off
/// ([`crate::server::handover_socket::Unusable::cause`]), each series created at 0.
const HANDOVER_SOCKET_OFF_CAUSES: [&str; 3] = ["directory", "taken", "io"];

/// Labels of the handover socket being off.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverSocketOffLabels {
    /// `directory`, `taken` or `io` (`HANDOVER_SOCKET_OFF_CAUSES`).
    cause: &'static str,
}

/// The generation metrics, registered with the proxy's others.
#[derive(Debug, Clone)]
pub struct Generation {
    handovers: Counter,
    handover_failures: Family<HandoverFailureLabels, Counter>,
    handover_socket_off: Family<HandoverSocketOffLabels, Gauge>,
}

impl Generation {
    /// Registers the build information, the start time (now) and the handover counters.
    pub fn register(registry: &mut Registry) -> Generation {
        registry.register(
            "build",
            "The build serving: version and commit",
            Info::new(BuildLabels {
                version: VERSION,
                commit: COMMIT,
            }),
        );
        let started: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
        started.set(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64()),
        );
        registry.register(
            "process_start_time_seconds",
            "When this process started, in seconds since the Unix epoch",
            started,
        );
        let generation = Generation {
            handovers: Counter::default(),
            handover_failures: Family::default(),
            handover_socket_off: Family::default(),
        };
        register! { registry, generation;
            handovers => "handovers", "Upgrades in place (SIGUSR2) this process completed: a new process took the sockets and serves";
            handover_failures => "handover_failures", "Upgrades in place (SIGUSR2) that failed, by cause; this process went on serving";
            handover_socket_off => "handover_socket_off", "1 while --handover-socket is set but off, by cause (directory: not the proxy's alone; taken: something else than the proxy's socket at the path or beside it; io): this process serves but neither takes sockets nor hands them over there; the log says why";
        }
        for cause in HANDOVER_SOCKET_OFF_CAUSES {
            drop(
                generation
                    .handover_socket_off
                    .get_or_create(&HandoverSocketOffLabels { cause }),
            );
        }
        for cause in HANDOVER_FAILURE_CAUSES {
            drop(
                generation
                    .handover_failures
                    .get_or_create(&HandoverFailureLabels { cause }),
            );
        }
        generation
    }

    /// Counts a completed handover.
    pub fn handed_over(&self) {
        self.handovers.inc();
    }

    /// Says that `--handover-socket` is off for `cause` (and for no other).
    pub fn handover_socket_off(&self, cause: &'static str) {
        for each in HANDOVER_SOCKET_OFF_CAUSES {
            self.handover_socket_off
                .get_or_create(&HandoverSocketOffLabels { cause: each })
                .set(i64::from(each == cause));
        }
    }

    /// Says that `--handover-socket` is this process's again.
    pub fn handover_socket_on(&self) {
        self.handover_socket_off("");
    }

    /// Counts a failed handover.
    pub fn handover_failed(&self, cause: &'static str) {
        self.handover_failures
            .get_or_create(&HandoverFailureLabels { cause })
            .inc();
    }
}
