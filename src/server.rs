//! Listeners and the request pipeline. A request goes, top to bottom:
//!
//! 1. canonical path: not canonical → 301 to the cleaned path, unusable → 400 (before authentication,
//!    as the kubelet's Go router answers);
//! 2. authenticate: the connection's verified client certificate, else anonymous when allowed → 401;
//! 3. attributes: verb and path → the ordered `nodes/<subresource>` list;
//! 4. authorize: the kubelet's loop over that list → 403;
//! 5. forward: the identical path and query to the kubelet, bodies and upgrades streamed.
//!
//! Every request is counted and timed once its response headers are ready.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, USER_AGENT};

use http::header::{CONTENT_LENGTH, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::{Either, Full};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use rustls::pki_types::UnixTime;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::admin;
use crate::assemble::Services;
use crate::audit::refusals::RefusalSampler;
use crate::audit::{
    AuditEvent, AuditId, AuditLog, Authorization as AuditAuthorization, ObjectRef, Stage,
};
use crate::authn::User;
use crate::authn::{Authenticator, ConnectionIdentity};
use crate::connection::{self, Activity, ConnectionSlot, Deadlines, Ended};
use crate::decision::{Decider, Judgement, Refusal, RequestDecision, Unobserved, Verdict};
use crate::handover::HandoverSockets;
use crate::held_body::Holding;
use crate::http_server::HttpServer;
use crate::listen_fds::{Inherited, Role};
use crate::metrics::{Metrics, Outcome, RequestLabels};
use crate::proxy::{ForwardError, Forwarder, UpgradedStream, cause, headers};
use crate::reload::Reloadable;
use crate::reports::Reports;
use crate::responses::{self, ResponseBody};
use crate::serving_threads::{Dispatcher, Load, ServingThreads};
use crate::shutdown::Shutdown;

/// What every request handler shares, read-only.
struct Pipeline {
    authenticator: Authenticator,
    /// Path gate, attributes and authorizers: what is decided before forwarding.
    decider: Decider,
    metrics: Arc<Metrics>,
    audit: Option<AuditLog>,
    /// Admits the audit events of requests refused before authentication at a bounded rate.
    audit_refusals: RefusalSampler,
    /// Refuse exec, attach and portForward while their audit event cannot be written.
    audit_require_for_streams: bool,
    /// Upstream failures reported at warning level: once per cause per minute.
    upstream_reports: Reports<cause::Cause>,
}

/// One serving thread's part in the pipeline: what every thread shares, and the thread's own pool
/// of kubelet connections ([`crate::serving_threads`]).
struct Lane {
    pipeline: Arc<Pipeline>,
    forwarder: Forwarder,
}

/// The response header that names a request's audit event, as kube-apiserver sets it.
const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

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
    admin_unix: Option<admin::AdminSocket>,
    /// Flushed once the connections have drained.
    audit: Option<AuditLog>,
    /// Copies of the listening sockets, for a successor on `SIGUSR2`; closed when draining
    /// begins, so that the listeners really close once the accept loops let go of them.
    handover: HandoverSockets,
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

    /// The listening sockets, to hand to a successor ([`crate::handover`]).
    pub fn handover_sockets(&self) -> &HandoverSockets {
        &self.handover
    }

    /// Binds `--admin-socket` anew, after a new process that took the path over failed: the path
    /// then names a socket nobody answers, and this process goes on serving.
    pub fn reclaim_admin_socket(&mut self) {
        if let Some(socket) = &mut self.admin_unix
            && let Err(e) = socket.rebind()
        {
            warn!(path = %socket.path().display(), error = %e, "cannot bind --admin-socket again");
        }
    }

    /// Turns readiness off, stops accepting, lets in-flight requests finish within the grace
    /// period, flushes the audit log, then stops the admin listener and returns.
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

/// A hint for the bind errors operators meet.
fn bind_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another process (the kubelet itself?) listens there: move the kubelet to the other \
             family's loopback (address: \"::1\" beside 0.0.0.0) first, or choose another \
             --listen-address"
        }
        std::io::ErrorKind::AddrNotAvailable => "; it is not an address of this host",
        std::io::ErrorKind::PermissionDenied => {
            "; ports below 1024 need CAP_NET_BIND_SERVICE (the shipped unit grants it)"
        }
        _ => "",
    }
}

/// A listening socket on `addr`. An IPv6 address serves IPv6 only (`IPV6_V6ONLY`), so that
/// `[::]:10250` and `0.0.0.0:10250` can be served side by side, and so that `0.0.0.0:10250`
/// (or `[::]:10250`) coexists with a kubelet on the other family's loopback (`[::1]:10250`, or
/// `127.0.0.1:10250`): the kernel only refuses a wildcard beside a specific address of the same
/// family. `SO_REUSEADDR` as Tokio sets it (a restart rebinds while old connections linger in
/// TIME_WAIT); `SO_REUSEPORT` so that a new proxy starts beside the running one on the same
/// addresses (a surge rollout), the kernel spreading new connections over both until the old one
/// stops. Only a process of the same user can join (Linux checks it); a kubelet still on the port
/// does not set it, so binding beside it still fails. The backlog is Tokio's.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// How long the admin address is retried while in use (a previous instance letting go of it).
const ADMIN_BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest pause between two tries of an address in use: the most a client can be refused
/// between the kubelet letting go of the port and the proxy taking it.
const MAX_BIND_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// The admin listener's flag, which names its role among inherited sockets.
const ADMIN_FLAG: &str = "--admin-listen-address";

/// Binds `addr` for `flag`, or takes the socket for it that systemd or the proxy handing over
/// passed in ([`crate::listen_fds`]). While another process holds the address (the kubelet still on the
/// port during a rollout), retries with a backoff from 100 ms to 500 ms for up to `retry`, saying
/// why once and then every minute; any other error, or still in use after that, is a
/// [`StartError::Bind`].
async fn bind(
    flag: &'static str,
    addr: SocketAddr,
    retry: std::time::Duration,
    inherited: &mut Inherited,
) -> Result<TcpListener, StartError> {
    let role = if flag == ADMIN_FLAG {
        Role::Admin
    } else {
        Role::KubeletApi
    };
    if let Some(listener) = inherited.claim(role, addr) {
        return TcpListener::from_std(listener).map_err(|source| StartError::Bind {
            flag,
            addr,
            source,
        });
    }
    let started = Instant::now();
    let mut pause = std::time::Duration::from_millis(100);
    let mut said: Option<Instant> = None;
    loop {
        match listen(addr) {
            Ok(listener) => return Ok(listener),
            Err(source)
                if source.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < retry =>
            {
                if said.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(60)) {
                    warn!(flag, %addr, waited = ?started.elapsed(), ?retry, "address in use; retrying until it is free");
                    said = Some(Instant::now());
                }
                tokio::time::sleep(pause.min(retry.saturating_sub(started.elapsed()))).await;
                pause = (pause * 2).min(MAX_BIND_PAUSE);
            }
            Err(source) => return Err(StartError::Bind { flag, addr, source }),
        }
    }
}

/// Binds both listeners and starts serving.
pub async fn start(config: Services) -> Result<RunningProxy, StartError> {
    // The budget of Settings::load counts on the hard limit; make it the one in force.
    match crate::descriptors::raise_soft_limit() {
        Ok(limit) => debug!(limit, "open-file limit"),
        Err(e) => warn!(error = %e, "cannot raise the open-file limit to its hard limit"),
    }
    // The admin listener first: while the kubelet API's address is still held (by the kubelet,
    // during a rollout), /healthz says the process is alive and /readyz that it does not serve
    // yet, so a liveness or startup probe does not restart a proxy that is only waiting.
    let mut inherited = Inherited::take().unwrap_or_else(|e| {
        warn!(error = %e, "ignoring the inherited sockets; binding the addresses anew");
        Inherited::default()
    });
    let admin_listener = bind(
        ADMIN_FLAG,
        config.admin_listen_address,
        ADMIN_BIND_RETRY,
        &mut inherited,
    )
    .await?;
    let metrics = Arc::clone(&config.metrics);
    let shutdown = config.shutdown.clone();
    let listening = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admin_addr = admin_listener.local_addr()?;
    let mut handover = HandoverSockets::default();
    handover.add(Role::Admin, &admin_listener)?;
    info!(%admin_addr, "admin listener serving /healthz, /readyz and /metrics");
    let admin = tokio::spawn(admin::serve(
        admin_listener,
        Arc::clone(&metrics),
        admin::Readiness {
            listening: Arc::clone(&listening),
            draining: shutdown.draining().clone(),
        },
    ));
    let admin_unix = match &config.admin_socket {
        Some(path) => {
            let readiness = admin::Readiness {
                listening: Arc::clone(&listening),
                draining: shutdown.draining().clone(),
            };
            let socket = admin::AdminSocket::serve(path.clone(), Arc::clone(&metrics), readiness)
                .map_err(|source| StartError::AdminSocket {
                path: path.clone(),
                source,
            })?;
            info!(path = %path.display(), "admin endpoints on this process's own socket too");
            Some(socket)
        }
        None => None,
    };
    let mut listeners = Vec::with_capacity(config.listen_addresses.len());
    for &address in &config.listen_addresses {
        listeners.push(
            bind(
                "--listen-address",
                address,
                config.listen_retry_timeout,
                &mut inherited,
            )
            .await?,
        );
    }
    inherited.close_unclaimed();
    crate::handover::explain_queue_migration();
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
        grace_period: config.shutdown_grace_period,
    };
    let http = HttpServer::new(config.header_read_timeout);
    let serving_tls = Arc::clone(&config.server_tls);
    let watcher = crate::reload::FileWatcher::new(config.reloads.into_targets());
    tokio::spawn(watcher.run(Arc::clone(&metrics), shutdown.draining().clone()));
    let pipeline = Arc::new(Pipeline {
        authenticator: config.authenticator,
        decider: config.decider,
        metrics,
        audit: config.audit.clone(),
        audit_refusals: RefusalSampler::new(config.metrics.audit_suppressed()),
        audit_require_for_streams: config.audit_require_for_streams,
        upstream_reports: Reports::default(),
    });
    // Bounds open connections on all listeners and threads together: a permit is held for a
    // connection's whole life, upgraded sessions included; when none is left the loops stop
    // accepting and new clients wait in the kernel's listen queue.
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    let http = Arc::new(http);
    let forwarder = config.forwarder;
    let (threads, dispatcher) = ServingThreads::start(config.serving_threads, |index, handed| {
        let lane = Arc::new(Lane {
            pipeline: Arc::clone(&pipeline),
            forwarder: forwarder.with_own_pool(),
        });
        let accepted = Accepted {
            serving_tls: Arc::clone(&serving_tls),
            http: Arc::clone(&http),
            lane,
            limits,
            shutdown: shutdown.clone(),
            accepted: pipeline.metrics.accepted_by(index),
        };
        serve_handed(handed, accepted)
    })?;
    listening.store(true, std::sync::atomic::Ordering::Release);
    info!(%addr, addrs = ?addrs, %admin_addr, threads = threads.count(), "serving the kubelet API");
    let server = tokio::spawn(serve(
        listeners,
        slots,
        dispatcher,
        threads,
        limits,
        shutdown.clone(),
    ));
    Ok(RunningProxy {
        addr,
        addrs,
        admin_addr,
        shutdown,
        server,
        admin,
        admin_unix,
        audit: config.audit,
        handover,
    })
}

#[derive(Clone, Copy)]
struct Limits {
    max_connections: u32,
    handshake_timeout: std::time::Duration,
    deadlines: Deadlines,
    grace_period: std::time::Duration,
}

/// A connection accepted on the main runtime, on its way to a serving thread.
struct Handed {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    /// Its place under `--max-connections`, held for its whole life.
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// Accepts on every listener, sharing one bound on open connections, and hands each connection to
/// a serving thread, until draining begins; then waits for the threads to have taken everything,
/// for the connections and sessions to end (see [`Shutdown::drain`]), and ends the threads.
async fn serve(
    listeners: Vec<TcpListener>,
    slots: Arc<Semaphore>,
    dispatcher: Dispatcher<Handed>,
    mut threads: ServingThreads,
    limits: Limits,
    shutdown: Shutdown,
) {
    let mut loops = tokio::task::JoinSet::new();
    for listener in listeners {
        loops.spawn(accept_loop(
            listener,
            Arc::clone(&slots),
            dispatcher.clone(),
            shutdown.clone(),
        ));
    }
    while loops.join_next().await.is_some() {}
    // The threads' queues end once every dispatcher is gone; each thread then has started
    // serving everything handed to it.
    drop(dispatcher);
    threads.serving_ended().await;
    // Connections and upgraded sessions are the shutdown's tasks: draining waits for them,
    // then closes those still open after the grace period.
    if !shutdown.drain(limits.grace_period).await {
        warn!(
            grace_period = ?limits.grace_period,
            "requests or streams were still open after the shutdown grace period; closed them"
        );
        let status = "Grace period over: closed the requests and streams still open";
        if let Err(e) = crate::systemd::notify_status(status) {
            debug!(error = %e, "cannot tell systemd the grace period is over");
        }
    }
    threads.stop().await;
}

/// One serving thread's intake: serves every connection handed to it, on this thread's runtime,
/// until the main runtime stops handing them over.
async fn serve_handed(mut handed: mpsc::UnboundedReceiver<(Handed, Load)>, accepted: Accepted) {
    while let Some((Handed { tcp, peer, permit }, load)) = handed.recv().await {
        match TcpStream::from_std(tcp) {
            Ok(tcp) => accepted.serve(tcp, peer, permit, load),
            Err(e) => debug!(%peer, error = %e, "a serving thread cannot take a connection"),
        }
    }
}

/// Hands `tcp` to a serving thread, unless none is left (the process is stopping).
fn hand_over(
    dispatcher: &Dispatcher<Handed>,
    tcp: TcpStream,
    peer: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let tcp = match tcp.into_std() {
        Ok(tcp) => tcp,
        Err(e) => {
            debug!(%peer, error = %e, "cannot hand a connection to a serving thread");
            return;
        }
    };
    if dispatcher.dispatch(Handed { tcp, peer, permit }).is_err() {
        debug!(%peer, "no serving thread left to take a connection");
    }
}

/// Accepts connections on one listener until draining begins, then those already queued.
async fn accept_loop(
    listener: TcpListener,
    slots: Arc<Semaphore>,
    dispatcher: Dispatcher<Handed>,
    shutdown: Shutdown,
) {
    let mut accept_errors = AcceptBackoff::default();
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown.draining().cancelled() => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    accept_errors.succeeded();
                    accepted
                }
                Err(e) => {
                    // EMFILE or ENFILE when something beyond the budget holds descriptors: back
                    // off, doubling up to a second, and say so once a second at most.
                    let pause = accept_errors.failed(&e);
                    tokio::time::sleep(pause).await;
                    continue;
                }
            },
            () = shutdown.draining().cancelled() => break,
        };
        hand_over(&dispatcher, tcp, peer, permit);
    }
    accept_queued(listener, &slots, &dispatcher);
}

/// Serves the connections already in `listener`'s queue when draining begins, before the
/// listener is closed. Closing a listening socket resets every connection still queued on it;
/// beside another process on the same address (a surge rollout) those clients would see a reset
/// for a connection the kernel had already established. Served here, each gets its request
/// answered and the connection closed politely (see [`connection::LAST_CALL`]). Connections that
/// arrive between this sweep and the close are moved to the other process's socket by the kernel
/// only with `net.ipv4.tcp_migrate_req=1` ([`crate::handover::explain_queue_migration`]).
fn accept_queued(listener: TcpListener, slots: &Arc<Semaphore>, dispatcher: &Dispatcher<Handed>) {
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(e) => {
            debug!(error = %e, "cannot take the queued connections");
            return;
        }
    };
    let mut served = 0usize;
    loop {
        let Ok(permit) = Arc::clone(slots).try_acquire_owned() else {
            break;
        };
        let Ok((tcp, peer)) = listener.accept() else {
            // WouldBlock: the queue is empty; anything else ends the sweep the same way.
            break;
        };
        if let Err(e) = tcp.set_nonblocking(true) {
            debug!(%peer, error = %e, "cannot serve a queued connection");
            continue;
        }
        if dispatcher.dispatch(Handed { tcp, peer, permit }).is_err() {
            debug!(%peer, "no serving thread left to take a queued connection");
            break;
        }
        served += 1;
    }
    if served > 0 {
        debug!(served, "served the connections queued when draining began");
    }
}

/// What every connection a serving thread is handed is served with.
struct Accepted {
    serving_tls: Arc<Reloadable<rustls::ServerConfig>>,
    http: Arc<HttpServer>,
    lane: Arc<Lane>,
    limits: Limits,
    shutdown: Shutdown,
    /// This thread's count of the connections it was handed.
    accepted: prometheus_client::metrics::counter::Counter,
}

impl Accepted {
    /// Serves one connection as one of the shutdown's tasks, holding `permit` for its life.
    /// `load` is the connection's place in this thread's count; it is held as long as the
    /// connection is served.
    fn serve(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        permit: tokio::sync::OwnedSemaphorePermit,
        load: Load,
    ) {
        self.accepted.inc();
        let slot = Arc::new(ConnectionSlot::new(
            permit,
            Arc::clone(&self.lane.pipeline.metrics),
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
            _load: load,
        };
        self.shutdown.spawn(serve_connection(
            tcp, peer, acceptor, http, lane, slot, limits,
        ));
    }
}

/// The accept loop's answer to failing `accept` calls: a pause that doubles from 10 ms to 1 s, and
/// a warning at most once a second with the count of failures since the last one.
#[derive(Debug)]
struct AcceptBackoff {
    pause: std::time::Duration,
    failures: u64,
    last_warning: Option<Instant>,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pause: ACCEPT_PAUSE_MIN,
            failures: 0,
            last_warning: None,
        }
    }
}

const ACCEPT_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(10);
const ACCEPT_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

impl AcceptBackoff {
    /// Records a failure; returns how long to pause before accepting again.
    fn failed(&mut self, error: &std::io::Error) -> std::time::Duration {
        self.failures += 1;
        if self
            .last_warning
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1))
        {
            warn!(%error, failures = self.failures, "accept failed; pausing");
            self.failures = 0;
            self.last_warning = Some(Instant::now());
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_PAUSE_MAX);
        pause
    }

    /// An accepted connection ends a run of failures.
    fn succeeded(&mut self) {
        self.pause = ACCEPT_PAUSE_MIN;
    }
}

/// What one connection is served under.
struct Connection {
    handshake_timeout: std::time::Duration,
    deadlines: Deadlines,
    /// Draining closes the connection gracefully; closing drops it.
    shutdown: Shutdown,
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
    let pipeline = &lane.pipeline;
    let activity = Activity::new();
    let metrics = Arc::clone(&pipeline.metrics);
    let conn = {
        let handshake = Box::pin(handshake(tcp, peer, acceptor, &limits, &metrics));
        let Some(tls) = handshake.await else {
            return;
        };
        let identity = Arc::new(
            pipeline
                .authenticator
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
                    let response = lane
                        .pipeline
                        .handle(&lane.forwarder, &identity, peer, req, slot)
                        .await;
                    Ok::<_, Infallible>(response.map(|body| Holding::new(body, Some(in_flight))))
                })
            })
        };
        http.serve(tls, service)
    };
    let ended = connection::drive(
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
            metrics.connection_timed_out();
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
    metrics: &Metrics,
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
            metrics.handshake_failed();
            debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            metrics.handshake_failed();
            debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// What the pipeline did with one request: the response, and what metrics and audit record.
struct Handled {
    response: Response<ResponseBody>,
    outcome: Outcome,
    /// The subresource allowed, or the first asked for; empty before the path was mapped.
    subresource: &'static str,
    /// The Kubernetes verb; for requests refused before mapping, the method's.
    verb: &'static str,
    /// The audit `objectRef`: the Node, or the pod a pod-level set allowed.
    object_ref: Option<ObjectRef>,
    user: Option<Arc<User>>,
    authorization: Option<AuditAuthorization>,
}

/// What the audit event of a request needs from the request itself, taken before the request is
/// handed on; only gathered when auditing is on.
struct AuditStart {
    id: AuditId,
    received: SystemTime,
    request_uri: http::Uri,
    user_agent: Option<HeaderValue>,
}

impl Pipeline {
    /// Decides, forwards or refuses, counts and audits one request. An upgraded session keeps
    /// the connection's `slot` under --max-connections until it ends, as it outlives the HTTP
    /// connection.
    async fn handle(
        &self,
        forwarder: &Forwarder,
        identity: &ConnectionIdentity,
        peer: SocketAddr,
        req: Request<Incoming>,
        slot: Arc<ConnectionSlot>,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let head = req.method() == Method::HEAD;
        let audit_start = match &self.audit {
            Some(_) => match AuditId::random() {
                Ok(id) => Some(AuditStart {
                    id,
                    received: SystemTime::now(),
                    request_uri: req.uri().clone(),
                    user_agent: req.headers().get(USER_AGENT).cloned(),
                }),
                // A request that cannot be audited is not served.
                Err(e) => {
                    warn!(error = %e, "cannot create an audit ID");
                    return responses::internal_error("audit unavailable");
                }
            },
            None => None,
        };
        let mut handled = self
            .decide_and_forward(forwarder, identity, peer, req)
            .await;
        let response = &mut handled.response;
        if head && let Either::Right(body) = response.body() {
            // Our own answers carry a body; a HEAD response must not (HTTP/2 peers reset the
            // stream if it does). As Go's net/http does for the kubelet, the length of the body
            // that a GET would get is still announced. The kubelet's answers pass through as is.
            let length = body.size_hint().exact().unwrap_or_default();
            response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(length));
            *response.body_mut() = Either::Right(Full::default());
        }
        self.metrics.observe_request(
            &RequestLabels {
                code: response.status().as_u16(),
                decision: handled.outcome,
                subresource: handled.subresource,
            },
            started.elapsed(),
        );
        let stream = handled.response.extensions_mut().remove::<UpgradedStream>();
        let completion = match (&self.audit, audit_start) {
            (Some(audit), Some(start)) => {
                self.record(audit, start, peer, &mut handled, stream.is_some())
            }
            _ => None,
        };
        if let Some(stream) = stream {
            self.metrics.streams().inc();
            let metrics = Arc::clone(&self.metrics);
            // The session task runs this when the session ends, however it ends.
            stream.own(move || {
                metrics.streams().dec();
                drop(slot);
                if let Some((audit, mut complete)) = completion {
                    complete.stage = Stage::ResponseComplete;
                    complete.stage_timestamp = SystemTime::now();
                    audit.record(complete);
                }
            });
        }
        handled.response
    }

    /// Records the request's audit event: at `ResponseComplete`, or for an upgraded `stream` at
    /// `ResponseStarted`, returning the event to record again when the session ends.
    fn record(
        &self,
        audit: &AuditLog,
        start: AuditStart,
        peer: SocketAddr,
        handled: &mut Handled,
        stream: bool,
    ) -> Option<(AuditLog, AuditEvent)> {
        if let Ok(id) = HeaderValue::from_str(&start.id.to_string()) {
            handled.response.headers_mut().insert(AUDIT_ID, id);
        }
        let event = AuditEvent {
            id: start.id,
            stage: if stream {
                Stage::ResponseStarted
            } else {
                Stage::ResponseComplete
            },
            request_uri: start.request_uri,
            verb: handled.verb,
            user: handled.user.clone(),
            source_ip: peer.ip(),
            user_agent: start.user_agent,
            object_ref: handled.object_ref.take(),
            response_code: handled.response.status().as_u16(),
            request_received: start.received,
            stage_timestamp: SystemTime::now(),
            authorization: handled.authorization.take(),
        };
        if event.user.is_none() && !self.audit_refusals.admit() {
            return None;
        }
        let completion = stream.then(|| (audit.clone(), event.clone()));
        audit.record(event);
        completion
    }

    async fn decide_and_forward(
        &self,
        forwarder: &Forwarder,
        identity: &ConnectionIdentity,
        peer: SocketAddr,
        req: Request<Incoming>,
    ) -> Handled {
        let verdict = self
            .decider
            .decide(
                req.method(),
                req.uri().path(),
                req.uri().query(),
                || {
                    self.authenticator.authenticate(
                        identity,
                        req.version(),
                        req.headers(),
                        unix_now(),
                    )
                },
                Unobserved,
            )
            .await;
        log_verdict(&verdict, peer, &req, &self.authenticator);
        let subresource = verdict.subresource();
        // What only the audit event needs is taken only when there is an audit log.
        let audited = self.audit.is_some();
        let object_ref = audited
            .then(|| verdict.object_ref(&self.decider.node_name))
            .flatten();
        let verb = verdict.verb(req.method());
        let authorization = audited.then(|| verdict.audit()).flatten();
        let refusal = match verdict.refusal() {
            Some(refusal) => Some(refusal),
            None if self.audit_require_for_streams
                && let Some(audit) = &self.audit
                && crate::wire::is_upgrade_request(req.version(), req.headers())
                && headers::may_upgrade(req.uri().path(), req.headers())
                && !audit.is_writable() =>
            {
                warn!(%peer, "refusing a stream: its audit event cannot be written");
                Some(Refusal::AuditUnavailable)
            }
            None => None,
        };
        let (response, outcome) = match (refusal, verdict.user()) {
            (Some(refusal), _) => refusal.answer(req.method()),
            (None, Some(user)) => self.forward(forwarder, peer, req, user).await,
            // An allowed verdict always has a user; refuse should that ever not hold.
            (None, None) => Refusal::Unauthenticated.answer(req.method()),
        };
        Handled {
            response,
            outcome,
            subresource,
            verb,
            object_ref,
            user: verdict.user().cloned(),
            authorization,
        }
    }

    /// Forwards an allowed request; a failure becomes its refusal.
    async fn forward(
        &self,
        forwarder: &Forwarder,
        peer: SocketAddr,
        req: Request<Incoming>,
        user: &User,
    ) -> (Response<ResponseBody>, Outcome) {
        let method = req.method().clone();
        match forwarder.forward(req, user).await {
            Ok(response) => (response.map(Either::Left), Outcome::Allowed),
            Err(e @ ForwardError::CallerBody(_)) => {
                debug!(%peer, error = %e, "request body could not be read");
                Refusal::CallerBody(&e.to_string()).answer(&method)
            }
            Err(ForwardError::Busy(busy)) => {
                debug!(%peer, user = %user.name, error = %busy, "request not forwarded");
                Refusal::Busy(&busy).answer(&method)
            }
            Err(e) => {
                let diagnosis = cause::diagnose(&e);
                self.metrics.upstream_failed(diagnosis.cause.as_str());
                let detail = &diagnosis.detail;
                if self.upstream_reports.admit(diagnosis.cause) {
                    warn!(
                        cause = diagnosis.cause.as_str(),
                        "cannot reach the kubelet: {detail}"
                    );
                } else {
                    debug!(%peer, cause = diagnosis.cause.as_str(), "cannot reach the kubelet: {detail}");
                }
                Refusal::Upstream(&e.to_string()).answer(&method)
            }
        }
    }
}

/// One log line for a request the proxy refuses or allows: debug for the usual, warn for an
/// authorizer failure. Never a credential: only names, the path and reasons.
fn log_verdict(
    verdict: &Verdict,
    peer: SocketAddr,
    req: &Request<Incoming>,
    authenticator: &Authenticator,
) {
    let path = req.uri().path();
    let ignored_token = || authenticator.ignores_token(req.version(), req.headers());
    match verdict {
        Verdict::Redirect { .. } => {}
        Verdict::BadPath(reason) => debug!(%peer, %reason, "refused request path"),
        Verdict::Unauthenticated { failure: None } if ignored_token() => debug!(
            %peer,
            path,
            "no credential: a bearer token was sent, but token authentication is off \
             (--authentication-token-webhook)"
        ),
        Verdict::Unauthenticated { failure: None } => debug!(%peer, path, "no credential"),
        Verdict::Unauthenticated {
            failure: Some(reason),
        } => debug!(%peer, path, %reason, "authentication failed"),
        Verdict::Authorized(Judgement {
            user,
            attributes,
            pod,
            decision,
        }) => {
            if user.name == crate::authn::ANONYMOUS_USER && ignored_token() {
                debug!(
                    %peer,
                    path,
                    "anonymous: a bearer token was sent, but token authentication is off \
                     (--authentication-token-webhook)"
                );
            }
            let (user, verb) = (&user.name, attributes.verb);
            match decision {
                RequestDecision::Allowed {
                    subresource,
                    authorizer,
                    reason,
                } => debug!(%user, verb, path, subresource, authorizer, %reason, "allowed"),
                RequestDecision::Error { subresource, error } => {
                    warn!(%user, verb, path, subresource, %error, "authorization failed");
                }
                RequestDecision::Forbidden { reason } => {
                    let subresources = &attributes.subresources;
                    let pod = pod.as_ref().map(|pod| pod.label);
                    debug!(%user, verb, path, %subresources, pod, %reason, "forbidden");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_back_off_doubling_to_a_second_and_reset_on_success() {
        let mut backoff = AcceptBackoff::default();
        let error = std::io::Error::from_raw_os_error(24);
        let pauses: Vec<u64> = (0..9)
            .map(|_| backoff.failed(&error).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(&error), ACCEPT_PAUSE_MIN);
    }
}
