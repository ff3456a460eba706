//! `check-config --probe`: reach what the proxy depends on, with its own credentials, before it
//! depends on them. The kubelet gets one `GET /healthz` as the proxy would send it; each API
//! server client is asked, with a SelfSubjectAccessReview, whether its identity may create the
//! reviews the proxy will send (TokenReviews for `--authentication-token-webhook`,
//! SubjectAccessReviews for a `Webhook` authorizer). Nothing else is opened and nothing is
//! written.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::metrics::{Metrics, ReviewKind};
use crate::apiserver::{ApiCallError, ApiServerClient, ApiServerSettings, failure};
use crate::config::{AuthorizerSettings, Settings};
use crate::server::shutdown::Shutdown;

/// How long each check waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// What the probe found: lines for stdout (what works) and stderr (what does not, each naming
/// the flag or file, the cause and a hint).
#[derive(Debug, Default)]
pub struct Findings {
    /// What answered as it should.
    pub working: Vec<String>,
    /// What did not, one line each.
    pub failing: Vec<String>,
}

/// Runs every check of `settings`, each to its end (one failure does not hide another).
pub async fn run(settings: Settings) -> Findings {
    let mut findings = Findings::default();
    for (settings, needs) in apiserver_checks(&settings) {
        check_apiserver(settings, &needs, &mut findings).await;
    }
    check_kubelet(settings, &mut findings).await;
    findings
}

/// One `GET /healthz` to the kubelet, as the proxy would send it.
async fn check_kubelet(settings: Settings, findings: &mut Findings) {
    let metrics = Metrics::new();
    let shutdown = Shutdown::new();
    let forwarder = crate::startup::assemble::forwarder(settings.upstream, &metrics, &shutdown);
    match tokio::time::timeout(PROBE_TIMEOUT, forwarder.probe()).await {
        Ok(Ok(status)) if status.is_success() => findings.working.push(format!(
            "probe: the kubelet answered GET /healthz with {status}"
        )),
        Ok(Ok(status)) => findings.failing.push(format!(
            "--upstream: probe: the kubelet answered GET /healthz with {status}: does it \
             authorize the proxy's client certificate (--upstream-client-cert-file)?"
        )),
        Ok(Err(e)) => findings.failing.push(format!(
            "--upstream: probe: {}",
            crate::forward::cause::diagnose(&e).detail
        )),
        Err(_) => findings.failing.push(format!(
            "--upstream: probe: no answer within {PROBE_TIMEOUT:?}"
        )),
    }
}

/// A review the proxy will create, as `(group, resource)`.
type Need = (&'static str, &'static str);

const TOKEN_REVIEWS: Need = ("authentication.k8s.io", "tokenreviews");
const ACCESS_REVIEWS: Need = ("authorization.k8s.io", "subjectaccessreviews");

/// Each API server client serving would build (the same sharing as `assemble`), with the reviews
/// it will create.
fn apiserver_checks(settings: &Settings) -> Vec<(ApiServerSettings, Vec<Need>)> {
    let mut checks: Vec<(ApiServerSettings, Vec<Need>)> = Vec::new();
    let token = settings
        .token_review
        .as_ref()
        .map(|t| (&t.apiserver, TOKEN_REVIEWS));
    let webhooks = settings
        .authorization
        .authorizers
        .iter()
        .filter_map(|a| match a {
            AuthorizerSettings::Webhook { apiserver, .. } => Some((&**apiserver, ACCESS_REVIEWS)),
            _ => None,
        });
    for (apiserver, need) in token.into_iter().chain(webhooks) {
        match checks
            .iter_mut()
            .find(|(known, _)| known.sharing_key() == apiserver.sharing_key())
        {
            Some((_, needs)) if needs.contains(&need) => {}
            Some((_, needs)) => needs.push(need),
            None => checks.push((apiserver.clone(), vec![need])),
        }
    }
    checks
}

/// Asks the API server whether this client's identity may create each of `needs`.
async fn check_apiserver(settings: ApiServerSettings, needs: &[Need], findings: &mut Findings) {
    let source = source_of(settings.sharing_key().0);
    let client = ApiServerClient::new(settings, 1, Arc::new(Metrics::new()));
    for &(group, resource) in needs {
        let asked = tokio::time::timeout(PROBE_TIMEOUT, client.may_create(group, resource)).await;
        match asked {
            Ok(Ok(status)) if status.allowed => findings.working.push(format!(
                "probe: the API server lets {source} create {resource}.{group}"
            )),
            Ok(Ok(status)) => findings.failing.push(format!(
                "{source}: probe: the API server does not let this identity create \
                 {resource}.{group}{}; bind it to system:auth-delegator (config/rbac.yaml), or \
                 use the kubelet's own identity (docs/OPERATIONS.md, \"API server credentials\")",
                if status.reason.as_deref().unwrap_or_default().is_empty() {
                    String::new()
                } else {
                    format!(" ({})", status.reason.unwrap_or_default())
                }
            )),
            // The next question would fail the same way: say it once.
            Ok(Err(e)) => {
                findings
                    .failing
                    .push(format!("{source}: probe: {e}{}", hint(&e)));
                return;
            }
            Err(_) => {
                findings.failing.push(format!(
                    "{source}: probe: the API server did not answer within {PROBE_TIMEOUT:?}"
                ));
                return;
            }
        }
    }
}

/// Where a client's credentials come from, as the operator gave them.
fn source_of(kubeconfig: Option<&Path>) -> String {
    match kubeconfig {
        Some(path) => format!("--kubeconfig {}", path.display()),
        None => "the in-cluster service account".to_owned(),
    }
}

/// What to look at for a failed SelfSubjectAccessReview: the hint the server logs for a failed
/// review, except for a 403, which here refuses the question itself, not a permission to review.
fn hint(error: &ApiCallError) -> &'static str {
    match error {
        ApiCallError::Status { code: 403, .. } => "",
        _ => failure::hint(ReviewKind::SubjectAccessReview, error),
    }
}
