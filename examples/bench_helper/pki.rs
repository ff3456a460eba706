//! The benchmark's throwaway certificates, made with the demo's PKI code: one CA signs the
//! serving certificates (upstream nginx, the proxies), the load client's and the proxies'
//! client certificates toward the upstream; and the local policy that lets the load client in.

use std::path::Path;

use kubelet_auth_proxy::tools::demo::pki::{Authority, Usage};

/// Subject of the load client's certificate; the benchmark policy grants it the kubelet API.
pub const CLIENT_CN: &str = "bench-client";
/// Group of the load client's certificate.
pub const CLIENT_GROUP: &str = "bench-clients";

/// Writes `ca.crt` and, each as `<stem>.crt` / `<stem>.key`: `upstream` and `proxy` (serving,
/// for 127.0.0.1 and localhost), `client` (the load client) and `proxy-client` (a proxy's
/// identity toward the upstream), and `policy.yaml`.
pub fn write_all(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let ca = Authority::new(dir, "ca", "kubelet-auth-proxy bench CA")?;
    let loopback: &[&str] = &["127.0.0.1", "localhost"];
    ca.issue("upstream", "bench-kubelet", &[], Usage::Server(loopback))?;
    ca.issue("proxy", "bench-proxy", &[], Usage::Server(loopback))?;
    ca.issue("client", CLIENT_CN, &[CLIENT_GROUP], Usage::Client)?;
    ca.issue("proxy-client", "kubelet-auth-proxy", &[], Usage::Client)?;
    std::fs::write(dir.join("policy.yaml"), policy())?;
    Ok(())
}

/// The local policy of the x509 and stream setups: the load client's group may `get` every
/// kubelet subresource the benchmark requests (healthz, metrics, logs through nodes/log or
/// nodes/proxy), and `create` nodes/proxy, which exec and port-forward upgrades need.
fn policy() -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: bench-kubelet-reader
rules:
  - apiGroups: [\"\"]
    resources: [nodes/proxy, nodes/healthz, nodes/metrics, nodes/stats, nodes/log, nodes/pods]
    verbs: [get]
  - apiGroups: [\"\"]
    resources: [nodes/proxy]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: bench-clients
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: bench-kubelet-reader
subjects:
  - kind: Group
    name: {CLIENT_GROUP}
"
    )
}
