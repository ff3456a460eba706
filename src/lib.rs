//! kubelet-auth-proxy: an authenticating, authorizing reverse proxy for the kubelet API.
//!
//! Each folder of `src/` is one layer. This map lists them from the ground up, and a layer names
//! only the layers listed before it (`tests/layers.rs` keeps it so): the ground floor, the domain
//! layers a request meets (authentication, authorization, audit, forwarding), the pipeline that
//! runs them, the server around it, and the configuration, start-up and tools that build and
//! drive the rest. Each layer defines the metrics it updates and registers them, at assembly, in
//! the one registry the admin listener serves.
//!
//! - [`base`]: what every layer may use, knowing none of them. Token buckets and the bounded
//!   table of them, keyed by what a client chooses ([`base::budget`]: the audit flood budget and
//!   the failure budget meter clients with it); values built from files and swapped when the
//!   files change, and the watcher that does it, counted ([`base::reload`], the certificates'
//!   expiry in [`base::certificates`]); the two-step shutdown, draining then closing, that every
//!   long-lived task watches ([`base::shutdown`]; when closing comes is the server's decision); a recurring failure said once a minute per
//!   cause ([`base::reports`]); the HTTP and WebSocket knowledge authentication and forwarding
//!   share ([`base::wire`]); the response body that keeps a request's places until it ends
//!   ([`base::held_body`]); the metric conventions ([`base::metrics`]); CEL as kube-apiserver
//!   evaluates it ([`base::cel`]: the environment, compiling within its limits, a load check in
//!   place of its type checker and a cost model in place of its cost limits, each caller
//!   declaring its variables), for authorization's match conditions and authentication's
//!   claim mappings and validation rules.
//! - [`tls`]: rustls serving config (client certificates requested, never required; only the
//!   handshake signature is checked there), the client side towards the kubelet, PEM reading.
//! - [`apiserver`]: TokenReview and SubjectAccessReview calls with the kubelet's retries;
//!   [`apiserver::cache`]: the bounded caches in front of them, which coalesce concurrent misses,
//!   spread the expiries of keys filled together and refresh keys in use ahead of expiry (the
//!   rules the fleet simulation `examples/fleet_sim` runs too); the calls in flight are bounded
//!   per kind, and the API server's `Retry-After` holds them all off ([`apiserver::hold`]).
//! - [`authn`]: who is calling (x509 client certificates, bearer tokens checked with
//!   TokenReview, anonymous), with the kubelet's chain semantics; yields an `Arc<User>`.
//!   Service-account JWTs are checked on the node first ([`authn::jwt`] against the keys
//!   [`authn::service_account_keys`] keeps current), so a forged one never becomes a review;
//!   every review passes one gate, a budget of failures per source address and per node that
//!   keeps a place for sources in good standing ([`authn::failure_budget`]), and refusals are
//!   cached like any answer. [`authn::structured`] (`--authentication-config`): kube-apiserver's
//!   `AuthenticationConfiguration` read and validated as it validates it, reloaded when it
//!   changes; tokens of its JWT issuers decided on the node and never reviewed (their keys:
//!   [`authn::structured::keys`]; claims mapped by name or with CEL:
//!   [`authn::structured::mapping`], [`authn::structured::expressions`]), anonymous access by
//!   path.
//! - [`authz`]: verb and path → the kubelet's attribute list ([`authz::attributes`]); the
//!   authorizer chain (AlwaysAllow, AlwaysDeny, [`authz::node`], [`authz::policy`] over
//!   [`authz::rbac`] matching, [`authz::live_rbac`]: the cluster's roles and bindings listed and
//!   watched from the API server and decided with the `Policy` evaluator, [`authz::webhook`] with
//!   SubjectAccessReview, asked when its CEL [`authz::match_conditions`] are true, each bounded by
//!   kube-apiserver's cost limits).
//! - [`audit`]: one `audit.k8s.io/v1` event per request (`event`, `json`, `writer`, `rotate`),
//!   written off the request path, each bounded in size (cut, never dropped); which events are
//!   written at all decided by an `audit.k8s.io/v1` policy ([`audit::policy`],
//!   `--audit-policy-file`); a byte budget per identity and overall keeps floods from rotating
//!   earlier events out ([`audit::budget`], `summary`), the one admission point of audit bytes:
//!   requests that act ([`audit::acts`]) pass it before they reach the kubelet and are then
//!   written whatever it holds, an identity past its fair share refused with 429; the first
//!   read of each identity, verb and subresource a minute is always written.
//! - [`forward`]: forwarding to the kubelet: header hygiene, streaming (the kubelet's chunks
//!   gathered into frames until its connection reads dry, `coalesce` and `drained`; a trickle
//!   of one-line records read 16 KiB at a time, `batching`), upgrades (exec, attach and
//!   portForward only, one task owning each session, copied both ways in full TLS records,
//!   `upgrade::pump`), and the bound on requests in flight to it, in all and per user.
//! - [`request`]: what happens to each request. [`request::pipeline`] runs it top to bottom:
//!   the one decision (for the server and `explain` alike, [`request::decision`]), then
//!   forwarding or refusing, counting and auditing. The decision is the path gate before
//!   anything else ([`request::canonical_path`]: redirect or refuse unclean paths, so the path we
//!   authorize is the path the kubelet routes), then [`authn`], then [`authz`] in the kubelet's
//!   loop over the attribute list (the authorizers before the first Webhook asked about every set
//!   before any review), and [`request::decision::Refusal::answer`]: the one place a refusal
//!   becomes its response ([`request::responses`], the kubelet's bodies) and its
//!   [`request::outcome`].
//! - [`admin`]: what the operator sees: the `/healthz`, `/readyz`, `/metrics` listener
//!   ([`admin::listener`], on `--admin-socket` too, which [`admin::exec_probe`] asks for exec
//!   probes). It serves the registry it is given and knows no layer's metrics.
//! - [`server`]: the process and its sockets. [`server::listen_fds`] takes the sockets systemd
//!   or the process handing over passed in, or [`server::handover_socket`] fetches them from the
//!   running proxy; the rest are bound (`listeners`, never joinable; `standby` while a version
//!   from before handovers holds them, ready only while `port_holder` finds no other process on
//!   them); the accept loops (`accept`) hand each connection to the
//!   serving thread with the fewest ([`server::serving_threads`]: each thread has its own event
//!   loop and kubelet connection pool, so a request stays on one thread). A connection
//!   (`connection`: the TLS handshake, then HTTP) is served in the protocol its handshake agreed
//!   ([`server::http_server`]: HTTP/2 for ALPN `h2`, HTTP/1.1 otherwise, as the kubelet) under
//!   its deadlines and its place under `--max-connections` ([`server::deadlines`]), within the
//!   open-file budget ([`server::descriptors`]). [`server::handover`] replaces the process on
//!   `SIGUSR2` without refusing a connection (the new process inherits the listening sockets),
//!   and [`server::handover_socket`] hands them to a new pod (a surge rollout) the same way, over
//!   a unix socket, checking that it runs as the proxy's user; [`server::drain`] is what a
//!   stopped process does with what is still open: closed with the grace period, or, once a
//!   successor serves, sessions served on until they end (`--session-drain-timeout`), its pod
//!   released from its DaemonSet so the rollout does not wait, and at most one draining process
//!   per node; [`server::systemd`] tells a
//!   `Type=notify` unit about readiness and stopping; [`server::generation`] says which build
//!   and process serves. [`Services`] is what it runs with.
//! - [`config`]: flags and files → validated [`config::Settings`], reading files and nothing
//!   else (`check-config` stops there).
//! - [`startup`]: [`startup::assemble`] builds the running services from the settings (API
//!   server and kubelet clients, the audit log, every layer's metrics in one registry:
//!   [`startup::metrics`]); [`startup::probe`] (`check-config --probe`) reaches each dependency
//!   before the proxy relies on it.
//! - [`tools`]: [`tools::demo`], the self-contained tour; [`tools::explain`], one request's
//!   decision step by step, or a table of them (`--check`), from the server's own configuration
//!   and code (it reads only [`config::AuthorizationSettings`]).
// Denied everywhere but in the two modules that take and pass inherited descriptors
// (server::listen_fds, server::handover) and the one that sets SO_RCVLOWAT
// (forward::batching::low_water), which no safe interface can do.
#![deny(unsafe_code)]

pub mod admin;
pub mod apiserver;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod base;
pub mod config;
pub mod forward;
pub mod request;
pub mod server;
pub mod startup;
#[cfg(test)]
mod test_data;
#[cfg(test)]
mod test_fixtures;
pub mod tls;
pub mod tools;

pub use config::{ConfigError, Settings};
pub use server::{RunningProxy, Services, StartError, start};
pub use startup::assemble::assemble;

/// Serves until SIGINT or SIGTERM, then shuts down gracefully, telling systemd (when it started
/// the proxy as a `Type=notify` service) when serving begins and when draining starts. On
/// SIGUSR2, hands the listening sockets to a new process started from the same path
/// ([`server::handover`]) and drains once it serves; if it fails, goes on serving. After a
/// handover the sessions still open are served on past the grace period
/// ([`server::drain`]); another SIGINT or SIGTERM, or a SIGQUIT at any time, closes everything at
/// once (the audit log is still flushed).
pub async fn run(config: Services) -> Result<(), StartError> {
    // Before anything else: a SIGUSR2 must never meet the default action, which kills, nor a
    // SIGQUIT the one that dumps core.
    let mut upgrade =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let mut quit = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::quit())?;
    let successor = server::handover::Successor::of_this_process();
    let generation = config.metrics.server.generation().clone();
    let mut proxy = start(config).await?;
    // A process taking over tells the old one, which then names it to systemd.
    match server::handover::report_ready() {
        Some(parent) => proxy.took_over_from(parent),
        None => {
            if let Err(e) = server::systemd::notify_ready() {
                tracing::warn!(error = %e, "cannot tell systemd the proxy is ready");
            }
        }
    }
    loop {
        tokio::select! {
            stop = wait_for_signal() => {
                stop?;
                stopping("shutting down");
                break;
            }
            _ = quit.recv() => {
                stopping("SIGQUIT: shutting down without waiting for requests or sessions");
                proxy.shutdown_handle().end_now();
                break;
            }
            _ = upgrade.recv() => {
                let successor = match &successor {
                    Ok(successor) => successor,
                    Err(e) => {
                        generation.handover_failed("spawn");
                        tracing::warn!(error = %e, "SIGUSR2: cannot tell which executable this process was started from; going on serving");
                        continue;
                    }
                };
                tracing::info!("SIGUSR2: upgrading in place");
                let started = tokio::select! {
                    started = successor.start(proxy.handover_sockets()) => started,
                    // A stop meanwhile wins: the new process is killed on the way out.
                    stop = wait_for_signal() => {
                        stop?;
                        stopping("shutting down during an upgrade in place");
                        break;
                    }
                };
                match started {
                    Ok(pid) => {
                        generation.handed_over();
                        proxy.succeeded();
                        tracing::info!(pid, "the new process serves; draining this one");
                        if let Err(e) = server::systemd::notify_main_pid(pid) {
                            tracing::warn!(error = %e, "cannot tell systemd the new main process");
                        }
                        break;
                    }
                    Err(e) => {
                        generation.handover_failed(e.cause());
                        tracing::warn!(error = %e, "SIGUSR2: upgrade in place failed");
                        // The new process may have taken the paths of --admin-socket and
                        // --handover-socket before failing.
                        proxy.reclaim_sockets();
                    }
                }
            }
        }
    }
    let ending = proxy.shutdown_handle();
    let drained = proxy.shutdown();
    tokio::pin!(drained);
    loop {
        let why = tokio::select! {
            () = &mut drained => return Ok(()),
            stop = wait_for_signal() => {
                stop?;
                "another stop signal"
            }
            _ = quit.recv() => "SIGQUIT",
        };
        if !ending.closing().is_cancelled() {
            tracing::info!(
                "{why} while draining: closing every request and session still open now"
            );
        }
        ending.end_now();
    }
}

/// Says `why` the proxy stops, in the log and to systemd.
fn stopping(why: &str) {
    tracing::info!("{why}");
    if let Err(e) = server::systemd::notify_stopping() {
        tracing::warn!(error = %e, "cannot tell systemd the proxy is stopping");
    }
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}
