//! The process and its sockets: listeners bound or inherited, accept loops handing connections to
//! the serving threads, each connection's handshake and deadlines, and ending or replacing the
//! process (shutdown, handover, systemd). What happens to each request is [`crate::request`]'s.

mod accept;
mod connection;
pub mod deadlines;
pub mod descriptors;
pub mod drain;
pub mod generation;
pub mod handover;
pub mod handover_socket;
pub mod http_server;
pub mod listen_fds;
mod listeners;
pub mod metrics;
mod port_holder;
mod services;
pub mod serving_threads;
mod standby;
pub mod systemd;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::admin;
use crate::audit::AuditLog;
use crate::base::reload::FileWatcher;
use crate::base::shutdown::Shutdown;
use crate::request::pipeline::{Lane, Pipeline};
use connection::Accepted;
use deadlines::Deadlines;
use handover::HandoverSockets;
use handover_socket::{Donor, Fetched};
use http_server::HttpServer;
use listen_fds::{Inherited, Role};
use listeners::{ADMIN_BIND_RETRY, ADMIN_FLAG, bind, bind_hint};
pub use services::{ServedMetrics, Services};
use serving_threads::ServingThreads;
use standby::Standby;

/// A running proxy: its addresses, and the means to stop it.
pub struct RunningProxy {
    addr: SocketAddr,
    addrs: Vec<SocketAddr>,
    admin_addr: SocketAddr,
    /// Beginning it turns readiness false; the main loop stops accepting and drains its
    /// connections and sessions.
    shutdown: Shutdown,
    server: JoinHandle<()>,
    admin: JoinHandle<()>,
    /// The admin endpoints on `--admin-socket`, stopped with the admin listener.
    admin_unix: Option<admin::listener::AdminSocket>,
    /// Flushed once the connections have drained.
    audit: Option<AuditLog>,
    /// The proxy this one took over from, told to end its drain when this one drains in turn.
    predecessor: drain::PredecessorSlot,
    /// Copies of the listening sockets, for a successor on `SIGUSR2`; closed when draining
    /// begins, so that the listeners really close once the accept loops let go of them.
    handover: HandoverSockets,
    /// Answers `--handover-socket` with copies of the same, until draining begins.
    donor: Option<Donor>,
}

impl RunningProxy {
    /// The address the kubelet API is served on (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every address the kubelet API is served on, in `--listen-address` order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The address of /healthz, /readyz and /metrics.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Records that a successor serves on this process's sockets (an upgrade in place by
    /// `SIGUSR2`): what is still open when it stops may be served on past the grace period
    /// ([`drain`]).
    pub fn succeeded(&self) {
        self.shutdown.succeeded();
    }

    /// Records the process that handed its sockets over to this one by `SIGUSR2`, to be told to
    /// end its drain when this one drains in turn ([`drain`]).
    pub fn took_over_from(&self, parent: handover::Parent) {
        self.predecessor.put(drain::Predecessor::Parent(parent));
    }

    /// The shutdown this proxy runs under, to end its drain at once
    /// ([`Shutdown::end_now`]) while [`RunningProxy::shutdown`] runs.
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// The listening sockets, to hand to a successor ([`crate::server::handover`]).
    pub fn handover_sockets(&self) -> &HandoverSockets {
        &self.handover
    }

    /// Binds `--admin-socket` and `--handover-socket` anew, after a new process that took the
    /// paths over failed: they then name sockets nobody answers, and this process goes on
    /// serving.
    pub fn reclaim_sockets(&mut self) {
        if let Some(socket) = &mut self.admin_unix
            && let Err(e) = socket.rebind()
        {
            warn!(path = %socket.path().display(), error = %e, "cannot bind --admin-socket again");
        }
        if let Some(donor) = &self.donor {
            donor.reclaim();
        }
    }

    /// Turns readiness off, stops accepting, lets in-flight requests finish within the grace
    /// period and sessions after a handover within theirs ([`drain`]), flushes the audit log,
    /// then stops the admin listener and returns.
    pub async fn shutdown(self) {
        drop(self.handover);
        self.shutdown.begin();
        let _ = self.server.await;
        if let Some(audit) = self.audit {
            audit.close().await;
        }
        self.admin.abort();
        let _ = self.admin.await;
        if let Some(admin_unix) = self.admin_unix {
            admin_unix.stop().await;
        }
        if let Some(donor) = self.donor {
            donor.stop().await;
        }
    }
}

/// Why the proxy could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address could not be bound: another process holds it past the retry window, it
    /// is not an address of this host, or binding it needs a privilege the proxy lacks.
    #[error("{flag} {addr}: cannot listen: {source}{}", bind_hint(source))]
    Bind {
        /// `--listen-address` or `--admin-listen-address`.
        flag: &'static str,
        /// The address.
        addr: SocketAddr,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The `--admin-socket` could not be bound.
    #[error(
        "--admin-socket {}: cannot listen: {source}; the directory must exist and be writable by the proxy, and the path free or a socket",
        path.display()
    )]
    AdminSocket {
        /// The path.
        path: std::path::PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// Another failure of the operating system at start.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Binds both listeners and starts serving.
pub async fn start(config: Services) -> Result<RunningProxy, StartError> {
    // The budget of Settings::load counts on the hard limit; make it the one in force.
    match crate::server::descriptors::raise_soft_limit() {
        Ok(limit) => debug!(limit, "open-file limit"),
        Err(e) => warn!(error = %e, "cannot raise the open-file limit to its hard limit"),
    }
    let ServedMetrics {
        registry,
        server: metrics,
        requests: request_metrics,
        reloads: reload_metrics,
    } = config.metrics;
    let registry = Arc::new(registry);
    let generation = metrics.generation().clone();
    let shutdown = config.shutdown.clone();
    let readiness = admin::listener::Readiness {
        listening: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        waiting: Arc::default(),
        draining: shutdown.draining().clone(),
        hold: config
            .decider
            .authorizers
            .rbac()
            .map(|rbac| admin::listener::Hold {
                reason: crate::authz::live_rbac::not_ready_reason().into(),
                holds: Arc::new(move || rbac.holds_readiness()),
            }),
    };
    // This process's own admin socket before any address: the exec probes reach it while the
    // addresses are still held (by the kubelet, or a previous version this one stands by for).
    let admin_unix = match &config.admin_socket {
        Some(path) => {
            let socket = admin::listener::AdminSocket::serve(
                path.clone(),
                Arc::clone(&registry),
                readiness.clone(),
            )
            .map_err(|source| StartError::AdminSocket {
                path: path.clone(),
                source,
            })?;
            info!(path = %path.display(), "admin endpoints on this process's own socket too");
            Some(socket)
        }
        None => None,
    };
    // The one gate before this process asks or answers on --handover-socket: past it, the
    // handover cannot stop the start.
    let handover_socket = config.handover_socket.as_deref().filter(|path| {
        handover_socket::check(path)
            .map_err(|e| handover_socket_off(&generation, e.cause(), &e))
            .is_ok()
    });
    let (mut inherited, mut fetched) = sockets_given(handover_socket).await;
    let mut standby = Standby::new(
        config.handover_socket.is_some() && inherited.is_empty(),
        config.listen_addresses.clone(),
        Arc::clone(&readiness.waiting),
        Arc::clone(&metrics),
    );
    // The admin listener next: while the kubelet API's address is still held (by the kubelet,
    // during a rollout), /healthz says the process is alive and /readyz that it does not serve
    // yet, so a liveness or startup probe does not restart a proxy that is only waiting.
    let admin_listener = bind(
        ADMIN_FLAG,
        config.admin_listen_address,
        ADMIN_BIND_RETRY,
        &mut inherited,
        &mut standby,
    )
    .await?;
    let admin_addr = admin_listener.local_addr()?;
    let mut handover = HandoverSockets::default();
    handover.add(Role::Admin, &admin_listener)?;
    info!(%admin_addr, "admin listener serving /healthz, /readyz and /metrics");
    let admin = tokio::spawn(admin::listener::serve(
        admin_listener,
        registry,
        readiness.clone(),
    ));
    let predecessor = drain::PredecessorSlot::default();
    let drain = drain::Drain {
        sessions: config.session_drain,
        grace_period: config.shutdown_grace_period,
        metrics: Arc::clone(&metrics),
        admin: admin.abort_handle(),
        predecessor: predecessor.clone(),
    };
    let mut listeners = Vec::with_capacity(config.listen_addresses.len());
    for &address in &config.listen_addresses {
        listeners.push(
            bind(
                "--listen-address",
                address,
                config.listen_retry_timeout,
                &mut inherited,
                &mut standby,
            )
            .await?,
        );
    }
    standby.done();
    inherited.close_unclaimed();
    for listener in &listeners {
        handover.add(Role::KubeletApi, listener)?;
    }
    let addrs = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<std::io::Result<Vec<_>>>()?;
    let addr = *addrs.first().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no --listen-address")
    })?;

    let limits = Limits {
        max_connections: config.max_connections,
        handshake_timeout: config.header_read_timeout,
        deadlines: Deadlines {
            first_request: config.header_read_timeout,
            idle: config.idle_connection_timeout,
        },
    };
    let http = HttpServer::new(config.header_read_timeout);
    let serving_tls = Arc::clone(&config.server_tls);
    let (reload_targets, certificates) = config.reloads.into_parts();
    let watcher = FileWatcher::new(reload_targets, certificates);
    tokio::spawn(watcher.run(reload_metrics, shutdown.draining().clone()));
    metrics.set_connections_limit(limits.max_connections);
    let pipeline = Arc::new(Pipeline::new(
        config.authenticator,
        config.decider,
        request_metrics,
        config.audit.clone(),
        config.audit_require_for_streams,
    ));
    // Bounds open connections on all listeners and threads together: a permit is held for a
    // connection's whole life, upgraded sessions included; when none is left the loops stop
    // accepting and new clients wait in the kernel's listen queue.
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    let http = Arc::new(http);
    let forwarder = config.forwarder;
    let (threads, dispatcher) = ServingThreads::start(config.serving_threads, |index, handed| {
        let lane = Arc::new(Lane::new(Arc::clone(&pipeline), forwarder.with_own_pool()));
        let accepted = Accepted {
            serving_tls: Arc::clone(&serving_tls),
            http: Arc::clone(&http),
            lane,
            limits,
            shutdown: shutdown.clone(),
            accepted: metrics.accepted_by(index),
            metrics: Arc::clone(&metrics),
        };
        accept::serve_handed(handed, accepted)
    })?;
    readiness
        .listening
        .store(true, std::sync::atomic::Ordering::Release);
    info!(%addr, addrs = ?addrs, %admin_addr, threads = threads.count(), "serving the kubelet API");
    let server = tokio::spawn(accept::serve(
        listeners,
        slots,
        dispatcher,
        threads,
        drain,
        shutdown.clone(),
    ));
    // Serving: now the path is this process's, and the proxy that handed over is told.
    let donor = match handover_socket {
        Some(path) => match Donor::serve(
            path,
            handover.try_clone()?,
            generation.clone(),
            shutdown.clone(),
        ) {
            Ok(donor) => Some(donor),
            Err(e) => {
                handover_socket_off(&generation, e.cause(), &e);
                None
            }
        },
        None => None,
    };
    if let Some(fetched) = fetched.take() {
        info!(
            pid = fetched.pid,
            "serving on the sockets handed over; telling the proxy that handed them"
        );
        predecessor.put(drain::Predecessor::Socket(fetched.serving().await));
    }
    Ok(RunningProxy {
        addr,
        addrs,
        admin_addr,
        shutdown,
        server,
        admin,
        admin_unix,
        audit: config.audit,
        predecessor,
        handover,
        donor,
    })
}

/// Says why `--handover-socket` is off, and counts it by `cause`: this process serves, on
/// addresses it binds itself, but neither asks nor answers there.
fn handover_socket_off(
    generation: &generation::Generation,
    cause: &'static str,
    error: &dyn std::error::Error,
) {
    generation.handover_socket_off(cause);
    warn!(
        error = %error,
        "--handover-socket is off: serving without taking the listening sockets from another \
         proxy or handing them over there"
    );
}

/// The sockets this process is given instead of binding: by systemd or the process that started
/// it (`LISTEN_FDS`), or else, with `--handover-socket`, by the proxy answering there; with the
/// latter's line, to tell it once this process serves.
async fn sockets_given(handover_socket: Option<&std::path::Path>) -> (Inherited, Option<Fetched>) {
    let inherited = Inherited::take().unwrap_or_else(|e| {
        warn!(error = %e, "ignoring the inherited sockets; binding the addresses anew");
        Inherited::default()
    });
    let Some(path) = handover_socket.filter(|_| inherited.is_empty()) else {
        return (inherited, None);
    };
    match handover_socket::fetch(path).await {
        Ok(Some(mut fetched)) => match Inherited::handed_over(fetched.take_sockets()) {
            Ok(handed) => (handed, Some(fetched)),
            Err(e) => {
                warn!(error = %e, "--handover-socket: ignoring the sockets handed over; binding the addresses");
                (Inherited::default(), None)
            }
        },
        Ok(None) => {
            info!(path = %path.display(), "nobody hands sockets over at --handover-socket; binding the addresses");
            (Inherited::default(), None)
        }
        Err(e) => {
            warn!(error = %e, "binding the addresses instead");
            (Inherited::default(), None)
        }
    }
}

/// The bounds every connection is served under.
#[derive(Clone, Copy)]
struct Limits {
    max_connections: u32,
    handshake_timeout: std::time::Duration,
    deadlines: Deadlines,
}
