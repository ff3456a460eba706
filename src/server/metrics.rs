//! The server's metrics: client connections open and the cap on them, failed handshakes,
//! connections closed for missing a deadline, connections each serving thread was handed, whom
//! the process stands by for ([`super::standby`]), which generation of the proxy serves
//! ([`super::generation`]), and what a stopped process still serves after a handover
//! ([`super::drain`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::generation::Generation;
use crate::base::metrics::register;

/// Labels of the per-thread counters: the serving thread's index, from 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ThreadLabels {
    /// The serving thread ([`super::serving_threads`]).
    thread: u16,
}

/// Who holds an address this process stands by for: `previous_version` (a proxy from before
/// handovers: ready) or `other_process` (not ready); each series created at 0.
const STANDBY_HOLDERS: [&str; 2] = ["previous_version", "other_process"];

/// Labels of the standby gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StandbyLabels {
    /// One of `STANDBY_HOLDERS`.
    holder: &'static str,
}

/// The server's families.
#[derive(Debug)]
pub struct ServerMetrics {
    connections: Gauge,
    connections_limit: Gauge,
    handshake_failures: Counter,
    connection_timeouts: Counter,
    accepted: Family<ThreadLabels, Counter>,
    standby: Family<StandbyLabels, Gauge>,
    draining: Gauge,
    generation: Generation,
}

impl ServerMetrics {
    /// Registers the families in `registry`; the build information and this process's start
    /// time are set now.
    pub fn register(registry: &mut Registry) -> ServerMetrics {
        let metrics = ServerMetrics {
            connections: Gauge::default(),
            connections_limit: Gauge::default(),
            handshake_failures: Counter::default(),
            connection_timeouts: Counter::default(),
            accepted: Family::default(),
            standby: Family::default(),
            draining: Gauge::default(),
            generation: Generation::register(registry),
        };
        register! { registry, metrics;
            connections => "connections_open", "Client connections currently open, upgraded exec, attach and portForward sessions included";
            connections_limit => "connections_limit", "Most client connections served at once (--max-connections, lowered when the file-descriptor limit asks): connections_open / connections_limit is how near the cap the proxy is";
            handshake_failures => "tls_handshake_failures", "Client TLS handshakes that failed or timed out";
            connection_timeouts => "connection_timeouts", "Client connections closed because no request came within --header-read-timeout after the handshake, or within --idle-connection-timeout after the last one";
            accepted => "serving_thread_connections_accepted", "Client connections accepted, by serving thread (--serving-threads): how evenly the threads share the connections";
            standby => "standby", "1 while this process (with --handover-socket) stands by for an address another process holds, by who holds it: previous_version (a proxy from before handovers; ready, takes each address the instant it is free) or other_process (not a proxy; not ready, the log and /readyz name it)";
            draining => "draining_connections", "Client connections and sessions (exec, attach, portForward, followed logs) a stopped process still serves past --shutdown-grace-period because a successor took its sockets over, up to --session-drain-timeout; 0 while serving. Served on the process's own --admin-socket only (the admin address is its successor's by then)";
        }
        for holder in STANDBY_HOLDERS {
            drop(metrics.standby.get_or_create(&StandbyLabels { holder }));
        }
        metrics
    }

    /// The open-connections gauge: every client connection, upgraded sessions included, counted
    /// by its [`ConnectionSlot`](super::deadlines::ConnectionSlot).
    pub fn connections(&self) -> &Gauge {
        &self.connections
    }

    /// Sets the cap on client connections in force, for alerts on how near it the proxy is.
    pub fn set_connections_limit(&self, limit: u32) {
        self.connections_limit.set(i64::from(limit));
    }

    /// Counts a failed or timed-out TLS handshake.
    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// Counts a connection closed for missing its first-request or idle deadline.
    pub fn connection_timed_out(&self) {
        self.connection_timeouts.inc();
    }

    /// The counter of connections accepted by serving thread `thread`, resolved once by the
    /// thread so that accepting costs one increment.
    pub fn accepted_by(&self, thread: usize) -> Counter {
        let thread = u16::try_from(thread).unwrap_or(u16::MAX);
        self.accepted
            .get_or_create(&ThreadLabels { thread })
            .clone()
    }

    /// Says whom this process stands by for: `previous_version`, `other_process`, or nobody
    /// (`None`: it is not standing by).
    pub(super) fn standing_by(&self, holder: Option<&'static str>) {
        for each in STANDBY_HOLDERS {
            self.standby
                .get_or_create(&StandbyLabels { holder: each })
                .set(i64::from(Some(each) == holder));
        }
    }

    /// The gauge of what a stopped process still serves after a handover.
    pub(super) fn draining(&self) -> &Gauge {
        &self.draining
    }

    /// Build, start time and handovers.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }
}
