//! Errors of the forwarding stage: [`ProxyError`] when a [`super::Forwarder`] cannot be built
//! from the configuration, [`ForwardError`] when one request cannot be forwarded (the server
//! answers it with 502). Messages are short and safe to show to a client and to log.

use hyper_util::client::legacy;

use super::connector::ConnectError;
use super::headers::IdentityHeaderError;

/// The upstream configuration cannot work; reported at start-up, before any request.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// An `https` upstream was configured without a TLS client configuration.
    #[error("an https upstream needs a TLS client configuration")]
    MissingTlsConfig,
    /// The TLS client configuration offers ALPN protocols other than `http/1.1`. The upstream
    /// client speaks only HTTP/1.1 (upgrades need it), so a kubelet picking `h2` would break every
    /// request; refuse the configuration instead of failing later.
    #[error("the upstream TLS configuration must not offer ALPN protocols other than http/1.1")]
    AlpnNotHttp11,
    /// The upstream authority carries user info (`user@host`), which we never send.
    #[error("the upstream address must be host[:port], without user info")]
    AuthorityWithUserInfo,
    /// The upstream host is neither a DNS name nor an IP address usable for TLS verification.
    #[error("upstream host {0:?} is not a valid TLS server name; set an upstream server name")]
    InvalidServerName(String),
}

/// Why one request could not be forwarded. `Display` is a fixed phrase that never contains a
/// header value, token, host or path, so the server may put it in a 502 body and in logs; the
/// `source()` chain has the detail for logs.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// TCP or unix-socket connect failed (refused, unreachable, name not resolved).
    #[error("upstream connection failed")]
    Connect(#[source] legacy::Error),
    /// The TLS handshake with the kubelet failed (certificate not trusted, wrong name, ...).
    #[error("upstream TLS handshake failed")]
    Tls(#[source] legacy::Error),
    /// Connecting (including the TLS handshake) took longer than the connect timeout.
    #[error("upstream connect timed out")]
    Timeout(#[source] legacy::Error),
    /// The kubelet closed the connection or sent something that is not valid HTTP/1.1.
    #[error("upstream protocol error")]
    Protocol(#[source] legacy::Error),

    /// The caller's request body could not be read (a malformed chunked encoding, a connection
    /// cut mid-body): the caller's fault, not the kubelet's.
    #[error("malformed request body")]
    CallerBody(#[source] legacy::Error),
    /// The kubelet answered `101 Switching Protocols` to a request that asked for no upgrade.
    #[error("upstream switched protocols unasked")]
    UnexpectedSwitchingProtocols,
    /// A user attribute cannot be carried in an identity header; the request is not sent
    /// rather than sent with a different identity.
    #[error("cannot forward the caller's identity")]
    IdentityHeader(#[from] IdentityHeaderError),
    /// The request cannot be forwarded unchanged: `CONNECT`, or a request target that is not an
    /// absolute path (`*`, authority form).
    #[error("request cannot be forwarded")]
    UnsupportedRequest,
    /// No place for the request among those in flight to the kubelet (429 for the user's share,
    /// 503 for the total); never sent.
    #[error(transparent)]
    Busy(#[from] super::Busy),
}

impl ForwardError {
    /// Classifies a client error by the connector error in its source chain, if any.
    pub(crate) fn from_client(err: legacy::Error) -> ForwardError {
        let mut source = std::error::Error::source(&err);
        while let Some(e) = source {
            // The only user error the forwarder can cause is the request body failing, which is
            // the caller's stream.
            if e.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_user)
            {
                return ForwardError::CallerBody(err);
            }
            if let Some(connect) = e.downcast_ref::<ConnectError>() {
                return match connect {
                    ConnectError::Timeout => ForwardError::Timeout(err),
                    ConnectError::Tls(_) => ForwardError::Tls(err),
                    ConnectError::Tcp(_) | ConnectError::Unix(_) => ForwardError::Connect(err),
                };
            }
            source = e.source();
        }
        if err.is_connect() {
            ForwardError::Connect(err)
        } else {
            ForwardError::Protocol(err)
        }
    }
}
