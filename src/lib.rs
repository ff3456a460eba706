//! kubelet-auth-proxy: an authenticating, authorizing reverse proxy for the kubelet API.
//!
//! Start-up: [`config`] turns flags and files into validated [`config::Settings`], reading files
//! and nothing else (`check-config` stops there); [`mod@assemble`] builds the running services from
//! them (API server and kubelet clients, metrics, the audit log); [`server`] serves. `explain`
//! reads only [`config::AuthorizationSettings`] and runs the server's own decision.
//!
//! A request flows through the modules in this order (see [`server`] for the pipeline itself):
//!
//! - [`serving_threads`]: the threads that serve client connections, each with its own event
//!   loop and kubelet connection pool, so a request stays on one thread; the main runtime's
//!   accept loops ([`server`]) hand each connection to the thread serving the fewest.
//! - [`http_server`]: the HTTP server a connection gets, by the protocol its TLS handshake agreed
//!   (HTTP/2 for ALPN `h2`, HTTP/1.1 otherwise, as the kubelet).
//! - [`connection`]: each client connection's deadlines (first request, idle) and its place under
//!   `--max-connections`; [`descriptors`]: the open-file budget those places fit in.
//! - [`tls`]: rustls serving config; client certificates are requested, never required, and only
//!   the handshake signature is checked there.
//! - [`decision`]: the one decision about a request, for the server and `explain` alike:
//!   - [`canonical_path`]: the path gate before anything else: redirect or refuse unclean paths,
//!     so the path we authorize is the path the kubelet routes;
//!   - [`authn`]: who is calling (x509 client certificates, bearer tokens checked with
//!     TokenReview, anonymous), with the kubelet's chain semantics; yields an `Arc<User>`;
//!   - [`authz`]: verb and path → the kubelet's attribute list ([`authz::attributes`]); the
//!     authorizer chain (AlwaysAllow, AlwaysDeny, [`authz::node`], [`authz::policy`] over
//!     [`authz::rbac`] matching, [`authz::webhook`] with SubjectAccessReview);
//!   - the kubelet's loop over the list, and [`decision::Refusal::answer`]: the one place a
//!     refusal becomes its response ([`responses`], the kubelet's bodies) and metrics label.
//! - [`apiserver`]: TokenReview and SubjectAccessReview calls with the kubelet's retries;
//!   [`cache`]: the bounded caches in front of them, which coalesce concurrent misses, spread the
//!   expiries of keys filled together and refresh keys in use ahead of expiry ([`cache::policy`],
//!   the rules the fleet simulation `examples/fleet_sim` runs too); the calls in flight are
//!   bounded per kind, and the API server's `Retry-After` holds them all off
//!   ([`apiserver::hold`]).
//! - [`proxy`]: forwarding to the kubelet: header hygiene, streaming, upgrades (exec, attach and
//!   portForward only, one task owning each session), and the bound on requests in flight to it,
//!   in all and per user. [`wire`]: the header and WebSocket protocol knowledge [`authn`] and
//!   [`proxy`] share.
//! - [`reload`]: certificates, the client CA and policies swapped in when their files change.
//! - [`reports`]: a recurring failure said once a minute per cause.
//! - [`metrics`] and [`admin`]: Prometheus metrics and the `/healthz`, `/readyz`, `/metrics` listener
//!   (on `--admin-socket` too, which [`admin_probe`] asks for exec probes); [`generation`]: which
//!   build and process serves.
//! - [`audit`]: one `audit.k8s.io/v1` event per request ([`audit`]'s `event`, `json`, `writer`,
//!   `rotate`), written off the request path, each bounded in size; refusals before
//!   authentication sampled ([`audit::refusals`]).
//! - [`shutdown`]: draining, then closing after the grace period, and the connections and
//!   sessions it waits for; [`systemd`]: readiness and stopping notifications for `Type=notify`.
//! - Replacing the proxy without refusing a connection: listeners bound with `SO_REUSEPORT`
//!   ([`server`]), so a new process starts beside the old; [`listen_fds`]: sockets passed in by
//!   systemd or by the process handing over; [`handover`]: `SIGUSR2` starts the new version from
//!   the same path with the same sockets, and drains once it serves.
//! - [`demo`]: the self-contained tour; [`explain`]: one request's decision, step by step, or a
//!   table of them (`--check`), for operators, from the same configuration and code.
// Denied everywhere but in the two modules that take and pass inherited descriptors
// (listen_fds, handover), which no safe interface can do.
#![deny(unsafe_code)]

pub mod admin;
pub mod apiserver;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod config;
pub mod forward;
pub mod request;
pub mod server;
pub mod startup;
#[cfg(test)]
mod test_data;
pub mod tls;
pub mod tools;

pub use config::{ConfigError, Settings};
pub use server::{RunningProxy, StartError, start};
pub use startup::assemble::{Services, assemble};

/// Serves until SIGINT or SIGTERM, then shuts down gracefully, telling systemd (when it started
/// the proxy as a `Type=notify` service) when serving begins and when draining starts. On
/// SIGUSR2, hands the listening sockets to a new process started from the same path
/// ([`handover`]) and drains once it serves; if it fails, goes on serving.
pub async fn run(config: Services) -> Result<(), StartError> {
    // Before anything else: a SIGUSR2 must never meet the default action, which kills.
    let mut upgrade =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let successor = server::handover::Successor::of_this_process();
    let metrics = std::sync::Arc::clone(&config.metrics);
    let mut proxy = start(config).await?;
    // A process taking over tells the old one, which then names it to systemd.
    if !server::handover::report_ready()
        && let Err(e) = server::systemd::notify_ready()
    {
        tracing::warn!(error = %e, "cannot tell systemd the proxy is ready");
    }
    loop {
        tokio::select! {
            stop = wait_for_signal() => {
                stop?;
                tracing::info!("shutting down");
                if let Err(e) = server::systemd::notify_stopping() {
                    tracing::warn!(error = %e, "cannot tell systemd the proxy is stopping");
                }
                break;
            }
            _ = upgrade.recv() => {
                let successor = match &successor {
                    Ok(successor) => successor,
                    Err(e) => {
                        metrics.generation().handover_failed("spawn");
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
                        tracing::info!("shutting down during an upgrade in place");
                        if let Err(e) = server::systemd::notify_stopping() {
                            tracing::warn!(error = %e, "cannot tell systemd the proxy is stopping");
                        }
                        break;
                    }
                };
                match started {
                    Ok(pid) => {
                        metrics.generation().handed_over();
                        tracing::info!(pid, "the new process serves; draining this one");
                        if let Err(e) = server::systemd::notify_main_pid(pid) {
                            tracing::warn!(error = %e, "cannot tell systemd the new main process");
                        }
                        break;
                    }
                    Err(e) => {
                        metrics.generation().handover_failed(e.cause());
                        tracing::warn!(error = %e, "SIGUSR2: upgrade in place failed");
                        // The new process may have taken --admin-socket's path before failing.
                        proxy.reclaim_admin_socket();
                    }
                }
            }
        }
    }
    proxy.shutdown().await;
    Ok(())
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}
