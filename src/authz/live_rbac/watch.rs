//! One kind's list and watch, for as long as the proxy runs: list once (from the API server's
//! watch cache, in pages), then watch from that version, resuming each watch from the last
//! version seen (an event or a bookmark), and list again only when the API server no longer has
//! that version (`410 Gone`). Failures back off with jitter (and at least as long as a 429 asks);
//! the first list waits a random part of `--rbac-start-jitter`, so a fleet started together does
//! not list together.
//!
//! This is kube's own list-then-watch protocol (what `kube::runtime::watcher` does), written out
//! because the authorizer needs to see what that watcher hides: a watch that started, and
//! bookmarks, are the only signs that a quiet watch is healthy, and the staleness bound depends on
//! telling a quiet watch from a broken one. A watch refused with `410 Gone` also relists here
//! instead of asking again from the same version.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::{Resource, ResourceExt};

use super::Shared;
use super::kinds::Watched;
use crate::apiserver::ApiServerSettings;
use crate::apiserver::cache::random_fraction;
use crate::authz::policy::ObjectKey;

/// Objects per list page, as client-go's pager.
const PAGE_SIZE: u32 = 500;
/// Watches last a random time in [`WATCH_TIMEOUT`, 2 × `WATCH_TIMEOUT`), as client-go's
/// reflector: long enough to cost the API server little, random so nodes do not re-watch in step.
const WATCH_TIMEOUT: Duration = Duration::from_secs(300);
/// How long after its own timeout a watch that has said nothing is taken for silently dropped.
const WATCH_IDLE_MARGIN: Duration = Duration::from_secs(30);
/// A watch the API server ends sooner than this, having sent nothing, counts as a failure (backs
/// off) rather than a normal end (re-watched at once), so a server closing watches at once is
/// not asked in a loop.
const SHORTEST_WATCH: Duration = Duration::from_secs(1);
/// The first back-off; it doubles up to [`MAX_BACKOFF`], as kube's watcher and client-go.
const FIRST_BACKOFF: Duration = Duration::from_millis(800);
/// The longest back-off between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest `Retry-After` obeyed; a larger one is taken as this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How the watch of one kind runs.
#[derive(Clone)]
pub(super) struct WatchSettings {
    /// Where to list and watch.
    pub apiserver: ApiServerSettings,
    /// The first list waits a random part of this.
    pub start_jitter: Duration,
}

/// Lists and watches `K` until the task is dropped.
pub(super) async fn run<K: Watched>(shared: Arc<Shared>, settings: WatchSettings) {
    let kind = K::KIND;
    tokio::time::sleep(settings.start_jitter.mul_f64(random_fraction())).await;
    let mut backoff = Backoff::default();
    let mut reason = "start";
    loop {
        // The client in force for each request: a kubeconfig's is rebuilt when its certificate
        // rotates.
        let api = || Api::<K>::all(settings.apiserver.client());
        let mut version = match list::<K>(&shared, &api()).await {
            Ok(version) => {
                shared.metrics.listed(kind, reason);
                backoff.reset();
                version
            }
            Err(failure) => {
                shared.failed(kind, &failure, false);
                backoff.wait(failure.retry_after).await;
                continue;
            }
        };
        // Set when a watch ended without a word: a failure that follows may have begun
        // unnoticed at the last contact.
        let mut silent = false;
        loop {
            match watch::<K>(&shared, &api(), &mut version).await {
                End::Closed => {
                    silent = false;
                    backoff.reset();
                }
                End::Silent => silent = true,
                End::Gone => {
                    reason = "gone";
                    tracing::info!(
                        kind = kind.resource(),
                        "the API server no longer holds the version the watch resumes from (410 Gone): listing again"
                    );
                    break;
                }
                End::Failed(failure) => {
                    shared.failed(kind, &failure, silent);
                    backoff.wait(failure.retry_after).await;
                }
            }
        }
    }
}

/// One complete list of `K`, replacing what the store holds of it; returns the version to watch
/// from.
async fn list<K: Watched>(shared: &Shared, api: &Api<K>) -> Result<String, Failure> {
    let mut held = std::collections::BTreeMap::new();
    let mut params = ListParams {
        limit: Some(PAGE_SIZE),
        // From the API server's watch cache, not a quorum read from etcd: what a fleet of
        // nodes listing at once must ask for.
        resource_version: Some("0".to_owned()),
        version_match: Some(VersionMatch::NotOlderThan),
        ..ListParams::default()
    };
    loop {
        let page = api.list(&params).await.map_err(Failure::from_client)?;
        shared.contact(K::KIND);
        let version = page.metadata.resource_version.unwrap_or_default();
        for object in page.items {
            let key = key_of(&object);
            if let Some(kept) = object.hold(shared.scope) {
                held.insert(key, kept);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                // The next pages come from the same snapshot; a version may not be given.
                params.continue_token = Some(token);
                params.resource_version = None;
                params.version_match = None;
            }
            None if version.is_empty() => {
                return Err(Failure::new(
                    "the list answer carries no resourceVersion".to_owned(),
                ));
            }
            None => {
                shared.replace::<K>(held).await;
                return Ok(version);
            }
        }
    }
}

/// How a watch ended.
enum End {
    /// The API server ended it (its timeout): watch again at once.
    Closed,
    /// Nothing came for longer than its timeout: the connection was lost unnoticed; watch again
    /// at once.
    Silent,
    /// The version it resumed from is gone: list again.
    Gone,
    /// It could not start, or broke.
    Failed(Failure),
}

/// One watch of `K` from `version`, applying its events and advancing `version`.
async fn watch<K: Watched>(shared: &Shared, api: &Api<K>, version: &mut String) -> End {
    let timeout = WATCH_TIMEOUT.mul_f64(1.0 + random_fraction());
    let params = WatchParams {
        timeout: Some(u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX)),
        bookmarks: true,
        ..WatchParams::default()
    };
    let stream = match api.watch(&params, version).await {
        Ok(stream) => stream,
        Err(e) if is_gone(&e) => return End::Gone,
        Err(e) => return End::Failed(Failure::from_client(e)),
    };
    let started = Instant::now();
    shared.metrics.watch_started(K::KIND);
    shared.contact(K::KIND);
    let mut stream = std::pin::pin!(stream);
    let mut heard = false;
    loop {
        let next = match tokio::time::timeout(timeout + WATCH_IDLE_MARGIN, stream.next()).await {
            Ok(next) => next,
            Err(_) => return End::Silent,
        };
        let event = match next {
            None if heard || started.elapsed() >= SHORTEST_WATCH => return End::Closed,
            None => {
                return End::Failed(Failure::new(
                    "the API server ended the watch at once".to_owned(),
                ));
            }
            Some(Ok(event)) => event,
            Some(Err(e)) => return End::Failed(Failure::from_client(e)),
        };
        heard = true;
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                advance(version, &object);
                shared
                    .apply::<K>(key_of(&object), object.hold(shared.scope))
                    .await;
            }
            WatchEvent::Deleted(object) => {
                advance(version, &object);
                shared.apply::<K>(key_of(&object), None).await;
            }
            WatchEvent::Bookmark(bookmark) => {
                if !bookmark.metadata.resource_version.is_empty() {
                    *version = bookmark.metadata.resource_version;
                }
                shared.contact(K::KIND);
            }
            WatchEvent::Error(status) if status.code == 410 => return End::Gone,
            WatchEvent::Error(status) => {
                return End::Failed(Failure::from_status(&status));
            }
        }
    }
}

/// The version an event carries becomes the one to resume from.
fn advance<K: Resource>(version: &mut String, object: &K) {
    if let Some(v) = object
        .meta()
        .resource_version
        .as_deref()
        .filter(|v| !v.is_empty())
    {
        v.clone_into(version);
    }
}

/// (namespace, name): how the store keys an object.
fn key_of<K: Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Whether the API server answered `410 Gone`: the version asked from is no longer held.
fn is_gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 410)
}

/// Why a list or watch failed, and how long the API server asked us to wait.
#[derive(Debug)]
pub(super) struct Failure {
    /// What failed, for the log: never a credential (kube's errors carry none).
    pub cause: String,
    /// The API server's status code; 0 when it did not answer (or the stream broke).
    pub code: u16,
    /// `details.retryAfterSeconds` of a 429 or 5xx Status.
    pub retry_after: Option<Duration>,
}

impl Failure {
    fn new(cause: String) -> Failure {
        Failure {
            cause,
            code: 0,
            retry_after: None,
        }
    }

    /// What to look at, for the log.
    pub fn hint(&self) -> &'static str {
        match self.code {
            0 => {
                "is the API server reachable at the kubeconfig's server (--kubeconfig, or in-cluster)?"
            }
            401 => {
                "the API server refused the credentials of --kubeconfig (or the service account)"
            }
            403 => {
                "the proxy's identity may not list or watch RBAC objects: bind it to the \
                 kubelet-auth-proxy:rbac-reader ClusterRole (config/rbac.yaml); \
                 check-config --probe checks"
            }
            429 => "the API server is shedding load; the watch waits as it asks",
            _ => "the API server's own logs",
        }
    }

    fn from_client(error: kube::Error) -> Failure {
        match &error {
            kube::Error::Api(status) => Failure::from_status(status),
            _ => Failure::new(error.to_string()),
        }
    }

    fn from_status(status: &kube::core::Status) -> Failure {
        let retry_after = status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|&s| s > 0)
            .map(|s| Duration::from_secs(u64::from(s)).min(MAX_RETRY_AFTER));
        Failure {
            cause: format!(
                "the API server answered {} {}: {}",
                status.code, status.reason, status.message
            ),
            code: status.code,
            retry_after,
        }
    }
}

/// Exponential back-off with jitter: each wait is drawn from [½, 1] of the current step, so
/// nodes that failed together do not retry together.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn reset(&mut self) {
        self.failures = 0;
    }

    /// Waits the next step, or `retry_after` if the API server asked for longer.
    async fn wait(&mut self, retry_after: Option<Duration>) {
        let step = FIRST_BACKOFF
            .saturating_mul(1 << self.failures.min(16))
            .min(MAX_BACKOFF);
        self.failures = self.failures.saturating_add(1);
        let wait = step.mul_f64(0.5 + 0.5 * random_fraction());
        tokio::time::sleep(wait.max(retry_after.unwrap_or_default())).await;
    }
}

#[cfg(test)]
mod tests;
