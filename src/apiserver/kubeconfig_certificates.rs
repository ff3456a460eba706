//! The certificates a kubeconfig's current context uses, for their expiry metrics
//! ([`crate::base::certificates`]): the client certificate and the cluster's CA, each from the
//! file the kubeconfig names or from its inline `-data` field.

use std::path::Path;

use base64::Engine;
use kube::config::{AuthInfo, Cluster, Kubeconfig};
use rustls::pki_types::CertificateDer;

/// The current context's cluster and user, when the kubeconfig names them.
pub(super) fn current(file: &Kubeconfig) -> (Option<&Cluster>, Option<&AuthInfo>) {
    let context = file.current_context.as_ref().and_then(|name| {
        file.contexts
            .iter()
            .find(|c| &c.name == name)
            .and_then(|c| c.context.as_ref())
    });
    let cluster = context.and_then(|context| {
        file.clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
    });
    let user = context
        .and_then(|context| context.user.as_ref())
        .and_then(|name| {
            file.auth_infos
                .iter()
                .find(|u| &u.name == name)
                .and_then(|u| u.auth_info.as_ref())
        });
    (cluster, user)
}

/// The client certificate (and any chain after it) of the kubeconfig at `path`; none when it
/// authenticates otherwise.
pub fn client(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let user = current(&file).1;
    certificates(
        user.and_then(|u| u.client_certificate.as_deref()),
        user.and_then(|u| u.client_certificate_data.as_deref()),
    )
}

/// The CA certificates the kubeconfig at `path` trusts the API server with; none when it uses
/// the system's roots.
pub fn ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let cluster = current(&file).0;
    certificates(
        cluster.and_then(|c| c.certificate_authority.as_deref()),
        cluster.and_then(|c| c.certificate_authority_data.as_deref()),
    )
}

/// The PEM certificates of `file` (kube made it absolute) or of base64 `data`, whichever is set
/// (kube prefers the data, and so do we).
fn certificates(
    file: Option<&str>,
    data: Option<&str>,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = match (data, file) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| format!("inline data is not base64: {e}"))?,
        (None, Some(file)) => std::fs::read(file).map_err(|e| format!("{file}: {e}"))?,
        (None, None) => return Ok(Vec::new()),
    };
    crate::tls::parse_certs(&pem).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem()
    }

    #[test]
    fn inline_client_data_and_a_named_ca_file_are_both_read() {
        let dir = std::env::temp_dir().join(format!("kap-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (client_pem, ca_pem) = (pem("client"), pem("ca"));
        std::fs::write(dir.join("ca.crt"), &ca_pem).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let data = base64::engine::general_purpose::STANDARD.encode(&client_pem);
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:6443', certificate-authority: ca.crt}}}}]\n\
                 users: [{{name: u, user: {{client-certificate-data: {data}, client-key-data: eA==}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
            ),
        )
        .unwrap();
        let der = |pem: &str| crate::tls::parse_certs(pem.as_bytes()).unwrap().remove(0);
        assert_eq!(client(&kubeconfig).unwrap(), [der(&client_pem)]);
        assert_eq!(
            ca(&kubeconfig).unwrap(),
            [der(&ca_pem)],
            "relative to the kubeconfig"
        );
        std::fs::remove_file(dir.join("ca.crt")).unwrap();
        assert!(
            ca(&kubeconfig).is_err(),
            "a named file that is gone is an error"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
