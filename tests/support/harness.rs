//! Starts what a scenario talks to: the stand-in kubelet (TLS, plain HTTP or a unix socket) and the
//! real proxy in front of it, configured from a real command line exactly as an operator would
//! (`ProxyFlags` → `Config::load` → `start`), on loopback ports chosen by the kernel.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use kubelet_auth_proxy::config::flags::ProxyFlags;
use kubelet_auth_proxy::demo::kubelet::StandInKubelet;
use kubelet_auth_proxy::{Config, RunningProxy};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::client::{Client, Identity, Reply, plain_get};
use super::pki::{Authority, CertSpec, Issued};
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
    kubeconfig: Option<PathBuf>,
}

impl ProxySpec {
    /// An HTTPS upstream, x509 client authentication with the test CA, and these extra flags.
    pub fn new(args: &[&str]) -> ProxySpec {
        ProxySpec {
            upstream: Upstream::Https,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            policy: None,
            client_ca: true,
            kubeconfig: None,
        }
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

        let mut args = vec![
            format!("--upstream={}", upstream_url(self.upstream, &kubelet)),
            format!(
                "--tls-cert-file={}",
                dir.write("serving.crt", serving.chain_pem()).display()
            ),
            format!(
                "--tls-private-key-file={}",
                dir.write("serving.key", serving.key_pem()).display()
            ),
            "--listen-address=127.0.0.1:0".to_owned(),
            "--admin-listen-address=127.0.0.1:0".to_owned(),
            format!("--node-name={NODE_NAME}"),
            "--shutdown-grace-period=1s".to_owned(),
        ];
        let ca_file = dir.write("ca.crt", ca.pem());
        if self.client_ca {
            args.push(format!("--client-ca-file={}", ca_file.display()));
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
            args.push(format!(
                "--upstream-client-cert-file={}",
                dir.write("upstream-client.crt", identity.chain_pem())
                    .display()
            ));
            args.push(format!(
                "--upstream-client-key-file={}",
                dir.write("upstream-client.key", identity.key_pem())
                    .display()
            ));
        }
        if let Some(policy) = &self.policy {
            args.push(format!(
                "--authorization-policy-file={}",
                dir.write("policy.yaml", policy).display()
            ));
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            args.push(format!("--kubeconfig={}", kubeconfig.display()));
        }
        args.extend(self.args);

        let flags = parse_flags(&args).unwrap_or_else(|e| panic!("flags {args:?}: {e}"));
        let config = Config::load(&flags)
            .await
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
            Upstream::Https => StandInKubelet::start(Some(kubelet_tls(ca, serving, false))).await,
            Upstream::HttpsRequiringClientCert { .. } => {
                StandInKubelet::start(Some(kubelet_tls(ca, serving, true))).await
            }
            Upstream::Http => StandInKubelet::start(None).await,
            Upstream::Unix => StandInKubelet::start_unix(socket.to_owned()).await,
        }
    };
    within("starting the stand-in kubelet", started)
        .await
        .unwrap()
}

fn kubelet_tls(ca: &Authority, serving: &Issued, require_client_cert: bool) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if require_client_cert {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert().clone()).unwrap();
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
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
}

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

    /// A client with a valid certificate for `name` in `groups`.
    pub fn user(&self, name: &str, groups: &[&str]) -> Client {
        let spec = groups
            .iter()
            .fold(CertSpec::client(name), |spec, group| spec.org(group));
        self.client(Identity::of(&self.ca.issue(&spec)))
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Reply {
        plain_get(self.admin_addr(), path).await
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
