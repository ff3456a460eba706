//! kubelet-auth-proxy: an authenticating, authorizing reverse proxy for the kubelet API.
//!
//! Each folder of `src/` is one layer; this map lists them in the order a request meets them,
//! then the layers around the request: start-up, the operator's view, the tools.
//!
//! - [`server`]: the process and its sockets. [`server::listen_fds`] takes the sockets systemd
//!   or the process handing over passed in, or [`server::handover_socket`] fetches them from the
//!   running proxy; the rest are bound (`listeners`, never joinable; `standby` while a version
//!   from before handovers holds them); the accept loops
//!   (`accept`) hand each connection to the serving thread with the fewest
//!   ([`server::serving_threads`]: each thread has its own event loop and kubelet connection
//!   pool, so a request stays on one thread). A connection (`connection`: the TLS handshake,
//!   then HTTP) is served in the protocol its handshake agreed ([`server::http_server`]: HTTP/2
//!   for ALPN `h2`, HTTP/1.1 otherwise, as the kubelet) under its deadlines and its place under
//!   `--max-connections` ([`server::deadlines`]), within the open-file budget
//!   ([`server::descriptors`]). [`server::shutdown`] drains, then closes after the grace
//!   period; [`server::handover`] replaces the process on `SIGUSR2` without refusing a
//!   connection (the new process inherits the listening sockets), and
//!   [`server::handover_socket`] hands them to a new pod (a surge rollout) the same way, over a
//!   unix socket, checking that it runs as the proxy's user; [`server::systemd`] tells a
//!   `Type=notify` unit about readiness and stopping.
//! - [`tls`]: rustls serving config (client certificates requested, never required; only the
//!   handshake signature is checked there) and the client side towards the kubelet.
//! - [`request`]: what happens to each request. [`request::pipeline`] runs it top to bottom:
//!   the one decision (for the server and `explain` alike, [`request::decision`]), then
//!   forwarding or refusing, counting and auditing. The decision is:
//!   - [`request::canonical_path`]: the path gate before anything else: redirect or refuse
//!     unclean paths, so the path we authorize is the path the kubelet routes;
//!   - [`authn`]: who is calling (x509 client certificates, bearer tokens checked with
//!     TokenReview, anonymous), with the kubelet's chain semantics; yields an `Arc<User>`.
//!     Service-account JWTs are checked on the node first ([`authn::jwt`] against the keys
//!     [`authn::service_account_keys`] keeps current), so a forged one never becomes a review;
//!     tokens it cannot check are reviewed within a budget of failures per source address and
//!     per node ([`authn::failure_budget`]);
//!   - [`authz`]: verb and path → the kubelet's attribute list ([`authz::attributes`]); the
//!     authorizer chain (AlwaysAllow, AlwaysDeny, [`authz::node`], [`authz::policy`] over
//!     [`authz::rbac`] matching, [`authz::live_rbac`]: the cluster's roles and bindings listed
//!     and watched from the API server and decided with the `Policy` evaluator,
//!     [`authz::webhook`] with SubjectAccessReview, asked when its CEL
//!     [`authz::match_conditions`] are true, each bounded by kube-apiserver's cost limits);
//!   - the kubelet's loop over the list (the authorizers before the first Webhook asked about
//!     every set before any review), and [`request::decision::Refusal::answer`]: the one
//!     place a refusal becomes its response ([`request::responses`], the kubelet's bodies) and
//!     metrics label.
//!
//!   [`request::wire`] holds the header and WebSocket protocol knowledge [`authn`] and
//!   [`forward`] share; [`request::held_body`] the response body that keeps a request's places
//!   until it ends.
//! - [`apiserver`]: TokenReview and SubjectAccessReview calls with the kubelet's retries;
//!   [`apiserver::cache`]: the bounded caches in front of them, which coalesce concurrent misses,
//!   spread the expiries of keys filled together and refresh keys in use ahead of expiry (the
//!   rules the fleet simulation `examples/fleet_sim` runs too); the calls in flight are bounded
//!   per kind, and the API server's `Retry-After` holds them all off ([`apiserver::hold`]).
//! - [`forward`]: forwarding to the kubelet: header hygiene, streaming (the kubelet's chunks
//!   gathered into frames as large as what is readable, `coalesce`), upgrades (exec, attach and
//!   portForward only, one task owning each session, copied both ways in full TLS records,
//!   `upgrade::pump`), and the bound on requests in flight to it, in all and per user.
//! - [`audit`]: one `audit.k8s.io/v1` event per request (`event`, `json`, `writer`, `rotate`),
//!   written off the request path, each bounded in size (cut, never dropped); which events are
//!   written at all decided by an `audit.k8s.io/v1` policy ([`audit::policy`],
//!   `--audit-policy-file`); a byte budget per identity and overall keeps floods from rotating
//!   earlier events out ([`audit::budget`], `summary`); never for requests that act
//!   ([`audit::acts`]).
//! - [`budget`]: token buckets and the bounded table of them, keyed by what a client chooses,
//!   that both the audit flood budget and the failure budget meter clients with.
//! - [`config`]: flags and files → validated [`config::Settings`], reading files and nothing
//!   else (`check-config` stops there).
//! - [`startup`]: [`startup::assemble`] builds the running services from the settings (API
//!   server and kubelet clients, metrics, the audit log); [`startup::reload`] swaps
//!   certificates, the client CA and policies in when their files change; [`startup::probe`]
//!   (`check-config --probe`) reaches each dependency before the proxy relies on it.
//! - [`admin`]: what the operator sees: Prometheus metrics ([`admin::metrics`], their label
//!   sets in [`admin::labels`]; [`admin::generation`]: which build and process serves; [`admin::certificates`]: when each
//!   certificate loaded expires, when each watched file was last reloaded), the `/healthz`, `/readyz`,
//!   `/metrics` listener ([`admin::listener`], on `--admin-socket` too, which
//!   [`admin::exec_probe`] asks for exec probes), and a recurring failure said once a minute
//!   per cause ([`admin::reports`]).
//! - [`tools`]: [`tools::demo`], the self-contained tour; [`tools::explain`], one request's
//!   decision step by step, or a table of them (`--check`), from the server's own configuration
//!   and code (it reads only [`config::AuthorizationSettings`]).
// Denied everywhere but in the two modules that take and pass inherited descriptors
// (server::listen_fds, server::handover), which no safe interface can do.
#![deny(unsafe_code)]

pub mod admin;
pub mod apiserver;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod budget;
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
pub use server::{RunningProxy, StartError, start};
pub use startup::assemble::{Services, assemble};

/// Serves until SIGINT or SIGTERM, then shuts down gracefully, telling systemd (when it started
/// the proxy as a `Type=notify` service) when serving begins and when draining starts. On
/// SIGUSR2, hands the listening sockets to a new process started from the same path
/// ([`server::handover`]) and drains once it serves; if it fails, goes on serving.
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
                        // The new process may have taken the paths of --admin-socket and
                        // --handover-socket before failing.
                        proxy.reclaim_sockets();
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
