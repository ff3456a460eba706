//! Serving one client connection on its serving thread: the TLS handshake (bounded by
//! `--header-read-timeout`), the identity its certificate proves, then HTTP by the protocol ALPN
//! agreed ([`super::http_server`]) under the connection's deadlines ([`super::deadlines`]), each
//! request going through the pipeline ([`crate::request::pipeline`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use rustls::pki_types::UnixTime;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::Limits;
use super::deadlines::{self, Activity, ConnectionSlot, Deadlines, Ended};
use super::http_server::HttpServer;
use super::metrics::ServerMetrics;
use super::serving_threads::Load;
use crate::base::held_body::Holding;
use crate::base::reload::Reloadable;
use crate::base::shutdown::Shutdown;
use crate::request::pipeline::Lane;

/// What every connection a serving thread is handed is served with.
pub(super) struct Accepted {
    pub(super) serving_tls: Arc<Reloadable<rustls::ServerConfig>>,
    pub(super) http: Arc<HttpServer>,
    pub(super) lane: Arc<Lane>,
    pub(super) limits: Limits,
    pub(super) shutdown: Shutdown,
    pub(super) metrics: Arc<ServerMetrics>,
    /// This thread's count of the connections it was handed.
    pub(super) accepted: prometheus_client::metrics::counter::Counter,
}

impl Accepted {
    /// Serves one connection as one of the shutdown's tasks, holding `permit` for its life.
    /// `load` is the connection's place in this thread's count; it is held as long as the
    /// connection is served.
    pub(super) fn serve(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        permit: tokio::sync::OwnedSemaphorePermit,
        load: Load,
    ) {
        self.accepted.inc();
        let slot = Arc::new(ConnectionSlot::new(
            permit,
            self.metrics.connections().clone(),
        ));
        let lane = Arc::clone(&self.lane);
        // The configuration in force when the connection arrives: a rotated certificate is used
        // by new connections while open ones keep theirs.
        let acceptor = TlsAcceptor::from(self.serving_tls.current_arc());
        let http = Arc::clone(&self.http);
        let limits = Connection {
            handshake_timeout: self.limits.handshake_timeout,
            deadlines: self.limits.deadlines,
            shutdown: self.shutdown.clone(),
            metrics: Arc::clone(&self.metrics),
            _load: load,
        };
        self.shutdown.spawn(serve_connection(
            tcp, peer, acceptor, http, lane, slot, limits,
        ));
    }
}

/// What one connection is served under.
struct Connection {
    handshake_timeout: std::time::Duration,
    deadlines: Deadlines,
    /// Draining closes the connection gracefully; closing drops it.
    shutdown: Shutdown,
    /// Failed handshakes and missed deadlines are counted here.
    metrics: Arc<ServerMetrics>,
    /// The connection's place in its serving thread's count, given back when it ends. Held in
    /// the connection's own future: a wrapping `async` block would hold that future twice (the
    /// captured one and the one awaited), doubling every connection's task (measured: 34.8 →
    /// 43.3 KiB per idle connection).
    _load: Load,
}

/// Serves one client connection: the TLS handshake, then HTTP until the connection ends.
///
/// The task's future is kept small, as every open connection holds one: the handshake runs in its
/// own boxed future (freed once it is done), and the TLS session only lives inside the boxed
/// HTTP connection, not also in this future's frame.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    http: Arc<HttpServer>,
    lane: Arc<Lane>,
    slot: Arc<ConnectionSlot>,
    limits: Connection,
) {
    let pipeline = lane.pipeline();
    let activity = Activity::new();
    let conn = {
        let handshake = Box::pin(handshake(tcp, peer, acceptor, &limits));
        let Some(tls) = handshake.await else {
            return;
        };
        let identity = Arc::new(
            pipeline
                .authenticator()
                .authenticate_connection(tls.get_ref().1.peer_certificates(), UnixTime::now()),
        );
        let service = {
            let activity = activity.clone();
            let lane = Arc::clone(&lane);
            service_fn(move |req| {
                let in_flight = activity.begin();
                let lane = Arc::clone(&lane);
                let identity = Arc::clone(&identity);
                let slot = Arc::clone(&slot);
                // Boxed: hyper keeps a slot the size of the service's future in every connection
                // for its whole life, idle ones included. The pipeline's future (authentication,
                // authorization and forwarding state) takes kilobytes; boxed, the slot is a
                // pointer and that memory is only held while a request is in flight.
                Box::pin(async move {
                    let response = lane.handle(&identity, peer, req, slot).await;
                    Ok::<_, Infallible>(response.map(|body| Holding::new(body, Some(in_flight))))
                })
            })
        };
        http.serve(tls, service)
    };
    let ended = deadlines::drive(
        conn,
        |conn| conn.get_mut().graceful_shutdown(),
        &activity,
        limits.deadlines,
        &limits.shutdown,
    )
    .await;
    match ended {
        Ended::Finished(Ok(())) | Ended::ForceClosed => {}
        Ended::Finished(Err(e)) => debug!(%peer, error = %e, "connection ended with an error"),
        Ended::TimedOut => {
            limits.metrics.connection_timed_out();
            debug!(%peer, "connection closed: no request within its deadline");
        }
    }
}

/// The TLS handshake of a client connection, bounded by --header-read-timeout and cut short by
/// the end of the shutdown grace period; `None` when it failed (counted and logged here).
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    limits: &Connection,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let _ = tcp.set_nodelay(true);
    let accept = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp));
    let handshake = tokio::select! {
        handshake = accept => handshake,
        () = limits.shutdown.closing().cancelled() => return None,
    };
    match handshake {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            limits.metrics.handshake_failed();
            debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            limits.metrics.handshake_failed();
            debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}
