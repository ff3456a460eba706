//! A stand-in Kubernetes API server for the delegated-auth scenarios: the handle a test drives
//! ([`ApiServer`]: tokens, rules, faults, holds, the kubeconfigs it writes) and the record of every
//! review received; TokenReview is in `tokens`, SubjectAccessReview in `access`, HTTPS in `serve`,
//! the RBAC objects an RBAC authorizer lists and watches (and their faults) in `rbac`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::pki::{Authority, CertSpec};
use super::{TempDir, within};

mod access;
pub mod issuer;
mod rbac;
#[cfg(test)]
mod rbac_tests;
mod serve;
#[cfg(test)]
mod tests;
mod tokens;

pub use access::{AccessReview, Verdict};
pub use rbac::{RbacKind, RbacRequest, RbacVerb};
use serve::{kind_name, spawn};
pub use tokens::TokenUser;
use tokens::TokenVerdict;

/// Where the proxy posts TokenReviews.
pub const TOKEN_REVIEWS_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// Where the proxy posts SubjectAccessReviews.
pub const ACCESS_REVIEWS_PATH: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
/// Where a caller asks what it may do itself (`kubectl auth can-i`).
pub const SELF_ACCESS_REVIEWS_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
/// The audiences the API server assumes when a TokenReview names none (its `--api-audiences`,
/// by default the service-account issuer).
pub const API_AUDIENCES: &[&str] = &["https://kubernetes.default.svc.cluster.local"];
/// The error the API server's bearer-token authenticator gives a token nobody issued.
pub const UNKNOWN_TOKEN_ERROR: &str = "invalid bearer token";
/// The common name of the client certificate in a [`Flavour::ClientCertificate`] kubeconfig.
pub const PROXY_IDENTITY: &str = "system:kubelet-auth-proxy";

/// The largest request body the stand-in reads (the real server's limit is 3 MiB).
const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;
/// Bounds a TLS handshake so a stalled client cannot keep a task alive.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Size of each chunk of an oversized body.
const PADDING_CHUNK: usize = 64 * 1024;

/// The two kinds of review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `authentication.k8s.io/v1` TokenReview.
    TokenReview,
    /// `authorization.k8s.io/v1` SubjectAccessReview.
    SubjectAccessReview,
}

/// Which calls a fault or a hold applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Only calls of this kind.
    Only(Kind),
    /// Calls of either kind.
    Both,
}

impl Target {
    fn matches(self, kind: Kind) -> bool {
        match self {
            Target::Only(k) => k == kind,
            Target::Both => true,
        }
    }
}

impl From<Kind> for Target {
    fn from(kind: Kind) -> Target {
        Target::Only(kind)
    }
}

/// How the proxy authenticates to the stand-in; one kubeconfig flavour each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `client-certificate` / `client-key`: a certificate for [`PROXY_IDENTITY`] from the test CA.
    ClientCertificate,
    /// `token`: a bearer token the stand-in accepts from its callers.
    Token,
}

/// How a call authenticated to the stand-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A verified client certificate with this common name.
    Certificate(String),
    /// The caller token of the [`Flavour::Token`] kubeconfig.
    Token,
}

/// A fault the stand-in answers with instead of (or before) its normal answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `500` with an `InternalError` Status.
    InternalError,
    /// `429` with a `TooManyRequests` Status, a `Retry-After` header and
    /// `details.retryAfterSeconds`.
    TooManyRequests {
        /// The delay asked for, in seconds.
        retry_after_seconds: u32,
    },
    /// `503` with a `ServiceUnavailable` Status and no `Retry-After`.
    ServiceUnavailable,
    /// `403` with a `Forbidden` Status: the caller may not create reviews.
    Forbidden,
    /// The normal answer, after this delay.
    Slow(Duration),
    /// `201` whose JSON body stops in the middle.
    MalformedJson,
    /// `201` with the normal answer padded (in `metadata.annotations`) to about this many bytes,
    /// streamed in chunks.
    Oversized {
        /// Total body size.
        bytes: usize,
    },
}

/// Decides SubjectAccessReviews.
type Rules = Arc<dyn Fn(&AccessReview) -> Verdict + Send + Sync>;

/// Decides TokenReviews of tokens not added one by one: the user, or the rejection's error.
type TokenRule = Arc<dyn Fn(&str) -> Result<TokenUser, String> + Send + Sync>;

/// One answered call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// What was asked.
    pub kind: Kind,
    /// Who asked (`None`: unauthenticated, answered 401).
    pub caller: Option<Caller>,
    /// The serial number of the caller's client certificate, if it presented one: which of two
    /// certificates for the same name was used.
    pub serial: Option<String>,
    /// The status code answered.
    pub status: u16,
    /// When it arrived.
    pub arrived: std::time::Instant,
    /// When its answer was ready (the in-flight interval of the call ends here).
    pub answered: std::time::Instant,
}

/// A fault waiting to be served.
struct Pending {
    target: Target,
    fault: Fault,
    remaining: usize,
}

/// Everything the tests set and read, shared with the connection tasks.
struct State {
    tokens: BTreeMap<String, TokenVerdict>,
    token_rule: Option<TokenRule>,
    rules: Rules,
    faults: Vec<Pending>,
    hold: Option<(Target, watch::Receiver<bool>)>,
    arrivals: BTreeMap<&'static str, usize>,
    calls: Vec<Call>,
    token_reviews: Vec<Value>,
    access_reviews: Vec<Value>,
    /// `(group, resource)` its callers may `create`, as SelfSubjectAccessReviews answer.
    caller_may_create: Vec<(String, String)>,
    /// Whether its callers may `list` and `watch` the four RBAC kinds, as SelfSubjectAccessReviews
    /// answer (config/rbac.yaml's reader role; the lists and watches are answered either way).
    caller_may_read_rbac: bool,
    /// RBAC objects, their watches and their faults.
    rbac: rbac::Store,
    /// The service-account issuer: its keys and discovery documents.
    issuer: issuer::Issuer,
}

impl State {
    fn take_fault(&mut self, kind: Kind) -> Option<Fault> {
        let index = self
            .faults
            .iter()
            .position(|p| p.remaining > 0 && p.target.matches(kind))?;
        let pending = &mut self.faults[index];
        pending.remaining -= 1;
        let fault = pending.fault.clone();
        if pending.remaining == 0 {
            self.faults.remove(index);
        }
        Some(fault)
    }
}

/// Shared between the handle and the connection tasks.
struct Shared {
    state: Mutex<State>,
    caller_token: String,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock is already a failed test; keep serving what is left.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps calls of a target waiting until [`Gate::release`] or drop.
pub struct Gate {
    open: watch::Sender<bool>,
}

impl Gate {
    /// Lets the held calls (and later ones) through.
    pub fn release(self) {}
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open.send_replace(true);
    }
}

/// A running stand-in API server. Stops when dropped.
pub struct ApiServer {
    ca: Authority,
    dir: TempDir,
    addr: SocketAddr,
    tls: Arc<ServerConfig>,
    shared: Arc<Shared>,
    running: Option<Running>,
}

/// The accept loop of a listening stand-in and its stop signal.
struct Running {
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl ApiServer {
    /// [`ApiServer::start`], then rules that allow every review: the stand-in of a scenario about
    /// something other than who may do what.
    pub async fn start_allowing() -> ApiServer {
        let api = ApiServer::start().await;
        api.set_rules(|_| Verdict::allow());
        api
    }

    /// Starts on `127.0.0.1:<free port>` with its own CA, no tokens, and rules that have no
    /// opinion about anything.
    pub async fn start() -> ApiServer {
        let ca = Authority::root("stand-in kube-apiserver CA");
        let serving = ca.issue(&CertSpec::server());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert().clone()).unwrap();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .unwrap();
        let mut tls = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(serving.chain.clone(), serving.key())
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let listener = within(
            "binding the stand-in API server",
            TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)),
        )
        .await
        .unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                tokens: BTreeMap::new(),
                token_rule: None,
                rules: Arc::new(|_: &AccessReview| Verdict::no_opinion()),
                faults: Vec::new(),
                hold: None,
                arrivals: BTreeMap::new(),
                calls: Vec::new(),
                token_reviews: Vec::new(),
                access_reviews: Vec::new(),
                // What system:auth-delegator grants.
                caller_may_create: vec![
                    ("authentication.k8s.io".into(), "tokenreviews".into()),
                    ("authorization.k8s.io".into(), "subjectaccessreviews".into()),
                ],
                caller_may_read_rbac: true,
                rbac: rbac::Store::default(),
                issuer: issuer::Issuer::default(),
            }),
            caller_token: format!("stand-in-caller-{}", addr.port()),
        });
        let tls = Arc::new(tls);
        let running = spawn(listener, TlsAcceptor::from(tls.clone()), shared.clone());
        ApiServer {
            ca,
            dir: TempDir::new("apiserver"),
            addr,
            tls,
            shared,
            running: Some(running),
        }
    }

    /// The address it listens on (kept across [`ApiServer::stop`] and [`ApiServer::restart`]).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that signed its serving certificate and the client certificates it accepts.
    pub fn ca(&self) -> &Authority {
        &self.ca
    }

    /// The bearer token its callers may use instead of a client certificate.
    pub fn caller_token(&self) -> &str {
        &self.shared.caller_token
    }

    /// Writes a kubeconfig of this flavour (`server: https://127.0.0.1:<port>`, the CA as a file)
    /// and returns its path.
    pub fn kubeconfig(&self, flavour: Flavour) -> PathBuf {
        let ca = self.dir.write("ca.crt", self.ca.pem());
        let user = match flavour {
            Flavour::ClientCertificate => {
                let identity = self.ca.issue(&CertSpec::client(PROXY_IDENTITY));
                let cert = self.dir.write("proxy.crt", identity.chain_pem());
                let key = self.dir.write("proxy.key", identity.key_pem());
                format!(
                    "    client-certificate: {}\n    client-key: {}\n",
                    cert.display(),
                    key.display()
                )
            }
            Flavour::Token => format!("    token: {}\n", self.caller_token()),
        };
        let name = match flavour {
            Flavour::ClientCertificate => "kubeconfig-cert.yaml",
            Flavour::Token => "kubeconfig-token.yaml",
        };
        self.dir.write(
            name,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: stand-in
  cluster:
    server: https://{addr}
    certificate-authority: {ca}
users:
- name: kubelet-auth-proxy
  user:
{user}contexts:
- name: stand-in
  context:
    cluster: stand-in
    user: kubelet-auth-proxy
current-context: stand-in
",
                addr = self.addr,
                ca = ca.display(),
            ),
        )
    }

    /// A service-account token with `claims`, signed by the issuer's current key, named by its
    /// key id (or by `kid`, to name a key that was never published).
    pub fn sign_token(&self, claims: &Value, kid: Option<&str>) -> String {
        self.shared.lock().issuer.sign(claims, kid)
    }

    /// A new key signs from now on and is published; with `retire`, the old keys are withdrawn.
    pub fn rotate_keys(&self, retire: bool) {
        self.shared.lock().issuer.rotate(retire);
    }

    /// How many times the issuer's keys (`/openid/v1/jwks`) were fetched.
    pub fn jwks_fetches(&self) -> usize {
        self.shared.lock().issuer.jwks_fetches
    }

    /// Whether the issuer's discovery documents answer 403, as for a caller not bound to
    /// `system:service-account-issuer-discovery`.
    pub fn set_issuer_discovery_forbidden(&self, forbidden: bool) {
        self.shared.lock().issuer.forbidden = forbidden;
    }

    /// Whether its callers may `list` and `watch` RBAC objects, in the answers to
    /// SelfSubjectAccessReviews (by default they may).
    pub fn set_caller_may_read_rbac(&self, allowed: bool) {
        self.shared.lock().caller_may_read_rbac = allowed;
    }

    /// What its callers may `create`, as `(group, resource)`, in the answers to
    /// SelfSubjectAccessReviews (by default: tokenreviews and subjectaccessreviews, as
    /// `system:auth-delegator` grants). The reviews themselves are answered either way.
    pub fn set_caller_may_create(&self, allowed: &[(&str, &str)]) {
        self.shared.lock().caller_may_create = allowed
            .iter()
            .map(|(group, resource)| ((*group).to_owned(), (*resource).to_owned()))
            .collect();
    }

    /// TokenReview authenticates `token` as `user` (for the audiences `user` names).
    pub fn add_token(&self, token: &str, user: TokenUser) {
        self.shared
            .lock()
            .tokens
            .insert(token.to_owned(), TokenVerdict::Authenticated(user));
    }

    /// TokenReview answers `authenticated: false` for `token` with this `status.error` (omitted
    /// when empty: "not authenticated" without an error).
    pub fn reject_token(&self, token: &str, error: &str) {
        self.shared.lock().tokens.insert(
            token.to_owned(),
            TokenVerdict::Rejected {
                error: error.to_owned(),
            },
        );
    }

    /// Decides TokenReviews of tokens neither added nor rejected one by one with `rule`:
    /// `Ok(user)` authenticates, `Err(error)` rejects with that `status.error` ("" for a quiet
    /// rejection). For scenarios that need more distinct tokens than a table should hold.
    pub fn set_token_rule(
        &self,
        rule: impl Fn(&str) -> Result<TokenUser, String> + Send + Sync + 'static,
    ) {
        self.shared.lock().token_rule = Some(Arc::new(rule));
    }

    /// Decides every later SubjectAccessReview with `rules`.
    pub fn set_rules(&self, rules: impl Fn(&AccessReview) -> Verdict + Send + Sync + 'static) {
        self.shared.lock().rules = Arc::new(rules);
    }

    /// The next `count` calls matching `target` are answered with `fault`; faults queue up in
    /// the order they were injected.
    pub fn inject(&self, target: impl Into<Target>, fault: Fault, count: usize) {
        if count > 0 {
            self.shared.lock().faults.push(Pending {
                target: target.into(),
                fault,
                remaining: count,
            });
        }
    }

    /// Drops the faults not served yet.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// Holds every call matching `target` (counted on arrival, answered only when the gate
    /// opens), until the returned gate is released or dropped.
    pub fn hold(&self, target: impl Into<Target>) -> Gate {
        let (open, rx) = watch::channel(false);
        self.shared.lock().hold = Some((target.into(), rx));
        Gate { open }
    }

    /// Calls of `kind` that arrived (authenticated or not, answered or still in progress).
    pub fn arrivals(&self, kind: Kind) -> usize {
        self.shared
            .lock()
            .arrivals
            .get(kind_name(kind))
            .copied()
            .unwrap_or(0)
    }

    /// Every answered call, in the order answered.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// The status codes answered to calls of `kind`, in order.
    pub fn statuses(&self, kind: Kind) -> Vec<u16> {
        self.calls()
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.status)
            .collect()
    }

    /// The `spec` of every TokenReview received from an authenticated caller, in order of
    /// arrival, whatever it was answered with (faults included).
    pub fn token_reviews(&self) -> Vec<Value> {
        self.shared.lock().token_reviews.clone()
    }

    /// The `spec` of every SubjectAccessReview received from an authenticated caller, in order
    /// of arrival, whatever it was answered with (faults included).
    pub fn access_reviews(&self) -> Vec<Value> {
        self.shared.lock().access_reviews.clone()
    }

    /// Waits (bounded) until at least `n` calls of `kind` have arrived.
    pub async fn wait_for_arrivals(&self, kind: Kind, n: usize) {
        within(&format!("waiting for {n} {kind:?} calls"), async {
            while self.arrivals(kind) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    /// Every RBAC list and watch request, in order of arrival (refused ones included).
    pub fn rbac_requests(&self) -> Vec<RbacRequest> {
        self.shared.lock().rbac.requests.clone()
    }

    /// How many lists of `kind` were started (first pages only: a paged list counts once).
    pub fn rbac_lists(&self, kind: RbacKind) -> usize {
        self.shared
            .lock()
            .rbac
            .requests
            .iter()
            .filter(|r| r.kind == kind && r.verb == RbacVerb::List && !r.continued)
            .count()
    }

    /// The resourceVersion each watch of `kind` asked to start from, in order of arrival.
    pub fn rbac_watches(&self, kind: RbacKind) -> Vec<String> {
        self.shared
            .lock()
            .rbac
            .requests
            .iter()
            .filter(|r| r.kind == kind && r.verb == RbacVerb::Watch)
            .map(|r| r.resource_version.clone())
            .collect()
    }

    /// Waits (bounded) until at least `n` watches of `kind` have arrived. An accepted watch that
    /// arrived misses no change made after this returns: it replays it or receives it live.
    pub async fn wait_for_rbac_watches(&self, kind: RbacKind, n: usize) {
        within(&format!("waiting for {n} {kind:?} watches"), async {
            while self.rbac_watches(kind).len() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    /// Stops listening and drops every connection: new connections are refused.
    pub async fn stop(&mut self) {
        let running = self
            .running
            .take()
            .expect("the stand-in API server is running");
        running.stop.send_replace(true);
        within("stopping the stand-in API server", running.accept)
            .await
            .unwrap();
    }

    /// Listens again on the same address, with the same tokens, rules and records.
    pub async fn restart(&mut self) {
        assert!(self.running.is_none(), "the stand-in API server is running");
        let listener = within(
            "rebinding the stand-in API server",
            TcpListener::bind(self.addr),
        )
        .await
        .unwrap();
        self.running = Some(spawn(
            listener,
            TlsAcceptor::from(self.tls.clone()),
            self.shared.clone(),
        ));
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.send_replace(true);
        }
    }
}
