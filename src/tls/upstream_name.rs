//! Which name the kubelet's serving certificate must carry. By default the proxy checks the
//! upstream host, but a kubelet reached on loopback presents a certificate issued for the node
//! (its self-signed certificate is issued for the hostname; a rotated one, for the node's name
//! and addresses), never for `127.0.0.1`. So, without `--upstream-server-name`, a certificate
//! that is not valid for a loopback upstream host is also accepted when it is valid for the
//! node's name; the chain is verified against `--upstream-ca-file` either way.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

/// Verifies as `inner` does, then, on a name mismatch only, again for `node`.
#[derive(Debug)]
pub(super) struct OrNodeName {
    pub(super) inner: Arc<WebPkiServerVerifier>,
    pub(super) node: ServerName<'static>,
}

impl ServerCertVerifier for OrNodeName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let verify = |name: &ServerName<'_>| {
            self.inner
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
        };
        match verify(server_name) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => verify(&self.node),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
