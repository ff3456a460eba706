//! Forwarding authorized requests to the kubelet: one pooled HTTP/1.1 client over TCP, TLS or a
//! unix socket, header hygiene on both directions, streamed bodies, and spliced upgrades for
//! exec/attach/portForward. It never decides who may do what; that happened before.

mod batching;
pub mod cause;
mod coalesce;
mod connector;
mod drained;
mod error;
mod forwarder;
pub mod headers;
mod limits;
pub mod metrics;
mod upgrade;

use std::path::PathBuf;
use std::time::Duration;

pub use connector::UpstreamTlsConfig;
pub use error::{ForwardError, ProxyError};
pub use forwarder::{Forwarder, UpstreamEndpoint};
pub use limits::{Busy, Lease, Leased};
pub use upgrade::UpgradedStream;

/// The kubelet's response body as the caller receives it: its chunks gathered into frames as
/// large as what is readable ([`coalesce`]), holding the request's places until it ends.
pub type UpstreamBody = Leased<coalesce::Coalesced<hyper::body::Incoming>>;

/// Where the kubelet listens (`--upstream`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTarget {
    /// `https://host[:port]` (port 443 when omitted): TLS verified with the configured roots.
    Https {
        /// Host and optional port; also sent as `Host`.
        authority: http::uri::Authority,
    },
    /// `http://host[:port]` (port 80 when omitted), e.g. the read-only port 10255.
    Http {
        /// Host and optional port; also sent as `Host`.
        authority: http::uri::Authority,
    },
    /// `unix:///path`: plain HTTP over a unix socket, sent with `Host: localhost`.
    Unix {
        /// The socket's path.
        path: PathBuf,
    },
}

/// Forwarding behaviour that is configuration, not per request.
#[derive(Debug, Clone)]
pub struct ForwardOptions {
    /// Set `X-Remote-User`/`-Uid`/`-Group`/`-Extra-*` from the authenticated user
    /// (`--forward-identity-headers`). Caller-supplied ones are removed either way.
    pub forward_identity_headers: bool,
    /// Upper bound on opening one upstream connection: name resolution, TCP connect and TLS
    /// handshake together.
    pub connect_timeout: Duration,
    /// An upgraded session that passes no data either way for this long is closed
    /// (`--streaming-connection-idle-timeout`).
    pub streaming_idle_timeout: Duration,
    /// Requests in flight to the kubelet at once (`--upstream-max-requests-inflight`).
    pub max_requests_inflight: usize,
    /// Of those, at most this many for one user (`--upstream-max-requests-inflight-per-user`).
    pub max_requests_inflight_per_user: usize,
    /// Counts the requests in flight to the kubelet.
    pub requests_in_flight: prometheus_client::metrics::gauge::Gauge,
    /// Upgraded sessions run as tasks it drains, and close when its grace period is over.
    pub shutdown: crate::base::shutdown::Shutdown,
}

impl Default for ForwardOptions {
    /// No identity headers; a 5 s connect timeout, long for a kubelet on the same node, short
    /// enough that a dead one turns into a prompt 502; the flags' defaults for the rest, and a
    /// gauge and a shutdown of its own.
    fn default() -> Self {
        ForwardOptions {
            forward_identity_headers: false,
            connect_timeout: Duration::from_secs(5),
            streaming_idle_timeout: Duration::from_secs(4 * 60 * 60),
            max_requests_inflight: 1024,
            max_requests_inflight_per_user: 512,
            requests_in_flight: prometheus_client::metrics::gauge::Gauge::default(),
            shutdown: crate::base::shutdown::Shutdown::new(),
        }
    }
}
