//! Why the kubelet could not be reached, in words an operator can act on: the error chain of a
//! failed forward is searched for the OS error or the rustls error underneath, and each known
//! cause gets a name (a metrics label) and a hint naming the flag to look at.

use std::error::Error as StdError;
use std::io;

use rustls::{AlertDescription, CertificateError};

use super::ForwardError;
use super::forwarder::UPSTREAM_READ_BUFFER_MAX;

/// The kinds of upstream failure, a small fixed set (metrics label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Nothing listens on the upstream address.
    Refused,
    /// No connection within `--upstream-connect-timeout`.
    Timeout,
    /// The kubelet's certificate is not signed by `--upstream-ca-file`.
    UnknownCa,
    /// The kubelet's certificate is not issued for the name the proxy checks.
    NameMismatch,
    /// The kubelet's certificate has expired or is not valid yet.
    Expired,
    /// The kubelet presents a CA certificate as its serving certificate.
    CaAsEndEntity,
    /// The kubelet refused the proxy's client certificate.
    ClientCertRejected,
    /// Another TLS failure.
    Tls,
    /// The kubelet closed the connection or answered something that is not HTTP/1.1.
    Protocol,
    /// Anything else.
    Other,
}

impl Cause {
    /// Every cause, so that each one's counter exists at 0 from the start: Prometheus's
    /// `increase()` misses the first failure of a series that appears already at 1.
    pub const ALL: [Cause; 10] = [
        Cause::Refused,
        Cause::Timeout,
        Cause::UnknownCa,
        Cause::NameMismatch,
        Cause::Expired,
        Cause::CaAsEndEntity,
        Cause::ClientCertRejected,
        Cause::Tls,
        Cause::Protocol,
        Cause::Other,
    ];

    /// The metrics label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Refused => "connection_refused",
            Cause::Timeout => "timeout",
            Cause::UnknownCa => "unknown_ca",
            Cause::NameMismatch => "name_mismatch",
            Cause::Expired => "certificate_expired",
            Cause::CaAsEndEntity => "ca_used_as_end_entity",
            Cause::ClientCertRejected => "client_certificate_rejected",
            Cause::Tls => "tls",
            Cause::Protocol => "protocol",
            Cause::Other => "other",
        }
    }
}

/// A failure's cause and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// The kind, for metrics and rate-limited logging.
    pub cause: Cause,
    /// The cause in words with a hint; never a credential or a request field.
    pub detail: String,
}

/// Finds the cause of a failed forward.
pub fn diagnose(error: &ForwardError) -> Diagnosis {
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return tls_cause(tls);
        }
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse_too_large)
        {
            return diagnosis(
                Cause::Protocol,
                format!(
                    "the kubelet's response head is larger than {} KiB, the most the proxy reads",
                    UPSTREAM_READ_BUFFER_MAX / 1024
                ),
            );
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                return tls_cause(tls);
            }
            if io.kind() == io::ErrorKind::ConnectionRefused {
                return diagnosis(
                    Cause::Refused,
                    "connection refused: is the kubelet listening on --upstream?".to_owned(),
                );
            }
        }
        next = e.source();
    }
    match error {
        ForwardError::Timeout(_) => diagnosis(
            Cause::Timeout,
            "no connection within --upstream-connect-timeout: is --upstream the kubelet's \
             address, and is it up?"
                .to_owned(),
        ),
        ForwardError::Protocol(_) => diagnosis(
            Cause::Protocol,
            format!(
                "{}: the kubelet closed the connection or did not speak HTTP/1.1",
                chain(error)
            ),
        ),
        _ => diagnosis(Cause::Other, chain(error)),
    }
}

fn diagnosis(cause: Cause, detail: String) -> Diagnosis {
    Diagnosis { cause, detail }
}

/// A rustls error in words with a hint.
fn tls_cause(error: &rustls::Error) -> Diagnosis {
    match error {
        rustls::Error::InvalidCertificate(certificate) => certificate_cause(certificate),
        rustls::Error::AlertReceived(alert) if rejects_client_certificate(*alert) => diagnosis(
            Cause::ClientCertRejected,
            format!(
                "the kubelet rejected our client certificate ({alert:?} alert): \
                 --upstream-client-cert-file must be issued by the CA of the kubelet's \
                 authentication.x509.clientCAFile"
            ),
        ),
        other => diagnosis(Cause::Tls, format!("TLS: {other}")),
    }
}

/// Alerts a TLS server sends when it does not accept the client's certificate.
fn rejects_client_certificate(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::BadCertificate
            | AlertDescription::CertificateRequired
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateExpired
            | AlertDescription::AccessDenied
    )
}

/// Why the kubelet's serving certificate was not accepted.
fn certificate_cause(error: &CertificateError) -> Diagnosis {
    match error {
        CertificateError::UnknownIssuer => diagnosis(
            Cause::UnknownCa,
            "unknown CA: the kubelet's serving certificate is not issued by a CA in \
             --upstream-ca-file"
                .to_owned(),
        ),
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => diagnosis(
            Cause::NameMismatch,
            format!(
                "name mismatch: the kubelet's certificate is presented for {}, want {}: set \
                 --upstream-server-name to one of its names",
                presented.join(", "),
                expected.to_str()
            ),
        ),
        CertificateError::NotValidForName => diagnosis(
            Cause::NameMismatch,
            "name mismatch: the kubelet's certificate is not issued for the upstream host: set \
             --upstream-server-name to one of its names"
                .to_owned(),
        ),
        CertificateError::Expired
        | CertificateError::ExpiredContext { .. }
        | CertificateError::NotValidYet
        | CertificateError::NotValidYetContext { .. } => diagnosis(
            Cause::Expired,
            format!("the kubelet's serving certificate is not valid now: {error}"),
        ),
        CertificateError::Other(other)
            if other
                .0
                .downcast_ref::<webpki::Error>()
                .is_some_and(|e| matches!(e, webpki::Error::CaUsedAsEndEntity)) =>
        {
            diagnosis(
                Cause::CaAsEndEntity,
                "the kubelet's serving certificate is a CA certificate (CA:TRUE, as `openssl \
                 req -x509` makes them): issue it from a CA and give that CA to \
                 --upstream-ca-file"
                    .to_owned(),
            )
        }
        other => diagnosis(
            Cause::Tls,
            format!("the kubelet's serving certificate is not accepted: {other}"),
        ),
    }
}

/// The error and its sources, `: `-separated.
fn chain(error: &dyn StdError) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_ca_certificate_served_as_the_kubelets_own_is_named() {
        let webpki_error: Arc<dyn StdError + Send + Sync> =
            Arc::new(webpki::Error::CaUsedAsEndEntity);
        let error = rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
            webpki_error,
        )));
        let found = tls_cause(&error);
        assert_eq!(found.cause, Cause::CaAsEndEntity);
        assert!(
            found.detail.contains("openssl req -x509"),
            "{}",
            found.detail
        );
    }
}
