//! The client-certificate policy of the TLS handshake: request a certificate, never require one,
//! and defer chain verification to the HTTP layer, exactly as the kubelet does (Go's
//! `RequestClientCert`, kubernetes v1.33 `cmd/kubelet/app/server.go` `InitializeTLS`), so an
//! invalid certificate becomes a 401 and does not stop a bearer token from authenticating.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// Requests a client certificate, accepts any well-formed one at the handshake, and checks that the
/// client holds the certificate's private key.
///
/// Security property: after a handshake with this verifier, the peer's certificate chain is
/// *unverified* but the peer *does* possess the leaf's private key (the handshake signature was
/// checked with the leaf's public key). Whoever reads `peer_certificates()` must verify the chain
/// against the client CA before trusting anything in it; [`crate::authn::x509`] does.
#[derive(Debug)]
pub struct RequestClientCert {
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl RequestClientCert {
    /// `hints` are the subjects of the client CA, advertised in the CertificateRequest so clients
    /// pick a certificate that can be verified (Go advertises its pool the same way).
    pub fn new(hints: Vec<DistinguishedName>) -> Self {
        RequestClientCert {
            hints,
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Chain verification happens per request in authn::x509, where a failure is a 401 rather
        // than a handshake abort. The handshake signature below is still checked.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
