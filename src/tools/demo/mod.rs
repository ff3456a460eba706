//! `kubelet-auth-proxy demo`: the real proxy in front of a stand-in kubelet on loopback, with
//! throwaway certificates and a local policy, toured by several identities. Every piece is the
//! production one except the kubelet; the tour doubles as a smoke test (`--once`).

pub mod accept;
pub mod apiserver;
pub mod kubelet;
pub mod pki;
pub mod tour;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use clap::Parser;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::config::flags::ProxyFlags;
use crate::{ConfigError, Settings, assemble};
use apiserver::{GRAFANA_TOKEN, StandInApiServer};
use kubelet::StandInKubelet;
use pki::{Authority, Usage};
use tour::{Caller, send, steps};

/// The demo's local policy, also written next to the certificates for the reader.
pub const DEMO_POLICY: &str = include_str!("policy.yaml");

/// The Node name the demo's proxy guards.
const NODE_NAME: &str = "demo-node";

/// Options of `kubelet-auth-proxy demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Exit after the tour instead of serving until Ctrl-C; the exit status is 0 only if every
    /// request was answered as expected.
    #[arg(long)]
    pub once: bool,
    /// Where the demo proxy listens.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:0")]
    pub listen_address: SocketAddr,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Making certificates failed.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// A network or file operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The proxy could not start serving.
    #[error(transparent)]
    Start(#[from] crate::StartError),
    /// A TLS configuration could not be built.
    #[error("TLS: {0}")]
    Tls(String),
    /// The demo's own configuration of the proxy was refused.
    #[error("proxy configuration: {0}")]
    Config(#[from] ConfigError),
    /// An HTTP exchange of the tour failed.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// A tour request could not be built.
    #[error("request: {0}")]
    Request(String),
}

fn read_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, DemoError> {
    crate::tls::read_certs(path).map_err(|e| DemoError::Tls(format!("{}: {e}", path.display())))
}

fn client_config(
    ca: &Path,
    identity: Option<&pki::Issued>,
) -> Result<Arc<ClientConfig>, DemoError> {
    let mut roots = RootCertStore::empty();
    for cert in read_pem_certs(ca)? {
        roots.add(cert).map_err(|e| DemoError::Tls(e.to_string()))?;
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| DemoError::Tls(e.to_string()))?
            .with_root_certificates(roots);
    let config = match identity {
        Some(issued) => builder
            .with_client_auth_cert(
                read_pem_certs(&issued.cert)?,
                crate::tls::read_key(&issued.key).map_err(|e| DemoError::Tls(e.to_string()))?,
            )
            .map_err(|e| DemoError::Tls(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The stand-ins' TLS: each serves with its own certificate and, like a real kubelet fronted by
/// the proxy or an API server, accepts only clients with a certificate from the demo CA (the
/// proxy's).
fn mutual_tls(ca: &Path, serving: &pki::Issued) -> Result<Arc<ServerConfig>, DemoError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in read_pem_certs(ca)? {
        roots.add(cert).map_err(|e| DemoError::Tls(e.to_string()))?;
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()
            .map_err(|e| DemoError::Tls(e.to_string()))?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DemoError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            read_pem_certs(&serving.cert)?,
            crate::tls::read_key(&serving.key).map_err(|e| DemoError::Tls(e.to_string()))?,
        )
        .map_err(|e| DemoError::Tls(e.to_string()))?;
    Ok(Arc::new(config))
}

#[derive(Parser)]
struct FlagsOnly {
    #[command(flatten)]
    flags: ProxyFlags,
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// Runs the demo. Returns whether every request of the tour was answered as expected.
pub async fn run(args: DemoArgs) -> Result<bool, DemoError> {
    let dir = std::env::temp_dir().join(format!("kubelet-auth-proxy-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ca = Authority::new(&dir, "ca", "kubelet-auth-proxy demo CA")?;
    let stranger_ca = Authority::new(&dir, "stranger-ca", "someone else's CA")?;
    let loopback: &[&str] = &["127.0.0.1", "localhost"];
    let proxy_serving = ca.issue(
        "proxy-serving",
        "kubelet-auth-proxy",
        &[],
        Usage::Server(loopback),
    )?;
    let kubelet_serving = ca.issue("kubelet-serving", NODE_NAME, &[], Usage::Server(loopback))?;
    let proxy_client = ca.issue("proxy-to-kubelet", "kubelet-auth-proxy", &[], Usage::Client)?;
    let apiserver_serving = ca.issue(
        "apiserver-serving",
        "kube-apiserver",
        &[],
        Usage::Server(loopback),
    )?;
    let proxy_reviewer = ca.issue(
        "proxy-to-apiserver",
        "system:serviceaccount:kube-system:kubelet-auth-proxy",
        &[],
        Usage::Client,
    )?;
    // Who calls, with a certificate and or a bearer token.
    let no_token: Option<&'static str> = None;
    let identities = [
        (
            "alice (group cluster-admins)",
            Some(ca.issue("alice", "alice", &["cluster-admins"], Usage::Client)?),
            no_token,
        ),
        (
            "prometheus",
            Some(ca.issue("prometheus", "prometheus", &[], Usage::Client)?),
            no_token,
        ),
        (
            "system:node:demo-node",
            Some(ca.issue(
                "node-demo",
                "system:node:demo-node",
                &["system:nodes"],
                Usage::Client,
            )?),
            no_token,
        ),
        (
            "system:node:other-node",
            Some(ca.issue(
                "node-other",
                "system:node:other-node",
                &["system:nodes"],
                Usage::Client,
            )?),
            no_token,
        ),
        ("anonymous (no certificate)", None, no_token),
        (
            "mallory (unknown CA)",
            Some(stranger_ca.issue("mallory", "mallory", &["cluster-admins"], Usage::Client)?),
            no_token,
        ),
        ("grafana (bearer token)", None, Some(GRAFANA_TOKEN)),
        ("a forged bearer token", None, Some("forged-token")),
    ];
    let ca_file = dir.join("ca.crt");
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, DEMO_POLICY)?;

    let kubelet = StandInKubelet::start(Some(mutual_tls(&ca_file, &kubelet_serving)?)).await?;
    let api = StandInApiServer::start(mutual_tls(&ca_file, &apiserver_serving)?).await?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    \
             server: https://{}\n    certificate-authority: {}\nusers:\n- name: proxy\n  \
             user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: demo\n  \
             context: {{cluster: demo, user: proxy}}\ncurrent-context: demo\n",
            api.addr(),
            display(&ca_file),
            display(&proxy_reviewer.cert),
            display(&proxy_reviewer.key),
        ),
    )?;
    let kubelet_addr = kubelet
        .addr()
        .ok_or_else(|| DemoError::Request("the stand-in kubelet has no TCP address".into()))?;
    let proxy_args: Vec<String> = vec![
        format!("--upstream=https://{kubelet_addr}"),
        format!("--upstream-ca-file={}", display(&ca_file)),
        format!(
            "--upstream-client-cert-file={}",
            display(&proxy_client.cert)
        ),
        format!("--upstream-client-key-file={}", display(&proxy_client.key)),
        format!("--listen-address={}", args.listen_address),
        "--admin-listen-address=127.0.0.1:0".into(),
        format!("--tls-cert-file={}", display(&proxy_serving.cert)),
        format!("--tls-private-key-file={}", display(&proxy_serving.key)),
        format!("--client-ca-file={}", display(&ca_file)),
        "--anonymous-auth".into(),
        "--authentication-token-webhook".into(),
        format!("--kubeconfig={}", display(&kubeconfig)),
        "--authorization-mode=Node,Policy,Webhook".into(),
        format!("--authorization-policy-file={}", display(&policy_file)),
        format!("--node-name={NODE_NAME}"),
    ];
    let flags = FlagsOnly::try_parse_from(
        std::iter::once("kubelet-auth-proxy".to_owned()).chain(proxy_args.iter().cloned()),
    )
    .map_err(|e| DemoError::Request(e.to_string()))?
    .flags;
    let proxy = crate::start(assemble(Settings::load(&flags).await?)?).await?;

    println!("kubelet-auth-proxy demo");
    println!(
        "  stand-in kubelet  https://{kubelet_addr} (accepts only the proxy's client certificate)"
    );
    println!(
        "  API server        https://{} (a stand-in: TokenReview, SubjectAccessReview)",
        api.addr()
    );
    println!(
        "  proxy             https://{}  (node {NODE_NAME})",
        proxy.addr()
    );
    println!("  metrics           http://{}/metrics", proxy.admin_addr());
    println!("  files             {}", dir.display());
    println!(
        "  proxy command     kubelet-auth-proxy {}",
        proxy_args.join(" ")
    );
    println!();

    let callers = identities
        .iter()
        .map(|(label, issued, token)| {
            Ok(Caller {
                label,
                token: *token,
                tls: client_config(&ca_file, issued.as_ref())?,
            })
        })
        .collect::<Result<Vec<_>, DemoError>>()?;
    let mut all_held = true;
    let request_of = |step: &tour::Step| {
        format!(
            "{} {}{}",
            step.method,
            step.target,
            if step.websocket { " (WebSocket)" } else { "" }
        )
    };
    // The columns as wide as their longest entry, so every row lines up.
    let who = callers.iter().map(|c| c.label.len()).max().unwrap_or(0);
    let what = steps()
        .iter()
        .map(|s| request_of(s).len())
        .max()
        .unwrap_or(0);
    println!("{:<who$} {:<what$} {:>6}  why", "who", "request", "answer");
    for step in steps() {
        let caller = &callers[step.caller];
        let request = request_of(&step);
        let (shown, detail, held) = match send(proxy.addr(), caller, &step).await {
            Ok(answer) => (
                answer.status.as_u16().to_string(),
                answer.first_line,
                answer.status == step.expect,
            ),
            Err(e) => (format!("error: {e}"), String::new(), false),
        };
        all_held &= held;
        let mark = if held { "ok" } else { "UNEXPECTED" };
        println!(
            "{:<who$} {:<what$} {:>6}  {} [{mark}]",
            caller.label, request, shown, step.why
        );
        if !detail.is_empty() && step.expect.as_u16() >= 300 {
            println!("{:<who$} {:<what$} {:>6}  body: {detail}", "", "", "");
        }
        if !held {
            println!("{:<who$} expected {}", "", step.expect.as_u16());
        }
    }
    let counts = api.counts();
    println!(
        "\nThe API server was asked {} TokenReview(s) and {} SubjectAccessReview(s): requests the \
         local rules did not decide went to the Webhook authorizer, and repeated questions were \
         answered from the proxy's caches.",
        counts
            .token_reviews
            .load(std::sync::atomic::Ordering::Relaxed),
        counts
            .access_reviews
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    println!();
    let port = proxy.addr().port();
    let cert = |stem: &str| format!("--cert {0}/{stem}.crt --key {0}/{stem}.key", dir.display());
    println!("Try it by hand:");
    println!(
        "  curl --cacert {} {} https://127.0.0.1:{port}/metrics/cadvisor",
        display(&ca_file),
        cert("prometheus")
    );
    println!(
        "  curl --cacert {} {} https://127.0.0.1:{port}/pods",
        display(&ca_file),
        cert("prometheus")
    );
    println!(
        "  curl --cacert {} {} https://127.0.0.1:{port}/pods",
        display(&ca_file),
        cert("alice")
    );
    println!(
        "  curl --cacert {} https://127.0.0.1:{port}/healthz",
        display(&ca_file)
    );
    println!(
        "  curl --cacert {} -H 'Authorization: Bearer {GRAFANA_TOKEN}' https://127.0.0.1:{port}/metrics/resource",
        display(&ca_file)
    );
    println!("  curl http://{}/metrics", proxy.admin_addr());

    if args.once {
        println!(
            "\n{}",
            if all_held {
                "every answer was as expected"
            } else {
                "SOME ANSWERS WERE UNEXPECTED"
            }
        );
    } else {
        println!("\nServing until Ctrl-C.");
        crate::wait_for_signal().await?;
    }
    proxy.shutdown().await;
    drop(kubelet);
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(all_held)
}
