//! A stand-in Kubernetes API server for the delegated-auth scenarios: TokenReview and
//! SubjectAccessReview over HTTPS (HTTP/1.1 and h2) in the real wire format, with tokens and
//! authorization rules set per test, a record of every review received, and faults on demand.
//!
//! It answers as kube-apiserver does: `201 Created` with the review echoing its `spec` and a
//! `status` filled the way the TokenReview and SubjectAccessReview REST storage fill it, and
//! `Status` objects (`{"kind":"Status",…,"reason":…,"code":…}`) for every error. Its callers
//! authenticate with a client certificate from the test CA or with a bearer token, the two
//! flavours of kubeconfig it writes for the proxy's `--kubeconfig`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use x509_parser::prelude::FromDer;

use super::pki::{Authority, CertSpec};
use super::{TempDir, within};

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

/// A user as TokenReview's `status.user` carries it, and the audiences its token is good for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUser {
    /// `username`.
    pub username: String,
    /// `uid` (omitted when empty).
    pub uid: String,
    /// `groups`, in order.
    pub groups: Vec<String>,
    /// `extra`.
    pub extra: BTreeMap<String, Vec<String>>,
    /// Audiences the token was issued for; by default [`API_AUDIENCES`].
    pub audiences: Vec<String>,
}

impl TokenUser {
    /// `username`, with the groups the API server always adds (`system:authenticated`).
    pub fn new(username: &str) -> TokenUser {
        TokenUser {
            username: username.to_owned(),
            uid: String::new(),
            groups: vec!["system:authenticated".to_owned()],
            extra: BTreeMap::new(),
            audiences: API_AUDIENCES.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    /// Replaces the groups, exactly as given.
    pub fn groups(mut self, groups: &[&str]) -> TokenUser {
        self.groups = groups.iter().map(|g| (*g).to_owned()).collect();
        self
    }

    /// Sets the uid.
    pub fn uid(mut self, uid: &str) -> TokenUser {
        self.uid = uid.to_owned();
        self
    }

    /// Adds an extra value.
    pub fn extra(mut self, key: &str, values: &[&str]) -> TokenUser {
        self.extra.insert(
            key.to_owned(),
            values.iter().map(|v| (*v).to_owned()).collect(),
        );
        self
    }

    /// Sets the audiences the token is good for.
    pub fn audiences(mut self, audiences: &[&str]) -> TokenUser {
        self.audiences = audiences.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    fn user_json(&self) -> Value {
        let mut user = Map::new();
        user.insert("username".into(), json!(self.username));
        if !self.uid.is_empty() {
            user.insert("uid".into(), json!(self.uid));
        }
        if !self.groups.is_empty() {
            user.insert("groups".into(), json!(self.groups));
        }
        if !self.extra.is_empty() {
            user.insert("extra".into(), json!(self.extra));
        }
        Value::Object(user)
    }
}

/// What TokenReview says about one token.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TokenVerdict {
    Authenticated(TokenUser),
    Rejected { error: String },
}

/// A SubjectAccessReview's `spec`, parsed for the rules to decide on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessReview {
    /// `spec.user`.
    pub user: String,
    /// `spec.uid`.
    pub uid: String,
    /// `spec.groups`.
    pub groups: Vec<String>,
    /// `spec.extra`.
    pub extra: BTreeMap<String, Vec<String>>,
    /// `resourceAttributes.verb` ("" when omitted).
    pub verb: String,
    /// `resourceAttributes.namespace` ("" when omitted).
    pub namespace: String,
    /// `resourceAttributes.resource`.
    pub resource: String,
    /// `resourceAttributes.subresource`.
    pub subresource: String,
    /// `resourceAttributes.name`.
    pub name: String,
}

impl AccessReview {
    fn parse(spec: &Value) -> AccessReview {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let list = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|items| items.iter().map(text).collect())
                .unwrap_or_default()
        };
        let attributes = &spec["resourceAttributes"];
        AccessReview {
            user: text(&spec["user"]),
            uid: text(&spec["uid"]),
            groups: list(&spec["groups"]),
            extra: spec["extra"]
                .as_object()
                .map(|extra| extra.iter().map(|(k, v)| (k.clone(), list(v))).collect())
                .unwrap_or_default(),
            verb: text(&attributes["verb"]),
            namespace: text(&attributes["namespace"]),
            resource: text(&attributes["resource"]),
            subresource: text(&attributes["subresource"]),
            name: text(&attributes["name"]),
        }
    }
}

/// A SubjectAccessReview's `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `status.allowed`.
    pub allowed: bool,
    /// `status.denied` (omitted when false).
    pub denied: bool,
    /// `status.reason` (omitted when empty).
    pub reason: String,
}

impl Verdict {
    /// Allowed, with RBAC's kind of reason.
    pub fn allow() -> Verdict {
        Verdict {
            allowed: true,
            denied: false,
            reason: "RBAC: allowed by the stand-in's rules".to_owned(),
        }
    }

    /// Explicitly denied.
    pub fn deny() -> Verdict {
        Verdict {
            allowed: false,
            denied: true,
            reason: "denied by the stand-in's rules".to_owned(),
        }
    }

    /// Neither allowed nor denied.
    pub fn no_opinion() -> Verdict {
        Verdict {
            allowed: false,
            denied: false,
            reason: String::new(),
        }
    }

    /// Both allowed and denied: a response the webhook authorizer must treat as an error.
    pub fn allowed_and_denied() -> Verdict {
        Verdict {
            allowed: true,
            denied: true,
            reason: "contradictory".to_owned(),
        }
    }

    fn status_json(&self) -> Value {
        let mut status = Map::new();
        status.insert("allowed".into(), json!(self.allowed));
        if self.denied {
            status.insert("denied".into(), json!(true));
        }
        if !self.reason.is_empty() {
            status.insert("reason".into(), json!(self.reason));
        }
        Value::Object(status)
    }
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

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::TokenReview => "TokenReview",
        Kind::SubjectAccessReview => "SubjectAccessReview",
    }
}

fn spawn(listener: TcpListener, acceptor: TlsAcceptor, shared: Arc<Shared>) -> Running {
    let (stop, stop_rx) = watch::channel(false);
    let accept = tokio::spawn(accept_loop(listener, acceptor, shared, stop_rx));
    Running { stop, accept }
}

/// Accepts connections until told to stop, then aborts its connections and waits for them to
/// be gone, so a stopped stand-in holds no socket open.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    connections.spawn(serve(tcp, acceptor.clone(), shared.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    drop(listener);
    connections.shutdown().await;
}

async fn serve(tcp: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
        return;
    };
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first());
    let certificate = leaf.and_then(|leaf| common_name(leaf));
    let serial = leaf.map(|leaf| crate::support::pki::serial_of(leaf));
    let service = service_fn(move |req| {
        let shared = shared.clone();
        let (certificate, serial) = (certificate.clone(), serial.clone());
        async move { Ok::<_, Infallible>(handle(req, &shared, certificate, serial).await) }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// The subject's CN of a certificate rustls already verified.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

type ResponseBody = BoxBody<Bytes, Infallible>;

async fn handle(
    req: Request<Incoming>,
    shared: &Shared,
    certificate: Option<String>,
    serial: Option<String>,
) -> Response<ResponseBody> {
    let kind = match req.uri().path() {
        SELF_ACCESS_REVIEWS_PATH => return self_review(req, shared, certificate).await,
        TOKEN_REVIEWS_PATH => Kind::TokenReview,
        ACCESS_REVIEWS_PATH => Kind::SubjectAccessReview,
        _ => {
            return status_response(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
                None,
            );
        }
    };
    if req.method() != Method::POST {
        return status_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            &format!(
                "the server does not allow this method on the requested resource ({})",
                req.method()
            ),
            None,
        );
    }
    let hold = {
        let mut state = shared.lock();
        *state.arrivals.entry(kind_name(kind)).or_default() += 1;
        state
            .hold
            .as_ref()
            .filter(|(target, _)| target.matches(kind))
            .map(|(_, rx)| rx.clone())
    };
    let caller = certificate.map(Caller::Certificate).or_else(|| {
        let expected = format!("Bearer {}", shared.caller_token);
        let presented = req.headers().get(AUTHORIZATION)?;
        (presented.as_bytes() == expected.as_bytes()).then_some(Caller::Token)
    });
    let arrived = std::time::Instant::now();
    let response = answer(req, kind, caller.is_some(), shared, hold).await;
    shared.lock().calls.push(Call {
        kind,
        caller,
        serial,
        status: response.status().as_u16(),
        arrived,
        answered: std::time::Instant::now(),
    });
    response
}

/// A SelfSubjectAccessReview: may the caller itself `create` the resource asked about?
async fn self_review(
    req: Request<Incoming>,
    shared: &Shared,
    certificate: Option<String>,
) -> Response<ResponseBody> {
    let token = format!("Bearer {}", shared.caller_token);
    let by_token = req
        .headers()
        .get(AUTHORIZATION)
        .is_some_and(|presented| presented.as_bytes() == token.as_bytes());
    if req.method() != Method::POST || (certificate.is_none() && !by_token) {
        return status_response(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        );
    }
    let Ok(body) = Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    else {
        return status_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            "the request body is too large",
            None,
        );
    };
    let review: Value = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
    let attributes = &review["spec"]["resourceAttributes"];
    let field = |name: &str| attributes[name].as_str().unwrap_or_default().to_owned();
    let allowed = field("verb") == "create"
        && shared
            .lock()
            .caller_may_create
            .contains(&(field("group"), field("resource")));
    let status = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"kubelet-auth-proxy:auth-delegator\""})
    } else {
        json!({"allowed": false})
    };
    json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": review["spec"],
            "status": status,
        }),
    )
}

async fn answer(
    req: Request<Incoming>,
    kind: Kind,
    authenticated: bool,
    shared: &Shared,
    hold: Option<watch::Receiver<bool>>,
) -> Response<ResponseBody> {
    if !authenticated {
        return status_response(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        );
    }
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return status_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                "the request body is too large",
                None,
            );
        }
    };
    // Every review received is recorded, whatever it is answered with.
    if let Some(spec) = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|review| review.get("spec").cloned())
    {
        let mut state = shared.lock();
        match kind {
            Kind::TokenReview => state.token_reviews.push(spec),
            Kind::SubjectAccessReview => state.access_reviews.push(spec),
        }
    }
    if let Some(mut open) = hold {
        let _ = open.wait_for(|open| *open).await;
    }
    let fault = shared.lock().take_fault(kind);
    if let Some(Fault::Slow(delay)) = &fault {
        tokio::time::sleep(*delay).await;
    }
    match fault {
        Some(Fault::InternalError) => {
            return status_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: injected by the stand-in",
                Some(json!({"causes": [{"message": "injected by the stand-in"}]})),
            );
        }
        Some(Fault::TooManyRequests {
            retry_after_seconds,
        }) => {
            let mut response = status_response(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "Too many requests, please try again later.",
                Some(json!({"retryAfterSeconds": retry_after_seconds})),
            );
            response
                .headers_mut()
                .insert(RETRY_AFTER, retry_after_seconds.into());
            return response;
        }
        Some(Fault::ServiceUnavailable) => {
            return status_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
                None,
            );
        }
        Some(Fault::Forbidden) => {
            let (resource, group) = match kind {
                Kind::TokenReview => ("tokenreviews", "authentication.k8s.io"),
                Kind::SubjectAccessReview => ("subjectaccessreviews", "authorization.k8s.io"),
            };
            return status_response(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{resource}.{group} is forbidden: User \"{PROXY_IDENTITY}\" cannot create \
                     resource \"{resource}\" in API group \"{group}\" at the cluster scope"
                ),
                Some(json!({"group": group, "kind": resource})),
            );
        }
        Some(Fault::MalformedJson) => {
            return json_bytes(
                StatusCode::CREATED,
                Bytes::from_static(b"{\"kind\":\"TokenReview\",\"apiVersion\":\"authen"),
            );
        }
        _ => {}
    }
    let (status, review) = match kind {
        Kind::TokenReview => review_token(&body, shared),
        Kind::SubjectAccessReview => review_access(&body, shared),
    };
    match fault {
        Some(Fault::Oversized { bytes }) if status == StatusCode::CREATED => {
            oversized(status, review, bytes)
        }
        _ => json_response(status, &review),
    }
}

/// Decodes a review body as the API server's decoder does: JSON, and when `kind`/`apiVersion`
/// are given they must be the endpoint's.
fn decode(body: &[u8], kind: &str, api_version: &str) -> Result<Value, (StatusCode, Value)> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        status_json(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("the object provided is unrecognized: {e}"),
            None,
        )
    })?;
    if !value.is_object() {
        return Err(status_json(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the object provided is not an object",
            None,
        ));
    }
    for (field, expected) in [("kind", kind), ("apiVersion", api_version)] {
        if let Some(given) = value.get(field)
            && given != expected
        {
            return Err(status_json(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("{field} {given} does not match the expected {expected}"),
                None,
            ));
        }
    }
    Ok(value)
}

/// TokenReview's REST storage: an empty token is a 400; the token is checked against the
/// requested audiences (the API audiences when none); the status says who it is.
fn review_token(body: &[u8], shared: &Shared) -> (StatusCode, Value) {
    let review = match decode(body, "TokenReview", "authentication.k8s.io/v1") {
        Ok(review) => review,
        Err(error) => return error,
    };
    let spec = &review["spec"];
    let token = spec["token"].as_str().unwrap_or_default();
    let requested: Vec<String> = spec["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    let state = shared.lock();
    if token.is_empty() {
        return status_json(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "token is required for TokenReview in authentication",
            None,
        );
    }
    let wanted: Vec<String> = if requested.is_empty() {
        API_AUDIENCES.iter().map(|a| (*a).to_owned()).collect()
    } else {
        requested.clone()
    };
    let mut status = Map::new();
    let verdict = state.tokens.get(token).cloned().or_else(|| {
        state.token_rule.as_ref().map(|rule| match rule(token) {
            Ok(user) => TokenVerdict::Authenticated(user),
            Err(error) => TokenVerdict::Rejected { error },
        })
    });
    match &verdict {
        Some(TokenVerdict::Authenticated(user)) => {
            let audiences: Vec<&String> = user
                .audiences
                .iter()
                .filter(|a| wanted.contains(a))
                .collect();
            if audiences.is_empty() {
                status.insert("user".into(), json!({}));
                status.insert(
                    "error".into(),
                    json!(format!(
                        "[{UNKNOWN_TOKEN_ERROR}, token audiences {} is invalid for the target \
                         audiences {}]",
                        go_quoted(&user.audiences),
                        go_quoted(&wanted)
                    )),
                );
            } else {
                status.insert("authenticated".into(), json!(true));
                status.insert("user".into(), user.user_json());
                status.insert("audiences".into(), json!(audiences));
            }
        }
        Some(TokenVerdict::Rejected { error }) => {
            status.insert("user".into(), json!({}));
            if !error.is_empty() {
                status.insert("error".into(), json!(error));
            }
        }
        None => {
            status.insert("user".into(), json!({}));
            status.insert("error".into(), json!(UNKNOWN_TOKEN_ERROR));
        }
    }
    let mut echoed = Map::new();
    echoed.insert("token".into(), json!(token));
    if !requested.is_empty() {
        echoed.insert("audiences".into(), json!(requested));
    }
    (
        StatusCode::CREATED,
        json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": echoed,
            "status": status,
        }),
    )
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// SubjectAccessReview's REST storage: the spec is validated as the API server validates it,
/// then decided by the test's rules.
fn review_access(body: &[u8], shared: &Shared) -> (StatusCode, Value) {
    let review = match decode(body, "SubjectAccessReview", "authorization.k8s.io/v1") {
        Ok(review) => review,
        Err(error) => return error,
    };
    let spec = review["spec"].clone();
    let rules = shared.lock().rules.clone();
    let has_resource = spec.get("resourceAttributes").is_some();
    let has_non_resource = spec.get("nonResourceAttributes").is_some();
    let parsed = AccessReview::parse(&spec);
    let problem = if has_resource == has_non_resource {
        Some(
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of \
             nonResourceAttributes or resourceAttributes must be specified",
        )
    } else if parsed.user.is_empty() && parsed.groups.is_empty() {
        Some("spec.user: Invalid value: \"\": at least one of user or group must be specified")
    } else {
        None
    };
    if let Some(problem) = problem {
        return status_json(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {problem}"),
            Some(json!({"group": "authorization.k8s.io", "kind": "SubjectAccessReview"})),
        );
    }
    let verdict = rules(&parsed);
    (
        StatusCode::CREATED,
        json!({
            "kind": "SubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": verdict.status_json(),
        }),
    )
}

/// A `Status` object as the API server writes it for an error.
fn status_json(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> (StatusCode, Value) {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    (code, status)
}

fn status_response(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Response<ResponseBody> {
    let (code, status) = status_json(code, reason, message, details);
    json_response(code, &status)
}

fn json_response(code: StatusCode, value: &Value) -> Response<ResponseBody> {
    json_bytes(code, Bytes::from(serde_json::to_vec(value).unwrap()))
}

fn json_bytes(code: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

/// The review with a `metadata.annotations` entry long enough to make the body about `bytes`
/// long, streamed chunk by chunk so the stand-in never holds it whole.
fn oversized(code: StatusCode, mut review: Value, bytes: usize) -> Response<ResponseBody> {
    const MARKER: &str = "@@padding@@";
    review["metadata"] = json!({"annotations": {"padding": MARKER}});
    let text = serde_json::to_string(&review).unwrap();
    let (before, after) = text.split_once(MARKER).unwrap();
    let padding = bytes.saturating_sub(text.len() - MARKER.len());
    let body = Padded {
        prefix: Some(Bytes::from(before.to_owned())),
        remaining: padding,
        suffix: Some(Bytes::from(after.to_owned())),
    };
    let mut response = Response::new(body.boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

/// A body made of a prefix, `remaining` bytes of `a`, and a suffix.
struct Padded {
    prefix: Option<Bytes>,
    remaining: usize,
    suffix: Option<Bytes>,
}

impl http_body::Body for Padded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        static CHUNK: [u8; PADDING_CHUNK] = [b'a'; PADDING_CHUNK];
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if self.remaining > 0 {
            let n = self.remaining.min(PADDING_CHUNK);
            self.remaining -= n;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK[..n])))));
        }
        Poll::Ready(self.suffix.take().map(|suffix| Ok(Frame::data(suffix))))
    }
}

/// Connection errors a test may want to tell apart.
pub fn is_connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::client::{Client, Identity, Reply, request};
    use http_body_util::Full;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use kube::api::{Api, PostParams};

    fn client(api: &ApiServer, identity: Identity) -> Client {
        Client::new(api.ca().cert(), api.addr(), identity)
    }

    fn proxy_client(api: &ApiServer) -> Client {
        client(
            api,
            Identity::of(&api.ca().issue(&CertSpec::client(PROXY_IDENTITY))),
        )
    }

    async fn post(client: &Client, path: &str, body: &Value, token: Option<&str>) -> Reply {
        let mut req = request("POST", path).header(CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = Full::new(Bytes::from(serde_json::to_vec(body).unwrap())).boxed();
        client.send(req.body(body).unwrap()).await
    }

    fn json_of(reply: &Reply) -> Value {
        serde_json::from_slice(&reply.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", reply.text()))
    }

    fn token_review(token: &str) -> Value {
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {},
            "spec": {"token": token},
        })
    }

    fn access_review(user: &str, subresource: &str) -> Value {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "metadata": {},
            "spec": {
                "resourceAttributes": {
                    "verb": "get", "version": "v1", "resource": "nodes",
                    "subresource": subresource, "name": "node-a",
                },
                "user": user,
                "groups": ["system:authenticated"],
            },
        })
    }

    #[tokio::test]
    async fn token_review_wire_format_over_both_http_versions() {
        let api = ApiServer::start().await;
        api.add_token(
            "tok-bob",
            TokenUser::new("bob")
                .uid("u-1")
                .groups(&["g1", "system:authenticated"])
                .extra("scopes", &["a", "b"]),
        );
        let c = proxy_client(&api);
        for version in [http::Version::HTTP_2, http::Version::HTTP_11] {
            let c = if version == http::Version::HTTP_11 {
                Client::configured(
                    api.ca().cert(),
                    api.addr(),
                    Identity::of(&api.ca().issue(&CertSpec::client(PROXY_IDENTITY))),
                    crate::support::client::HTTP1_ONLY,
                    crate::support::client::ANY_TLS,
                )
            } else {
                c.clone()
            };
            let reply = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-bob"), None).await;
            assert_eq!(reply.version, version);
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
            assert_eq!(reply.header("content-type"), Some("application/json"));
            assert_eq!(
                json_of(&reply),
                json!({
                    "kind": "TokenReview",
                    "apiVersion": "authentication.k8s.io/v1",
                    "metadata": {"creationTimestamp": null},
                    "spec": {"token": "tok-bob"},
                    "status": {
                        "authenticated": true,
                        "user": {
                            "username": "bob", "uid": "u-1",
                            "groups": ["g1", "system:authenticated"],
                            "extra": {"scopes": ["a", "b"]},
                        },
                        "audiences": API_AUDIENCES,
                    },
                })
            );
        }
        assert_eq!(api.arrivals(Kind::TokenReview), 2);
        assert_eq!(
            api.calls()[0].caller,
            Some(Caller::Certificate(PROXY_IDENTITY.to_owned()))
        );
        assert_eq!(api.token_reviews(), vec![json!({"token": "tok-bob"}); 2]);
    }

    #[tokio::test]
    async fn token_review_failures_as_the_real_server_reports_them() {
        let api = ApiServer::start().await;
        api.reject_token("tok-expired", "token expired");
        api.reject_token("tok-quiet", "");
        api.add_token("tok-aud", TokenUser::new("carol").audiences(&["kubelet"]));
        let c = proxy_client(&api);

        let unknown = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("nope"), None).await);
        assert_eq!(
            unknown["status"],
            json!({"user": {}, "error": UNKNOWN_TOKEN_ERROR})
        );
        let expired =
            json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-expired"), None).await);
        assert_eq!(
            expired["status"],
            json!({"user": {}, "error": "token expired"})
        );
        let quiet = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-quiet"), None).await);
        assert_eq!(quiet["status"], json!({"user": {}}));

        // Audiences: the token is good for "kubelet" only.
        let implicit = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-aud"), None).await);
        assert_eq!(implicit["status"]["authenticated"], Value::Null);
        assert!(
            implicit["status"]["error"]
                .as_str()
                .unwrap()
                .contains("is invalid for the target audiences"),
            "{implicit}"
        );
        let mut asked = token_review("tok-aud");
        asked["spec"]["audiences"] = json!(["other", "kubelet"]);
        let explicit = json_of(&post(&c, TOKEN_REVIEWS_PATH, &asked, None).await);
        assert_eq!(explicit["spec"]["audiences"], json!(["other", "kubelet"]));
        assert_eq!(explicit["status"]["authenticated"], json!(true));
        assert_eq!(explicit["status"]["audiences"], json!(["kubelet"]));

        let empty = post(&c, TOKEN_REVIEWS_PATH, &token_review(""), None).await;
        assert_eq!(empty.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            json_of(&empty),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "token is required for TokenReview in authentication",
                "reason": "BadRequest", "code": 400,
            })
        );
    }

    #[tokio::test]
    async fn callers_authenticate_with_a_certificate_or_the_caller_token() {
        let api = ApiServer::start().await;
        let anonymous = client(&api, Identity::None);
        let refused = post(&anonymous, TOKEN_REVIEWS_PATH, &token_review("x"), None).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert_eq!(json_of(&refused)["reason"], "Unauthorized");
        let wrong = post(
            &anonymous,
            TOKEN_REVIEWS_PATH,
            &token_review("x"),
            Some("x"),
        )
        .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
        let token = api.caller_token().to_owned();
        let ok = post(
            &anonymous,
            TOKEN_REVIEWS_PATH,
            &token_review("x"),
            Some(&token),
        )
        .await;
        assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text());
        // A certificate from another CA fails the handshake.
        let stranger = Authority::root("stranger").issue(&CertSpec::client("mallory"));
        let rejected = client(&api, Identity::of(&stranger))
            .try_send(
                request("POST", TOKEN_REVIEWS_PATH)
                    .body(crate::support::client::empty())
                    .unwrap(),
            )
            .await;
        assert!(rejected.is_err(), "{rejected:?}");
        let callers: Vec<_> = api.calls().into_iter().map(|c| c.caller).collect();
        assert_eq!(callers, vec![None, None, Some(Caller::Token)]);
        assert_eq!(
            api.token_reviews().len(),
            1,
            "refused bodies are not reviewed"
        );
    }

    #[tokio::test]
    async fn access_reviews_are_recorded_and_decided_by_the_rules() {
        let api = ApiServer::start().await;
        api.set_rules(|review| match review.subresource.as_str() {
            "pods" if review.user == "bob" => Verdict::allow(),
            "proxy" => Verdict::deny(),
            "log" => Verdict::allowed_and_denied(),
            _ => Verdict::no_opinion(),
        });
        let c = proxy_client(&api);
        let bob = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
        assert_eq!(bob.status, StatusCode::CREATED, "{}", bob.text());
        let bob = json_of(&bob);
        assert_eq!(bob["kind"], "SubjectAccessReview");
        assert_eq!(bob["spec"], access_review("bob", "pods")["spec"]);
        assert_eq!(bob["status"]["allowed"], json!(true));
        assert_eq!(bob["status"].get("denied"), None);
        let proxy = json_of(
            &post(
                &c,
                ACCESS_REVIEWS_PATH,
                &access_review("bob", "proxy"),
                None,
            )
            .await,
        );
        assert_eq!(
            proxy["status"],
            json!({"allowed": false, "denied": true, "reason": "denied by the stand-in's rules"})
        );
        let eve =
            json_of(&post(&c, ACCESS_REVIEWS_PATH, &access_review("eve", "pods"), None).await);
        assert_eq!(eve["status"], json!({"allowed": false}));
        let both =
            json_of(&post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "log"), None).await);
        assert_eq!(both["status"]["allowed"], json!(true));
        assert_eq!(both["status"]["denied"], json!(true));

        let mut nobody = access_review("", "pods");
        nobody["spec"]["groups"] = json!([]);
        let invalid = post(&c, ACCESS_REVIEWS_PATH, &nobody, None).await;
        assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(json_of(&invalid)["reason"], "Invalid");

        let specs = api.access_reviews();
        assert_eq!(specs.len(), 5);
        assert_eq!(specs[0], access_review("bob", "pods")["spec"]);
        assert_eq!(api.arrivals(Kind::SubjectAccessReview), 5);
        assert_eq!(api.arrivals(Kind::TokenReview), 0);
    }

    #[tokio::test]
    async fn faults_are_served_in_order_then_normal_answers_resume() {
        let api = ApiServer::start().await;
        api.add_token("tok", TokenUser::new("bob"));
        api.inject(Kind::TokenReview, Fault::InternalError, 2);
        api.inject(
            Target::Both,
            Fault::TooManyRequests {
                retry_after_seconds: 1,
            },
            1,
        );
        api.inject(Kind::SubjectAccessReview, Fault::Forbidden, 1);
        api.inject(Kind::TokenReview, Fault::ServiceUnavailable, 1);
        let c = proxy_client(&api);

        let first = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            json_of(&first),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Internal error occurred: injected by the stand-in",
                "reason": "InternalError",
                "details": {"causes": [{"message": "injected by the stand-in"}]},
                "code": 500,
            })
        );
        // The SAR skips the TokenReview-only faults and takes the first one for both kinds.
        let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
        assert_eq!(sar.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(sar.header("retry-after"), Some("1"));
        assert_eq!(json_of(&sar)["details"]["retryAfterSeconds"], json!(1));
        assert_eq!(json_of(&sar)["reason"], "TooManyRequests");
        let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
        assert_eq!(sar.status, StatusCode::FORBIDDEN);
        assert_eq!(json_of(&sar)["reason"], "Forbidden");
        let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
        assert_eq!(sar.status, StatusCode::CREATED);

        let second = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(second.status, StatusCode::INTERNAL_SERVER_ERROR);
        let third = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(third.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(third.header("retry-after"), None);
        let fourth = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(fourth.status, StatusCode::CREATED);
        assert_eq!(api.statuses(Kind::TokenReview), vec![500, 500, 503, 201]);
        assert_eq!(api.statuses(Kind::SubjectAccessReview), vec![429, 403, 201]);
    }

    #[tokio::test]
    async fn malformed_oversized_and_slow_answers() {
        let api = ApiServer::start().await;
        api.add_token("tok", TokenUser::new("bob"));
        api.inject(Kind::TokenReview, Fault::MalformedJson, 1);
        api.inject(
            Kind::TokenReview,
            Fault::Oversized {
                bytes: 64 * 1024 * 1024,
            },
            1,
        );
        api.inject(
            Kind::TokenReview,
            Fault::Slow(Duration::from_millis(300)),
            1,
        );
        let c = proxy_client(&api);

        let malformed = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(malformed.status, StatusCode::CREATED);
        assert!(serde_json::from_slice::<Value>(&malformed.body).is_err());

        let oversized = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(oversized.status, StatusCode::CREATED);
        assert!(oversized.body.len() >= 64 * 1024 * 1024);
        assert!(oversized.body.len() < 64 * 1024 * 1024 + 1024);
        let big = json_of(&oversized);
        assert_eq!(big["status"]["user"]["username"], "bob");
        assert!(
            big["metadata"]["annotations"]["padding"]
                .as_str()
                .unwrap()
                .len()
                > 60 << 20
        );

        // Slow: the answer comes, unchanged, after the delay (no timing asserted here).
        let body = token_review("tok");
        let (slow, _) = tokio::join!(
            post(&c, TOKEN_REVIEWS_PATH, &body, None),
            api.wait_for_arrivals(Kind::TokenReview, 3),
        );
        assert_eq!(json_of(&slow)["status"]["authenticated"], json!(true));
    }

    #[tokio::test]
    async fn held_calls_wait_for_the_gate() {
        let api = ApiServer::start().await;
        api.add_token("tok", TokenUser::new("bob"));
        let gate = api.hold(Kind::TokenReview);
        let c = proxy_client(&api);
        let pending = tokio::spawn({
            let c = c.clone();
            async move { post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await }
        });
        api.wait_for_arrivals(Kind::TokenReview, 1).await;
        // Other kinds are not held.
        let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
        assert_eq!(sar.status, StatusCode::CREATED);
        assert!(api.statuses(Kind::TokenReview).is_empty());
        gate.release();
        let reply = within("the held call", pending).await.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(api.statuses(Kind::TokenReview), vec![201]);
    }

    #[tokio::test]
    async fn stops_refusing_connections_and_restarts_on_the_same_port() {
        let mut api = ApiServer::start().await;
        api.add_token("tok", TokenUser::new("bob"));
        let c = proxy_client(&api);
        assert_eq!(
            post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None)
                .await
                .status,
            StatusCode::CREATED
        );
        api.stop().await;
        let refused = c
            .try_send(
                request("POST", TOKEN_REVIEWS_PATH)
                    .body(crate::support::client::empty())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert!(is_connection_refused(refused.as_ref()), "{refused}");
        api.restart().await;
        let again = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
        assert_eq!(json_of(&again)["status"]["user"]["username"], "bob");
        assert_eq!(api.statuses(Kind::TokenReview), vec![201, 201]);
    }

    /// The kubeconfigs work with the client library the proxy itself uses, in both flavours.
    #[tokio::test]
    async fn kube_client_reads_the_kubeconfigs_and_speaks_the_wire_format() {
        let api = ApiServer::start().await;
        api.add_token("tok", TokenUser::new("bob").groups(&["g1"]));
        api.set_rules(|review| {
            if review.user == PROXY_IDENTITY && review.subresource == "proxy" {
                Verdict::allow()
            } else {
                Verdict::no_opinion()
            }
        });
        for flavour in [Flavour::ClientCertificate, Flavour::Token] {
            let kubeconfig = kube::config::Kubeconfig::read_from(api.kubeconfig(flavour)).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .unwrap();
            let client = kube::Client::try_from(config).unwrap();
            let reviews: Api<TokenReview> = Api::all(client.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: "tok".to_owned(),
                    audiences: None,
                },
                ..Default::default()
            };
            let answered = within(
                "kube TokenReview",
                reviews.create(&PostParams::default(), &review),
            )
            .await
            .unwrap();
            let status = answered.status.unwrap();
            assert_eq!(status.authenticated, Some(true));
            assert_eq!(status.user.unwrap().groups, Some(vec!["g1".to_owned()]));

            let empty = TokenReview {
                spec: TokenReviewSpec {
                    token: String::new(),
                    audiences: None,
                },
                ..Default::default()
            };
            let error = within(
                "kube empty TokenReview",
                reviews.create(&PostParams::default(), &empty),
            )
            .await
            .unwrap_err();
            match error {
                kube::Error::Api(status) => {
                    assert_eq!(status.code, 400);
                    assert_eq!(status.reason, "BadRequest");
                }
                other => panic!("expected a Status, got {other:?}"),
            }

            let access: Api<SubjectAccessReview> = Api::all(client);
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some("get".to_owned()),
                        version: Some("v1".to_owned()),
                        resource: Some("nodes".to_owned()),
                        subresource: Some("proxy".to_owned()),
                        name: Some("node-a".to_owned()),
                        ..Default::default()
                    }),
                    user: Some(PROXY_IDENTITY.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answered = within("kube SAR", access.create(&PostParams::default(), &review))
                .await
                .unwrap();
            assert!(answered.status.unwrap().allowed);
        }
        let callers: Vec<_> = api.calls().into_iter().map(|c| c.caller).collect();
        let certificate = Some(Caller::Certificate(PROXY_IDENTITY.to_owned()));
        assert_eq!(
            callers,
            vec![
                certificate.clone(),
                certificate.clone(),
                certificate,
                Some(Caller::Token),
                Some(Caller::Token),
                Some(Caller::Token),
            ]
        );
    }
}
