//! What the server runs with: the parts [`crate::startup::assemble`] builds from the settings,
//! handed over whole to [`super::start`].

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::metrics::ServerMetrics;
use crate::audit::AuditLog;
use crate::authn::Authenticator;
use crate::base::reload::{ReloadMetrics, ReloadRegistry, Reloadable};
use crate::base::shutdown::Shutdown;
use crate::forward::Forwarder;
use crate::request::decision::Decider;
use crate::request::metrics::RequestMetrics;

/// Everything the server runs with.
pub struct Services {
    /// Where the kubelet API is served.
    pub listen_addresses: Vec<std::net::SocketAddr>,
    /// How long a listen address in use is retried.
    pub listen_retry_timeout: Duration,
    /// Where /healthz, /readyz and /metrics are served.
    pub admin_listen_address: std::net::SocketAddr,
    /// Where this process alone serves the same.
    pub admin_socket: Option<std::path::PathBuf>,
    /// `--handover-socket`: where sockets are handed to and taken from another proxy.
    pub handover_socket: Option<std::path::PathBuf>,
    /// Serving TLS, swapped when its files change.
    pub server_tls: Arc<Reloadable<rustls::ServerConfig>>,
    /// Who is calling.
    pub authenticator: Authenticator,
    /// Path gate, attributes and authorizers.
    pub decider: Decider,
    /// The pooled client to the kubelet.
    pub forwarder: Forwarder,
    /// Handshake and request-header deadline.
    pub header_read_timeout: Duration,
    /// Time a connection may stay open with nothing in flight.
    pub idle_connection_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: u32,
    /// Threads serving client connections, each with its own kubelet connection pool.
    pub serving_threads: usize,
    /// Time given to in-flight requests at shutdown.
    pub shutdown_grace_period: Duration,
    /// What is served on after a handover, and the pod released for it.
    pub session_drain: super::drain::SessionDrain,
    /// The registry every layer registered its metrics in, and the families of the parts the
    /// server builds itself.
    pub metrics: ServedMetrics,
    /// What the file watcher keeps up to date, in dependency order.
    pub reloads: ReloadRegistry,
    /// Where audit events go, if anywhere: open, its writer running.
    pub audit: Option<AuditLog>,
    /// Refuse exec, attach and portForward while their audit event cannot be written.
    pub audit_require_for_streams: bool,
    /// Draining, closing, and the connections and sessions to wait for; shared with the
    /// forwarder, whose upgraded sessions are among them.
    pub shutdown: Shutdown,
}

/// The metrics a running proxy serves, and the families of the parts the server builds itself.
pub struct ServedMetrics {
    /// Every layer's families, served on `/metrics`.
    pub registry: Registry,
    /// Connections, handshakes, deadlines, serving threads and the generation.
    pub server: Arc<ServerMetrics>,
    /// Each request, counted by the pipeline.
    pub requests: Arc<RequestMetrics>,
    /// The file watcher's reloads and the certificates' expiry.
    pub reloads: ReloadMetrics,
}
