//! `check-config --probe`: reach what the proxy depends on, with its own credentials, before it
//! depends on them. The kubelet gets one `GET /healthz` as the proxy would send it; each API
//! server client is asked, with a SelfSubjectAccessReview, whether its identity may create the
//! reviews the proxy will send (TokenReviews for `--authentication-token-webhook`,
//! SubjectAccessReviews for a `Webhook` authorizer), and whether it may list and watch the RBAC
//! kinds an `RBAC` authorizer watches; with `--authentication-token-webhook`, the service-account
//! issuer's public keys are fetched as the proxy will, and so are those of every JWT issuer of
//! `--authentication-config` (discovery and keys, through the configured CA). Nothing else is
//! opened and nothing is written.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::apiserver::{
    ApiCallError, ApiServerClient, ApiServerMetrics, ApiServerSettings, ReviewKind, failure,
};
use crate::authn::metrics::AuthnMetrics;
use crate::authn::service_account_keys::ServiceAccountKeys;
use crate::authn::structured::keys::{IssuerKeys, KeysMetrics};
use crate::authn::structured::validation::Validated;
use crate::base::shutdown::Shutdown;
use crate::config::{AuthorizerSettings, Settings, TokenReviewSettings};
use crate::forward::metrics::ForwardMetrics;

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
    if let Some(review) = &settings.token_review {
        check_service_account_keys(review, &mut findings).await;
    }
    if let Some(file) = &settings.authentication_config {
        check_issuers(&file.current().validated, &mut findings).await;
    }
    check_kubelet(settings, &mut findings).await;
    findings
}

/// One `GET /healthz` to the kubelet, as the proxy would send it.
async fn check_kubelet(settings: Settings, findings: &mut Findings) {
    let shutdown = Shutdown::new();
    let forwarder = crate::startup::assemble::forwarder(
        settings.upstream,
        &ForwardMetrics::default(),
        &shutdown,
    );
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

/// What the proxy will do with the API server, as `(verb, group, resource)`.
type Need = (&'static str, &'static str, &'static str);

const TOKEN_REVIEWS: Need = ("create", "authentication.k8s.io", "tokenreviews");
const ACCESS_REVIEWS: Need = ("create", "authorization.k8s.io", "subjectaccessreviews");
/// The `RBAC` authorizer lists and watches the four kinds (Roles and RoleBindings only with
/// `--pod-scoped-authz`, but a grant of all four is what config/rbac.yaml gives, and checked).
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const RBAC_READS: [Need; 8] = [
    ("list", RBAC_GROUP, "clusterroles"),
    ("watch", RBAC_GROUP, "clusterroles"),
    ("list", RBAC_GROUP, "clusterrolebindings"),
    ("watch", RBAC_GROUP, "clusterrolebindings"),
    ("list", RBAC_GROUP, "roles"),
    ("watch", RBAC_GROUP, "roles"),
    ("list", RBAC_GROUP, "rolebindings"),
    ("watch", RBAC_GROUP, "rolebindings"),
];

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
    let pods = settings.authorization.mapping.pod_scoped;
    let rbac = settings
        .authorization
        .authorizers
        .iter()
        .filter_map(|a| match a {
            AuthorizerSettings::Rbac(rbac) => Some(&rbac.apiserver),
            _ => None,
        })
        .flat_map(|apiserver| {
            let kinds = if pods {
                &RBAC_READS[..]
            } else {
                &RBAC_READS[..4]
            };
            kinds.iter().map(move |&need| (apiserver, need))
        });
    for (apiserver, need) in token.into_iter().chain(webhooks).chain(rbac) {
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
    let client = ApiServerClient::new(settings, 1, Arc::new(ApiServerMetrics::default()));
    for &(verb, group, resource) in needs {
        let asked = tokio::time::timeout(PROBE_TIMEOUT, client.may(verb, group, resource)).await;
        let fix = if group == RBAC_GROUP {
            "bind it to the kubelet-auth-proxy:rbac-reader ClusterRole (config/rbac.yaml) for \
             --authorization-mode=RBAC"
        } else {
            "bind it to system:auth-delegator (config/rbac.yaml), or use the kubelet's own \
             identity (docs/OPERATIONS.md, \"API server credentials\")"
        };
        match asked {
            Ok(Ok(status)) if status.allowed => findings.working.push(format!(
                "probe: the API server lets {source} {verb} {resource}.{group}"
            )),
            Ok(Ok(status)) => findings.failing.push(format!(
                "{source}: probe: the API server does not let this identity {verb} \
                 {resource}.{group}{}; {fix}",
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

/// Fetches the service-account issuer's keys as the proxy will, so tokens are checked on the
/// node (docs/DELEGATION.md, "Forged tokens").
async fn check_service_account_keys(review: &TokenReviewSettings, findings: &mut Findings) {
    let source = source_of(review.apiserver.sharing_key().0);
    let client = ApiServerClient::new(
        review.apiserver.clone(),
        1,
        Arc::new(ApiServerMetrics::default()),
    );
    let keys = ServiceAccountKeys::new(
        client,
        review.service_account_issuers.clone(),
        review.local_audiences.clone(),
        Arc::new(AuthnMetrics::register(
            &mut prometheus_client::registry::Registry::default(),
        )),
    );
    match tokio::time::timeout(PROBE_TIMEOUT, keys.fetch()).await {
        Ok(Ok(count)) => findings.working.push(format!(
            "probe: {source} fetched {count} public key(s) of the service-account issuer {}:              its tokens are checked on the node before any TokenReview",
            keys.issuers().join(", ")
        )),
        Ok(Err(e)) => findings.failing.push(format!(
            "{source}: probe: cannot fetch the service-account issuer's keys: {e}; {}; until              then every token goes to TokenReview, forged ones included",
            e.hint()
        )),
        Err(_) => findings.failing.push(format!(
            "{source}: probe: the service-account issuer's keys did not come within              {PROBE_TIMEOUT:?}"
        )),
    }
}

/// Fetches each JWT issuer's discovery document and keys as the proxy will, with the CA the
/// file gives it.
async fn check_issuers(config: &Validated, findings: &mut Findings) {
    let metrics = KeysMetrics::register(&mut prometheus_client::registry::Registry::default());
    for (i, jwt) in config.jwt.iter().enumerate() {
        let at = format!("--authentication-config: jwt[{i}] {}", jwt.source.url);
        let keys = match IssuerKeys::new(jwt.source.clone(), metrics.clone()) {
            Ok(keys) => keys,
            Err(e) => {
                findings.failing.push(format!("{at}: {e}"));
                continue;
            }
        };
        match tokio::time::timeout(PROBE_TIMEOUT, keys.probe()).await {
            Ok(Ok(report)) => findings.working.push(format!("probe: {at}: {report}")),
            Ok(Err(e)) => findings.failing.push(format!(
                "{at}: probe: {}; {}; until the keys can be fetched, its tokens are refused with 401",
                with_causes(&e),
                e.hint()
            )),
            Err(_) => findings.failing.push(format!(
                "{at}: probe: the discovery document and keys did not come within {PROBE_TIMEOUT:?}"
            )),
        }
    }
}

/// An error and every cause under it, `: `-separated, each said once (a library's error often
/// repeats its cause's text).
fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let said = inner.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = inner.source();
    }
    text
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
