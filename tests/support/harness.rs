//! Starts what a scenario talks to: the stand-in kubelet (TLS, plain HTTP or a unix socket) and the
//! real proxy in front of it, configured from a real command line exactly as an operator would
//! (`ProxyFlags` → `Settings::load` → `assemble` → `start`), on loopback ports chosen by the kernel.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use kubelet_auth_proxy::config::flags::ProxyFlags;
use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;
use kubelet_auth_proxy::{RunningProxy, Settings, assemble};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::apiserver::{ApiServer, Flavour};
use super::client::{ANY_TLS, Client, HTTP1_ONLY, Identity, Reply, plain_get};
use super::metrics;
use super::pki::{Authority, CertSpec, Issued};
use super::volume::Volume;
use super::{TempDir, within};

/// The Node name every scenario's proxy guards.
pub const NODE_NAME: &str = "node-a";

/// The proxy's command line, as the binary parses it.
#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    flags: ProxyFlags,
}

/// Parses a command line (without the program name) the way the binary does.
pub fn parse_flags(args: &[String]) -> Result<ProxyFlags, clap::Error> {
    Cli::try_parse_from(
        std::iter::once("kubelet-auth-proxy".to_owned()).chain(args.iter().cloned()),
    )
    .map(|cli| cli.flags)
}

/// How the proxy reaches the stand-in kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// HTTPS; the kubelet does not ask for a client certificate.
    Https,
    /// HTTPS; the kubelet requires a client certificate from the test CA. `proxy_has_cert` says
    /// whether the proxy is given one (`--upstream-client-cert-file`).
    HttpsRequiringClientCert {
        /// Whether the proxy presents a client certificate.
        proxy_has_cert: bool,
    },
    /// Plain HTTP.
    Http,
    /// Plain HTTP over a unix socket.
    Unix,
}

/// What to start: the upstream, extra flags, and an optional policy.
pub struct ProxySpec {
    upstream: Upstream,
    args: Vec<String>,
    policy: Option<String>,
    client_ca: bool,
    /// Further CAs (PEM) in the client CA bundle, after the test CA.
    extra_client_cas: Vec<String>,
    /// Whether the serving certificate and key live in a Kubernetes-style volume.
    serving_volume: bool,
    kubeconfig: Option<PathBuf>,
}

impl ProxySpec {
    /// An HTTPS upstream, x509 client authentication with the test CA, and these extra flags. A
    /// flag given here replaces the harness's own setting of it (e.g. `--shutdown-grace-period`).
    pub fn new(args: &[&str]) -> ProxySpec {
        ProxySpec {
            upstream: Upstream::Https,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            policy: None,
            client_ca: true,
            extra_client_cas: Vec::new(),
            serving_volume: false,
            kubeconfig: None,
        }
    }

    /// [`ProxySpec::new`] with `--authorization-mode=AlwaysAllow` first: the set-up of every
    /// scenario about something other than who may do what.
    pub fn always_allow(args: &[&str]) -> ProxySpec {
        ProxySpec::new(&["--authorization-mode=AlwaysAllow"]).args(args)
    }

    /// Adds `args` after the flags given so far: a scenario's own flags on top of a helper's.
    pub fn args(mut self, args: &[&str]) -> ProxySpec {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Reaches the stand-in kubelet this way.
    pub fn upstream(mut self, upstream: Upstream) -> ProxySpec {
        self.upstream = upstream;
        self
    }

    /// Writes `yaml` to a file and passes it as `--authorization-policy-file`.
    pub fn policy(mut self, yaml: &str) -> ProxySpec {
        self.policy = Some(yaml.to_owned());
        self
    }

    /// Adds `pem` (a CA certificate) to the client CA bundle, after the test CA.
    pub fn also_trust(mut self, pem: String) -> ProxySpec {
        self.extra_client_cas.push(pem);
        self
    }

    /// Serves the certificate and key from a Kubernetes-style volume (`tls.crt` and `tls.key`
    /// through the `..data` symlink), as a mounted Secret; see [`Harness::serving_volume`].
    pub fn serving_volume(mut self) -> ProxySpec {
        self.serving_volume = true;
        self
    }

    /// Leaves `--client-ca-file` out (no x509 authentication; no certificate requested).
    pub fn without_client_ca(mut self) -> ProxySpec {
        self.client_ca = false;
        self
    }

    /// Passes `path` as `--kubeconfig` (the stand-in API server's, for TokenReview and
    /// SubjectAccessReview).
    pub fn kubeconfig(mut self, path: &Path) -> ProxySpec {
        self.kubeconfig = Some(path.to_owned());
        self
    }

    /// Sends TokenReviews and SubjectAccessReviews to `api`: its kubeconfig (client-certificate
    /// flavour, the usual one) as `--kubeconfig`.
    pub fn apiserver(self, api: &ApiServer) -> ProxySpec {
        self.kubeconfig(&api.kubeconfig(Flavour::ClientCertificate))
    }

    /// Starts the stand-in kubelet and the proxy.
    pub async fn start(self) -> Harness {
        let dir = TempDir::new("proxy");
        let ca = Authority::root("kubelet-auth-proxy e2e CA");
        let serving = ca.issue(&CertSpec::server());
        let kubelet = start_kubelet(
            self.upstream,
            &ca,
            &serving,
            &dir.path().join("kubelet.sock"),
        )
        .await;

        let volume = self.serving_volume.then(|| {
            Volume::create(
                dir.path().join("serving"),
                &[
                    ("tls.crt", serving.chain_pem()),
                    ("tls.key", serving.key_pem()),
                ],
            )
        });
        let (cert_file, key_file) = match &volume {
            Some(volume) => (volume.file("tls.crt"), volume.file("tls.key")),
            None => (
                dir.write("serving.crt", serving.chain_pem()),
                dir.write("serving.key", serving.key_pem()),
            ),
        };
        let mut args = vec![
            format!("--upstream={}", upstream_url(self.upstream, &kubelet)),
            format!("--tls-cert-file={}", cert_file.display()),
            format!("--tls-private-key-file={}", key_file.display()),
            "--listen-address=127.0.0.1:0".to_owned(),
            "--admin-listen-address=127.0.0.1:0".to_owned(),
            format!("--node-name={NODE_NAME}"),
            "--shutdown-grace-period=1s".to_owned(),
        ];
        let ca_file = dir.write("ca.crt", ca.pem());
        if self.client_ca {
            let bundle = std::iter::once(ca.pem())
                .chain(self.extra_client_cas)
                .collect::<String>();
            args.push(dir.flag("--client-ca-file", CLIENT_CA_FILE, bundle));
        }
        if matches!(
            self.upstream,
            Upstream::Https | Upstream::HttpsRequiringClientCert { .. }
        ) {
            args.push(format!("--upstream-ca-file={}", ca_file.display()));
        }
        if self.upstream
            == (Upstream::HttpsRequiringClientCert {
                proxy_has_cert: true,
            })
        {
            let identity = ca.issue(&CertSpec::client("kubelet-auth-proxy"));
            args.push(dir.flag(
                "--upstream-client-cert-file",
                "upstream-client.crt",
                identity.chain_pem(),
            ));
            args.push(dir.flag(
                "--upstream-client-key-file",
                "upstream-client.key",
                identity.key_pem(),
            ));
        }
        if let Some(policy) = &self.policy {
            args.push(dir.flag("--authorization-policy-file", POLICY_FILE, policy));
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            args.push(format!("--kubeconfig={}", kubeconfig.display()));
        }
        let flag_name = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
        args.retain(|arg| !self.args.iter().any(|a| flag_name(a) == flag_name(arg)));
        args.extend(self.args);

        let flags = parse_flags(&args).unwrap_or_else(|e| panic!("flags {args:?}: {e}"));
        let config = Settings::load(&flags)
            .await
            .and_then(assemble)
            .unwrap_or_else(|e| panic!("config {args:?}: {e}"));
        let proxy = within("starting the proxy", kubelet_auth_proxy::start(config))
            .await
            .unwrap();
        Harness {
            ca,
            dir,
            proxy,
            kubelet: Some(kubelet),
            upstream: self.upstream,
            serving,
            cert_file,
            key_file,
            volume,
        }
    }
}

async fn start_kubelet(
    upstream: Upstream,
    ca: &Authority,
    serving: &Issued,
    socket: &std::path::Path,
) -> StandInKubelet {
    let started = async {
        match upstream {
            Upstream::Https => StandInKubelet::start(Some(kubelet_tls(serving, None))).await,
            Upstream::HttpsRequiringClientCert { .. } => {
                StandInKubelet::start(Some(kubelet_tls(serving, Some(ca)))).await
            }
            Upstream::Http => StandInKubelet::start(None).await,
            Upstream::Unix => StandInKubelet::start_unix(socket.to_owned()).await,
        }
    };
    within("starting the stand-in kubelet", started)
        .await
        .unwrap()
}

/// The stand-in kubelet's TLS: `serving` as its certificate and, with `client_ca`, client
/// certificates required from that CA (as a kubelet with `clientCAFile` set). One place for it,
/// so every scenario's kubelet speaks TLS the same way.
pub fn kubelet_tls(serving: &Issued, client_ca: Option<&Authority>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.cert().clone()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(
        builder
            .with_single_cert(serving.chain.clone(), serving.key())
            .unwrap(),
    )
}

fn upstream_url(upstream: Upstream, kubelet: &StandInKubelet) -> String {
    match upstream {
        Upstream::Https | Upstream::HttpsRequiringClientCert { .. } => {
            format!("https://{}", kubelet.addr().unwrap())
        }
        Upstream::Http => format!("http://{}", kubelet.addr().unwrap()),
        Upstream::Unix => format!("unix://{}", kubelet.socket_path().unwrap().display()),
    }
}

/// A running proxy in front of a running stand-in kubelet.
pub struct Harness {
    /// The CA that signed every certificate of the scenario, and the client CA of the proxy.
    pub ca: Authority,
    /// Where the scenario's files live.
    pub dir: TempDir,
    proxy: RunningProxy,
    kubelet: Option<StandInKubelet>,
    upstream: Upstream,
    serving: Issued,
    cert_file: PathBuf,
    key_file: PathBuf,
    volume: Option<Volume>,
}

/// The client CA bundle's file name in [`Harness::dir`].
const CLIENT_CA_FILE: &str = "client-ca.crt";
/// The policy file's name in [`Harness::dir`].
const POLICY_FILE: &str = "policy.yaml";

impl Harness {
    /// The proxy's kubelet API address.
    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// The proxy's admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.proxy.admin_addr()
    }

    /// A client presenting `identity`.
    pub fn client(&self, identity: Identity) -> Client {
        Client::new(self.ca.cert(), self.addr(), identity)
    }

    /// A client without a certificate.
    pub fn anonymous(&self) -> Client {
        self.client(Identity::None)
    }

    /// `GET target` with `token` as a bearer token and no client certificate: a caller known by
    /// its token alone.
    pub async fn bearer_get(&self, target: &str, token: &str) -> Reply {
        self.anonymous().get_with_token(target, token).await
    }

    /// A client with a valid certificate for `name` in `groups`.
    pub fn user(&self, name: &str, groups: &[&str]) -> Client {
        let spec = groups
            .iter()
            .fold(CertSpec::client(name), |spec, group| spec.org(group));
        self.client(Identity::of(&self.ca.issue(&spec)))
    }

    /// A client presenting `identity` offering only HTTP/1.1, the protocol of exec, attach and
    /// portForward upgrades.
    pub fn http1_client(&self, identity: Identity) -> Client {
        Client::http1(self.ca.cert(), self.addr(), identity)
    }

    /// A client with a valid certificate for `name` offering only HTTP/1.1.
    pub fn http1_user(&self, name: &str) -> Client {
        self.user_offering(name, HTTP1_ONLY)
    }

    /// A client with a valid certificate for `name` offering the ALPN protocols `alpn`.
    pub fn user_offering(&self, name: &str, alpn: &[&[u8]]) -> Client {
        let cert = self.ca.issue(&CertSpec::client(name));
        Client::configured(
            self.ca.cert(),
            self.addr(),
            Identity::of(&cert),
            alpn,
            ANY_TLS,
        )
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Reply {
        plain_get(self.admin_addr(), path).await
    }

    /// The sum of the samples of `metric` on `/metrics` whose labels include all of `labels`.
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let exposition = self.admin_get("/metrics").await;
        metrics::total(&exposition.text(), metric, labels)
    }

    /// Waits until the proxy holds the service-account issuer's keys, so tokens are checked on
    /// the node from then on.
    pub async fn wait_for_issuer_keys(&self) {
        crate::support::eventually("the issuer's keys fetched", || async {
            (self
                .metric("kubelet_auth_proxy_service_account_keys", &[])
                .await
                > 0.0)
                .then_some(())
        })
        .await;
    }

    /// The serving certificate the proxy was started with.
    pub fn serving(&self) -> &Issued {
        &self.serving
    }

    /// `--tls-cert-file` (inside the volume, with [`ProxySpec::serving_volume`]).
    pub fn serving_cert_file(&self) -> &Path {
        &self.cert_file
    }

    /// `--tls-private-key-file` (inside the volume, with [`ProxySpec::serving_volume`]).
    pub fn serving_key_file(&self) -> &Path {
        &self.key_file
    }

    /// The volume holding `tls.crt` and `tls.key`, with [`ProxySpec::serving_volume`].
    pub fn serving_volume(&mut self) -> &mut Volume {
        self.volume
            .as_mut()
            .expect("started with ProxySpec::serving_volume")
    }

    /// `--client-ca-file`.
    pub fn client_ca_file(&self) -> PathBuf {
        self.dir.path().join(CLIENT_CA_FILE)
    }

    /// `--authorization-policy-file`, with [`ProxySpec::policy`].
    pub fn policy_file(&self) -> PathBuf {
        self.dir.path().join(POLICY_FILE)
    }

    /// Stops the stand-in kubelet (its unix socket disappears).
    pub async fn stop_kubelet(&mut self) {
        let kubelet = self.kubelet.take().expect("the kubelet is running");
        within("stopping the kubelet", kubelet.shutdown()).await;
    }

    /// Starts the stand-in kubelet again on the same unix socket.
    pub async fn restart_kubelet(&mut self) {
        assert_eq!(
            self.upstream,
            Upstream::Unix,
            "only a unix socket can be reused"
        );
        let socket: PathBuf = self.dir.path().join("kubelet.sock");
        let started = within(
            "restarting the stand-in kubelet",
            StandInKubelet::start_unix(socket),
        )
        .await;
        self.kubelet = Some(started.unwrap());
    }

    /// Shuts the proxy down gracefully.
    pub async fn shutdown(self) {
        within("shutting the proxy down", self.proxy.shutdown()).await;
    }

    /// Shuts the proxy down gracefully and hands back the stand-in kubelet and the files, still
    /// there: what happens next to the proxy's connections is then the proxy's doing alone.
    pub async fn shutdown_proxy_only(self) -> Remains {
        within("shutting the proxy down", self.proxy.shutdown()).await;
        Remains {
            _kubelet: self.kubelet,
            _dir: self.dir,
        }
    }
}

/// The stand-in kubelet and the files of a harness whose proxy has stopped; dropped, they go too.
pub struct Remains {
    _kubelet: Option<StandInKubelet>,
    _dir: TempDir,
}

/// A subject of a ClusterRoleBinding.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// `kind: User`.
    User(&'a str),
    /// `kind: Group`.
    Group(&'a str),
    /// `kind: ServiceAccount` with its namespace.
    ServiceAccount {
        /// The namespace.
        namespace: &'a str,
        /// The name.
        name: &'a str,
    },
}

/// A ClusterRole granting `verbs` on `resources` (core group) and a ClusterRoleBinding of it to
/// `subjects`, as YAML documents; join several with `---`.
pub fn grant(name: &str, resources: &[&str], verbs: &[&str], subjects: &[Subject<'_>]) -> String {
    let list = |items: &[&str]| {
        items
            .iter()
            .map(|i| format!("{i:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let subjects: String = subjects
        .iter()
        .map(|subject| match subject {
            Subject::User(n) => format!("  - kind: User\n    name: {n:?}\n"),
            Subject::Group(n) => format!("  - kind: Group\n    name: {n:?}\n"),
            Subject::ServiceAccount { namespace, name } => format!(
                "  - kind: ServiceAccount\n    name: {name:?}\n    namespace: {namespace:?}\n"
            ),
        })
        .collect();
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {name}
rules:
  - apiGroups: [\"\"]
    resources: [{resources}]
    verbs: [{verbs}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {name}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {name}
subjects:
{subjects}",
        resources = list(resources),
        verbs = list(verbs),
    )
}
