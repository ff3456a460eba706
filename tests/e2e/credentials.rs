//! The proxy's own credentials for the API server, as a node holds them: the kubelet's kubeconfig
//! (`/etc/kubernetes/kubelet.conf` as kubeadm writes it) naming `kubelet-client-current.pem`, a
//! symlink the kubelet swaps to a new certificate before the old one expires
//! (k8s.io/client-go v0.33 `util/certificate/certificate_store.go`: the new pair is written to a
//! dated file, then a symlink to it is renamed over `kubelet-client-current.pem`). The proxy must
//! use the new certificate for its next review without a restart, and keep the old one when the
//! new files are broken.

use std::path::{Path, PathBuf};

use base64::Engine;
use http::StatusCode;

use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, Caller, Flavour, TokenUser};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::pki::{CertSpec, Issued, serial_of};
use crate::support::process::{run, serving_flags};

const RELOADS: &str = "kubelet_auth_proxy_config_reloads_total";
const NODE_IDENTITY: &str = "system:node:node-a";

/// `/var/lib/kubelet/pki` and `/etc/kubernetes/kubelet.conf`, in a temporary directory.
struct KubeletCredentials {
    pki: PathBuf,
    kubeconfig: PathBuf,
    _dir: TempDir,
}

impl KubeletCredentials {
    /// The layout after TLS bootstrap: `first` in a dated file, `kubelet-client-current.pem`
    /// pointing at it, and the kubeconfig naming that link for both certificate and key, with
    /// the cluster CA inline (`certificate-authority-data`), as kubeadm writes it.
    fn new(api: &ApiServer, first: &Issued) -> KubeletCredentials {
        let dir = TempDir::new("kubelet-credentials");
        let pki = dir.path().join("pki");
        std::fs::create_dir(&pki).unwrap();
        let credentials = KubeletCredentials {
            kubeconfig: dir.path().join("kubelet.conf"),
            pki,
            _dir: dir,
        };
        credentials.rotate_to("kubelet-client-2026-11-25-10-00-00.pem", &pair_pem(first));
        let ca = base64::engine::general_purpose::STANDARD.encode(api.ca().pem());
        std::fs::write(
            &credentials.kubeconfig,
            format!(
                "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://{addr}
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {{}}
users:
- name: default-auth
  user:
    client-certificate: {current}
    client-key: {current}
",
                addr = api.addr(),
                current = credentials.current().display(),
            ),
        )
        .unwrap();
        credentials
    }

    fn current(&self) -> PathBuf {
        self.pki.join("kubelet-client-current.pem")
    }

    /// What the kubelet's certificate store does: the new pair in its own dated file, then a
    /// symlink to it renamed over `kubelet-client-current.pem`.
    fn rotate_to(&self, dated: &str, contents: &str) {
        std::fs::write(self.pki.join(dated), contents).unwrap();
        let staged = self.pki.join("kubelet-client-current.pem.updating");
        std::os::unix::fs::symlink(dated, &staged).unwrap();
        std::fs::rename(&staged, self.current()).unwrap();
    }
}

/// Certificate and key in one file, as the kubelet keeps them.
fn pair_pem(issued: &Issued) -> String {
    format!("{}{}", issued.chain_pem(), issued.key_pem())
}

async fn proxy(kubeconfig: &Path) -> Harness {
    ProxySpec::new(&[
        "--authentication-token-webhook",
        "--authorization-mode=AlwaysAllow",
    ])
    .kubeconfig(kubeconfig)
    .start()
    .await
}

async fn reloads(h: &Harness, result: &str) -> f64 {
    h.metric(
        RELOADS,
        &[("target", "apiserver_credentials"), ("result", result)],
    )
    .await
}

/// The serial of the client certificate the API server saw on its last call.
fn last_serial(api: &ApiServer) -> String {
    let call = api.calls().pop().expect("the API server was called");
    assert_eq!(
        call.caller,
        Some(Caller::Certificate(NODE_IDENTITY.to_owned()))
    );
    call.serial.expect("a client certificate was presented")
}

#[tokio::test]
async fn a_rotated_kubelet_client_certificate_is_used_for_the_next_review() {
    let api = ApiServer::start().await;
    for token in ["tok-1", "tok-2", "tok-3"] {
        api.add_token(token, TokenUser::new("prometheus"));
    }
    let first = api.ca().issue(&CertSpec::client(NODE_IDENTITY));
    let credentials = KubeletCredentials::new(&api, &first);
    let h = proxy(&credentials.kubeconfig).await;

    assert_eq!(h.bearer_get("/pods", "tok-1").await.status, StatusCode::OK);
    assert_eq!(last_serial(&api), serial_of(&first.chain[0]));

    let second = api.ca().issue(&CertSpec::client(NODE_IDENTITY));
    credentials.rotate_to("kubelet-client-2026-11-25-11-00-00.pem", &pair_pem(&second));
    eventually("the rotated certificate is loaded", || async {
        (reloads(&h, "applied").await >= 1.0).then_some(())
    })
    .await;
    // A new token: its review is not answered from the cache.
    assert_eq!(h.bearer_get("/pods", "tok-2").await.status, StatusCode::OK);
    assert_eq!(last_serial(&api), serial_of(&second.chain[0]));

    // A rotation caught half-written keeps the certificate in force.
    credentials.rotate_to(
        "kubelet-client-2026-11-25-12-00-00.pem",
        &second.chain_pem(),
    );
    eventually("the broken rotation is counted", || async {
        (reloads(&h, "failed").await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(h.bearer_get("/pods", "tok-3").await.status, StatusCode::OK);
    assert_eq!(last_serial(&api), serial_of(&second.chain[0]));
}

#[tokio::test]
async fn check_config_names_the_kubeconfig_whose_client_key_does_not_match() {
    let api = ApiServer::start().await;
    let issued = api.ca().issue(&CertSpec::client(NODE_IDENTITY));
    let other = api.ca().issue(&CertSpec::client(NODE_IDENTITY));
    let credentials = KubeletCredentials::new(&api, &issued);
    credentials.rotate_to(
        "kubelet-client-2026-11-25-11-00-00.pem",
        &format!("{}{}", issued.chain_pem(), other.key_pem()),
    );
    let dir = TempDir::new("credentials-check");
    let [cert, key] = serving_flags(&dir, &api.ca().issue(&CertSpec::server()));
    let args = vec![
        "check-config".to_owned(),
        "--upstream=http://127.0.0.1:1".to_owned(),
        cert,
        key,
        "--authentication-token-webhook".to_owned(),
        format!("--kubeconfig={}", credentials.kubeconfig.display()),
        "--authorization-mode=AlwaysAllow".to_owned(),
        "--node-name=node-a".to_owned(),
    ];
    let done = run(&dir, "check", &args).await;
    done.assert_code(2);
    let kubeconfig = credentials.kubeconfig.display().to_string();
    assert!(
        done.stderr.starts_with("kubelet-auth-proxy: --kubeconfig")
            && done.stderr.contains(&kubeconfig)
            && done.stderr.contains(&format!(
                "client-certificate and client-key {}",
                credentials.current().display()
            ))
            && done.stderr.contains("KeyMismatch"),
        "{}",
        done.stderr
    );
}

/// `check-config --probe` asks the API server, with the proxy's own credentials, whether it may
/// create the reviews the configuration will send, and names what is missing.
#[tokio::test]
async fn check_config_probe_asks_the_api_server_what_the_proxy_may_do() {
    let api = ApiServer::start().await;
    let kubelet = kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet::start(None)
        .await
        .unwrap();
    let dir = TempDir::new("credentials-probe");
    let [cert, key] = serving_flags(&dir, &api.ca().issue(&CertSpec::server()));
    let probe = |kubeconfig: PathBuf| {
        vec![
            "check-config".to_owned(),
            "--probe".to_owned(),
            format!("--upstream=http://{}", kubelet.addr().unwrap()),
            cert.clone(),
            key.clone(),
            "--authentication-token-webhook".to_owned(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--authorization-mode=Webhook".to_owned(),
            "--node-name=node-a".to_owned(),
        ]
    };
    let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);

    let done = run(&dir, "allowed", &probe(kubeconfig.clone())).await;
    done.assert_code(0);
    for resource in [
        "tokenreviews.authentication.k8s.io",
        "subjectaccessreviews.authorization.k8s.io",
        "the kubelet answered GET /healthz with 200",
        "fetched 1 public key(s) of the service-account issuer \
         https://kubernetes.default.svc.cluster.local",
    ] {
        assert!(
            done.stdout.contains(resource),
            "{resource}: {}",
            done.stdout
        );
    }

    api.set_caller_may_create(&[("authentication.k8s.io", "tokenreviews")]);
    let done = run(&dir, "not-allowed", &probe(kubeconfig.clone())).await;
    done.assert_code(2);
    let expected = format!(
        "kubelet-auth-proxy: --kubeconfig {}: probe: the API server does not let this identity \
         create subjectaccessreviews.authorization.k8s.io",
        kubeconfig.display()
    );
    assert!(
        done.stderr.starts_with(&expected) && done.stderr.contains("system:auth-delegator"),
        "{}",
        done.stderr
    );
    assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);

    // The issuer's keys refused: said, with the role that grants them.
    api.set_caller_may_create(&[
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ]);
    api.set_issuer_discovery_forbidden(true);
    let done = run(&dir, "no-keys", &probe(kubeconfig.clone())).await;
    done.assert_code(2);
    assert!(
        done.stderr
            .contains("cannot fetch the service-account issuer's keys")
            && done
                .stderr
                .contains("system:service-account-issuer-discovery"),
        "{}",
        done.stderr
    );
    assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    api.set_issuer_discovery_forbidden(false);

    let token = api.kubeconfig(Flavour::Token);
    let revoked = std::fs::read_to_string(&token)
        .unwrap()
        .replace(api.caller_token(), "revoked-token");
    let revoked = dir.write("revoked.kubeconfig", revoked);
    let done = run(&dir, "refused", &probe(revoked)).await;
    done.assert_code(2);
    assert!(
        done.stderr.contains("401") && done.stderr.contains("the credentials were refused"),
        "{}",
        done.stderr
    );
    // The reviews' question, then the keys' fetch, each refused once.
    assert_eq!(done.stderr.lines().count(), 2, "{}", done.stderr);
}

/// With `--authorization-mode=...RBAC...`, `check-config --probe` also asks whether the proxy's
/// identity may list and watch the kinds it will watch, and names the role that grants it.
#[tokio::test]
async fn check_config_probe_asks_whether_the_rbac_mode_may_list_and_watch() {
    let api = ApiServer::start().await;
    let kubelet = kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet::start(None)
        .await
        .unwrap();
    let dir = TempDir::new("credentials-probe-rbac");
    let [cert, key] = serving_flags(&dir, &api.ca().issue(&CertSpec::server()));
    let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);
    let probe = vec![
        "check-config".to_owned(),
        "--probe".to_owned(),
        format!("--upstream=http://{}", kubelet.addr().unwrap()),
        cert,
        key,
        format!("--kubeconfig={}", kubeconfig.display()),
        "--authentication-token-webhook".to_owned(),
        "--authorization-mode=Node,RBAC".to_owned(),
        "--pod-scoped-authz".to_owned(),
        "--node-name=node-a".to_owned(),
    ];
    let done = run(&dir, "allowed", &probe).await;
    done.assert_code(0);
    for kind in [
        "clusterroles",
        "clusterrolebindings",
        "roles",
        "rolebindings",
    ] {
        for verb in ["list", "watch"] {
            let line = format!("{verb} {kind}.rbac.authorization.k8s.io");
            assert!(done.stdout.contains(&line), "{line}: {}", done.stdout);
        }
    }

    api.set_caller_may_read_rbac(false);
    let done = run(&dir, "not-allowed", &probe).await;
    done.assert_code(2);
    let expected = format!(
        "kubelet-auth-proxy: --kubeconfig {}: probe: the API server does not let this identity \
         list clusterroles.rbac.authorization.k8s.io",
        kubeconfig.display()
    );
    assert!(
        done.stderr.contains(&expected) && done.stderr.contains("kubelet-auth-proxy:rbac-reader"),
        "{}",
        done.stderr
    );
    let failing = done
        .stderr
        .lines()
        .filter(|l| l.contains(": probe: "))
        .count();
    assert_eq!(failing, 8, "one line per verb and kind: {}", done.stderr);
}
