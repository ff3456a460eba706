//! A fresh kubeadm-style node put behind the proxy with the shipped files and the recipes of
//! docs/OPERATIONS.md, from nothing to a working scrape and exec. The node's files live under a
//! temporary root at kubeadm's paths; the kubelet is the stand-in, moved to `[::1]` as
//! `config/kubelet-config.yaml` says, trusting only the private upstream client CA; the proxy
//! runs the command line of `systemd/kubelet-auth-proxy.env` with its files as the unit hands
//! them over (`LoadCredential=`, and the credential copy of
//! `systemd/kubelet-auth-proxy-credentials.service`, run for real). Only the ports differ: the
//! kubelet's and the proxy's are free ones, given as overrides at the end of the command line
//! (the last of a repeated flag wins).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;

use crate::manifests::{environment_file, file, read, unit_settings};
use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, TokenUser};
use crate::support::client::{Client, Identity, Reply, plain_get};
use crate::support::pki::{Authority, CertSpec, Issued};
use crate::support::process::{ProxyProcess, run};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession};
use crate::support::{eventually, within};

const NODE: &str = "node-1";

/// A directory standing for `/`.
struct Root(TempDir);

impl Root {
    /// `path` (absolute) under the root.
    fn at(&self, path: &str) -> PathBuf {
        self.0.path().join(path.trim_start_matches('/'))
    }

    /// Writes `contents` at `path`, creating its directories.
    fn write(&self, path: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let at = self.at(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(&at, contents).unwrap();
        at
    }

    /// Every absolute path in `text` that starts with one of the node's top directories, rooted.
    fn rooted(&self, text: &str) -> String {
        let root = self.0.path().display().to_string();
        let mut out = text.to_owned();
        for top in ["/etc/", "/var/", "/run/"] {
            out = out.replace(&format!("={top}"), &format!("={root}{top}"));
            out = out.replace(&format!(": {top}"), &format!(": {root}{top}"));
            out = out.replace(&format!(" {top}"), &format!(" {root}{top}"));
        }
        out
    }
}

/// The code block of docs/OPERATIONS.md that begins with `first_line`.
fn documented_block(first_line: &str) -> String {
    let doc = read(&file("docs/OPERATIONS.md"));
    let start = doc
        .find(first_line)
        .unwrap_or_else(|| panic!("OPERATIONS.md has no block starting {first_line:?}"));
    let block = &doc[start..];
    block[..block.find("```").unwrap()].to_owned()
}

#[tokio::test]
async fn a_kubeadm_node_goes_behind_the_proxy_with_the_shipped_files() {
    let started = Instant::now();
    // The cluster: its API server, whose CA is the cluster CA.
    let api = ApiServer::start().await;
    let root = Root(TempDir::new("kubeadm-node"));

    // What kubeadm and TLS bootstrap left on the node.
    root.write("/etc/kubernetes/pki/ca.crt", api.ca().pem());
    let kubelet_ca = Authority::root(&format!("{NODE}-ca@1764000000"));
    let serving = kubelet_ca.issue(&CertSpec::server().names(&[NODE]));
    // The kubelet's self-signed pair: its certificate file carries the leaf and its own CA.
    root.write(
        "/var/lib/kubelet/pki/kubelet.crt",
        format!("{}{}", serving.chain_pem(), kubelet_ca.pem()),
    );
    root.write("/var/lib/kubelet/pki/kubelet.key", serving.key_pem());
    let node_client = api
        .ca()
        .issue(&CertSpec::client(&format!("system:node:{NODE}")).org("system:nodes"));
    root.write(
        "/var/lib/kubelet/pki/kubelet-client-2026-11-25-09-00-00.pem",
        format!("{}{}", node_client.chain_pem(), node_client.key_pem()),
    );
    std::os::unix::fs::symlink(
        "kubelet-client-2026-11-25-09-00-00.pem",
        root.at("/var/lib/kubelet/pki/kubelet-client-current.pem"),
    )
    .unwrap();

    // The private upstream client CA and the proxy's certificate (OPERATIONS.md, "The kubelet's
    // client CA"), where the environment file names them.
    let upstream_ca = Authority::root("kubelet-auth-proxy upstream client CA");
    let proxy_cert = upstream_ca.issue(&CertSpec::client("kubelet-auth-proxy"));
    root.write(
        "/etc/kubelet-auth-proxy/upstream-client-ca.crt",
        upstream_ca.pem(),
    );
    root.write(
        "/etc/kubelet-auth-proxy/upstream-client.crt",
        proxy_cert.chain_pem(),
    );
    root.write(
        "/etc/kubelet-auth-proxy/upstream-client.key",
        proxy_cert.key_pem(),
    );

    // The kubelet moved as config/kubelet-config.yaml says: the IPv6 loopback, clients of the
    // private CA only.
    let kubelet_config = read(&file("config/kubelet-config.yaml"));
    assert!(kubelet_config.contains("\naddress: \"::1\"\n"));
    let kubelet = within(
        "starting the kubelet on [::1]",
        StandInKubelet::start_at(
            "[::1]:0".parse().unwrap(),
            Some(kubelet_tls(&serving, &upstream_ca)),
        ),
    )
    .await
    .unwrap();
    let kubelet_addr = kubelet.addr().unwrap();

    // The unit's hand-over: LoadCredential= copies the serving pair at start...
    let unit = unit_settings(&read(&file("systemd/kubelet-auth-proxy.service")));
    for (_, value) in unit.iter().filter(|(key, _)| key == "LoadCredential") {
        let (name, source) = value.split_once(':').unwrap();
        let copy = root.at(&format!(
            "/run/credentials/kubelet-auth-proxy.service/{name}"
        ));
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(root.at(source), copy).unwrap();
    }
    // ...the credential copy runs its commands (its group: ours, there is no service user here)...
    let copy_unit = unit_settings(&read(&file(
        "systemd/kubelet-auth-proxy-credentials.service",
    )));
    let gid = String::from_utf8(
        std::process::Command::new("id")
            .arg("-g")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for (_, command) in copy_unit.iter().filter(|(key, _)| key == "ExecStart") {
        let command = root
            .rooted(command)
            .replace("-g kubelet-auth-proxy", &format!("-g {}", gid.trim()));
        let words: Vec<&str> = command.split_whitespace().collect();
        let status = std::process::Command::new(words[0])
            .args(&words[1..])
            .status()
            .unwrap();
        assert!(status.success(), "{command}");
    }
    // ...the kubeconfig is OPERATIONS.md's, with the cluster's address...
    let kubeconfig = documented_block("# /etc/kubelet-auth-proxy/kubeconfig").replace(
        "https://api.cluster.example:6443",
        &format!("https://{}", api.addr()),
    );
    root.write(
        "/etc/kubelet-auth-proxy/kubeconfig",
        root.rooted(&kubeconfig),
    );
    // ...and the shipped policies (the directory's kustomization.yaml is the DaemonSet's
    // Component that mounts them, not a policy).
    for policy in std::fs::read_dir(file("config/policy")).unwrap() {
        let policy = policy.unwrap().path();
        let name = policy.file_name().unwrap().to_str().unwrap().to_owned();
        if name == "kustomization.yaml" {
            continue;
        }
        root.write(
            &format!("/etc/kubelet-auth-proxy/policy/{name}"),
            read(&policy),
        );
    }
    std::fs::create_dir_all(root.at("/var/log/kubelet-auth-proxy")).unwrap();

    // The environment file's command line, rooted, with free ports: its --listen-address is
    // replaced (a repeatable flag collects every value), the others overridden.
    let env = environment_file(&read(&file("systemd/kubelet-auth-proxy.env")));
    let mut args: Vec<String> = root
        .rooted(&format!(" {}", env["KUBELET_AUTH_PROXY_ARGS"]))
        .split_whitespace()
        .filter(|arg| !arg.starts_with("--listen-address="))
        .map(str::to_owned)
        .collect();
    args.extend([
        format!("--upstream=https://{kubelet_addr}"),
        "--listen-address=127.0.0.1:0".to_owned(),
        "--admin-listen-address=127.0.0.1:0".to_owned(),
        format!("--node-name={NODE}"),
    ]);

    // check-config --probe, as OPERATIONS.md says to run before starting.
    let mut probe = vec!["check-config".to_owned(), "--probe".to_owned()];
    probe.extend(args.iter().cloned());
    let done = run(&root.0, "probe", &probe).await;
    done.assert_code(0);
    assert!(
        !done.stderr.contains("warning"),
        "the shipped files warn: {}",
        done.stderr
    );

    let proxy = ProxyProcess::start(&root.0, "proxy", &args, &[]).await;
    let ready = Instant::now();

    // Prometheus scrapes with its service account token (TokenReview at the API server, the
    // shipped metrics-scraper policy on the node).
    api.add_token(
        "prometheus-token",
        TokenUser::new("system:serviceaccount:monitoring:prometheus").groups(&[
            "system:serviceaccounts",
            "system:serviceaccounts:monitoring",
        ]),
    );
    let kubelet_ca_cert = kubelet_ca.cert();
    let prometheus = Client::new(kubelet_ca_cert, proxy.addr(), Identity::None).for_name(NODE);
    let scrape: Reply = prometheus
        .get_with_token("/metrics/cadvisor", "prometheus-token")
        .await;
    assert_eq!(scrape.status, StatusCode::OK, "{}", scrape.text());

    // kubectl exec: the API server's kubelet client certificate, as kubeadm issues it.
    let apiserver_client = api
        .ca()
        .issue(&CertSpec::client("kube-apiserver-kubelet-client").org("kubeadm:cluster-admins"));
    let kubectl = Client::http1(
        kubelet_ca_cert,
        proxy.addr(),
        Identity::of(&apiserver_client),
    )
    .for_name(NODE);
    let mut session = ExecSession::open(&kubectl, EXEC_PROTOCOL).await;
    session.echo(b"date\n").await;
    session.close().await;

    // Both are in the audit log (written by its own task, so awaited); the proxy is ready.
    let log = root.at("/var/log/kubelet-auth-proxy/audit.log");
    eventually("the scrape and the exec in the audit log", || async {
        let audit = std::fs::read_to_string(&log).unwrap_or_default();
        (audit.contains("/metrics/cadvisor") && audit.contains("/exec/")).then_some(())
    })
    .await;
    // Ready once the RBAC mode's first lists are in (after a random part of the shipped 5 s
    // start jitter).
    eventually("/readyz", || async {
        (plain_get(proxy.admin_addr(), "/readyz").await.status == StatusCode::OK).then_some(())
    })
    .await;
    eprintln!(
        "walk-through: node set up and checked in {:?}; proxy serving to scrape and exec in {:?}; \
         {:?} in all",
        ready - started,
        ready.elapsed(),
        started.elapsed()
    );
    drop(kubelet);
}

/// The moved kubelet's TLS: its own serving pair, and client certificates required from
/// `client_ca` (its `authentication.x509.clientCAFile`).
fn kubelet_tls(serving: &Issued, client_ca: &Authority) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(client_ca.cert().clone()).unwrap();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    Arc::new(
        ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(serving.chain.clone(), serving.key())
            .unwrap(),
    )
}
