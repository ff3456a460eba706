//! The HTTPS side of an issuer's keys: one client per issuer (its `certificateAuthority`, else
//! the host's roots), the discovery document, then the key set its `jwks_uri` names.
//!
//! The client follows redirects as Go's `http.Client` does (301, 302, 303, 307 and 308 with a
//! `Location`; at most 10 requests in all, the 10th redirect refused with Go's "stopped after 10
//! redirects"), but only to https URLs: a key set read over plain HTTP could be anyone's. Every
//! request, its redirects and its body included, ends within [`REQUEST_TIMEOUT`], and no answer
//! is read past [`MAX_DOCUMENT_BYTES`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{LOCATION, USER_AGENT};
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};
use serde::Deserialize;

use super::jwks::{self, JwksError, KeySet};
use super::metrics::hash_label;
use super::{IssuerSource, KeysError};

/// How long one request may take, its redirects and the reading of its body included.
/// kube-apiserver's client allows 30 s; a third of that is ample for a document of a few KiB,
/// and bounds the wait of a token whose unknown key id asks for a fetch (discovery, then the key
/// set) to 20 s, within what clients of the kubelet API wait.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest discovery document or key set read, in bytes. kube-apiserver reads whatever
/// comes (within its 30 s); here a bound keeps a wrong URL (a file, a page) from costing the node
/// memory. A discovery document is a few KiB; a key set is about 0.5 KiB per RSA key and 2 to
/// 4 KiB per key with an `x5c` chain (Entra ID's, with about ten such keys, is under 20 KiB), so
/// 512 KiB holds over a hundred keys with their chains.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

/// At most this many requests for one document, redirects included (Go's default policy).
const MAX_REQUESTS: usize = 10;

/// Where an issuer publishes its discovery document, below its URL.
const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// Who asks.
const USER_AGENT_VALUE: &str = concat!("kubelet-auth-proxy/", env!("CARGO_PKG_VERSION"));

/// One request that brought no document.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not a URL.
    #[error("not a URL: {0}")]
    Url(#[source] http::uri::InvalidUri),
    /// A URL, but not an https one with a host.
    #[error("{0:?} is not an https URL")]
    NotHttps(String),
    /// The connection, the TLS handshake or the exchange failed.
    #[error("{0}")]
    Send(#[source] hyper_util::client::legacy::Error),
    /// No complete answer within [`REQUEST_TIMEOUT`].
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    /// The 10th redirect.
    #[error("stopped after 10 redirects")]
    Redirects,
    /// A redirect whose `Location` is not text.
    #[error("a redirect whose Location is not text")]
    BadRedirect,
    /// An answer other than 200 OK.
    #[error("answered {0}")]
    Status(StatusCode),
    /// An answer longer than [`MAX_DOCUMENT_BYTES`].
    #[error("the answer is longer than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    /// The answer's body could not be read.
    #[error("reading the answer: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl RequestError {
    /// A short name of the cause, to say each once a minute.
    pub fn cause(&self) -> &'static str {
        match self {
            RequestError::Url(_) | RequestError::NotHttps(_) => "url",
            RequestError::Send(e) if is_tls_failure(e) => "tls",
            RequestError::Send(_) => "connect",
            RequestError::Timeout(_) => "timeout",
            RequestError::Redirects | RequestError::BadRedirect => "redirect",
            RequestError::Status(_) => "status",
            RequestError::TooLarge => "too_large",
            RequestError::Body(_) => "body",
        }
    }
}

/// Whether a client error was the TLS handshake's (most often: the issuer's certificate is not
/// signed by a trusted CA). rustls' error reaches us inside `io::Error`s, whose `source` skips
/// the error they wrap, so the walk opens them.
fn is_tls_failure(error: &hyper_util::client::legacy::Error) -> bool {
    let mut link: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = link {
        if e.is::<rustls::Error>() {
            return true;
        }
        link = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}

/// A fetch of the issuer's keys that failed; the keys held, if any, are kept. The messages of
/// go-oidc's errors are kept where there is one, so that the log reads as kube-apiserver's.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A document could not be fetched.
    #[error("GET {url}: {source}")]
    Request {
        /// What was asked for.
        url: String,
        /// Why it did not come.
        #[source]
        source: RequestError,
    },
    /// The discovery document is not one.
    #[error("{url}: oidc: failed to decode provider discovery object: {source}")]
    Discovery {
        /// Where it was read.
        url: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The discovery document names another issuer.
    #[error(
        "{url}: oidc: issuer did not match the issuer returned by provider, expected {expected:?} got {got:?}"
    )]
    IssuerMismatch {
        /// Where it was read.
        url: String,
        /// The configured issuer URL.
        expected: String,
        /// The document's `issuer`.
        got: String,
    },
    /// The discovery document names no key set.
    #[error("{url}: provider did not return JWKS URL")]
    NoJwksUri {
        /// Where it was read.
        url: String,
    },
    /// The key set is not one go-jose reads.
    #[error("{url}: oidc: failed to decode keys: {source}")]
    Jwks {
        /// Where it was read.
        url: String,
        /// Why.
        #[source]
        source: JwksError,
    },
}

impl FetchError {
    /// The URL that failed.
    pub fn url(&self) -> &str {
        match self {
            FetchError::Request { url, .. }
            | FetchError::Discovery { url, .. }
            | FetchError::IssuerMismatch { url, .. }
            | FetchError::NoJwksUri { url }
            | FetchError::Jwks { url, .. } => url,
        }
    }

    /// A short name of the cause, to say each once a minute.
    pub fn cause(&self) -> &'static str {
        match self {
            FetchError::Request { source, .. } => source.cause(),
            FetchError::Discovery { .. } => "discovery",
            FetchError::IssuerMismatch { .. } => "issuer_mismatch",
            FetchError::NoJwksUri { .. } => "no_jwks_uri",
            FetchError::Jwks { .. } => "jwks",
        }
    }

    /// What to look at, for logs and `check-config --probe`.
    pub fn hint(&self) -> &'static str {
        match self.cause() {
            "tls" => {
                "the issuer's certificate is not trusted: set issuer.certificateAuthority to the \
                 CA that signed it (without one, the host's CA certificates are used)"
            }
            "connect" | "timeout" => {
                "the issuer cannot be reached from this node: check its DNS name, the routes, \
                 proxies and firewalls towards it"
            }
            "url" | "redirect" => {
                "the issuer, its discoveryURL, jwks_uri or a redirect is not an https URL that \
                 can be followed"
            }
            "status" | "too_large" | "body" | "discovery" | "no_jwks_uri" => {
                "the URL does not serve an OpenID discovery document and key set: check \
                 issuer.url and issuer.discoveryURL"
            }
            "issuer_mismatch" => {
                "the discovery document names another issuer: issuer.url must equal its \
                 `issuer` exactly (scheme, host, path, trailing slash)"
            }
            _ => "the issuer publishes a key set kube-apiserver cannot read either",
        }
    }
}

/// `url` as a URI the client asks: https, with a host.
pub(crate) fn https_uri(url: &str) -> Result<Uri, RequestError> {
    let uri: Uri = url.parse().map_err(RequestError::Url)?;
    if uri.scheme() != Some(&http::uri::Scheme::HTTPS) || uri.host().is_none_or(str::is_empty) {
        return Err(RequestError::NotHttps(url.to_owned()));
    }
    Ok(uri)
}

/// An issuer's HTTPS client.
pub(crate) struct IssuerClient {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl IssuerClient {
    /// A client trusting `certificate_authority` (PEM) alone when given, else the host's CA
    /// certificates, as kube-apiserver does.
    pub(crate) fn new(certificate_authority: Option<&str>) -> Result<IssuerClient, KeysError> {
        let mut roots = RootCertStore::empty();
        match certificate_authority {
            Some(pem) => {
                let certificates = crate::tls::parse_certs(pem.as_bytes())
                    .map_err(KeysError::CertificateAuthority)?;
                for (i, certificate) in certificates.into_iter().enumerate() {
                    roots.add(certificate).map_err(|source| KeysError::Root {
                        index: i + 1,
                        source,
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(KeysError::NoHostRoots {
                        first: found.errors.into_iter().next(),
                    });
                }
            }
        }
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(KeysError::Tls)?
                .with_root_certificates(roots)
                .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .build();
        Ok(IssuerClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// The body of a 200 answer to a GET of `url`, redirects followed (see the module).
    pub(crate) async fn get(&self, url: &str) -> Result<Bytes, RequestError> {
        let uri = https_uri(url)?;
        tokio::time::timeout(REQUEST_TIMEOUT, self.get_following(uri))
            .await
            .map_err(|_| RequestError::Timeout(REQUEST_TIMEOUT))?
    }

    async fn get_following(&self, mut uri: Uri) -> Result<Bytes, RequestError> {
        let mut sent = 0;
        loop {
            let mut request = Request::new(Empty::new());
            *request.uri_mut() = uri.clone();
            request
                .headers_mut()
                .insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
            let response = self
                .client
                .request(request)
                .await
                .map_err(RequestError::Send)?;
            sent += 1;
            let status = response.status();
            let redirect = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
            // A redirect without a Location is an answer like any other (as in Go).
            if let Some(location) = response.headers().get(LOCATION).filter(|_| redirect) {
                if sent == MAX_REQUESTS {
                    return Err(RequestError::Redirects);
                }
                let location = location.to_str().map_err(|_| RequestError::BadRedirect)?;
                uri = https_uri(&resolve(&uri, location))?;
                continue;
            }
            if status != StatusCode::OK {
                return Err(RequestError::Status(status));
            }
            let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<LengthLimitError>() {
                        RequestError::TooLarge
                    } else {
                        RequestError::Body(e)
                    }
                })?;
            return Ok(body.to_bytes());
        }
    }
}

/// A redirect's `Location` resolved against the URL it answered (RFC 3986 section 5.2, as Go's
/// `URL.Parse`): absolute, scheme-relative, absolute-path or relative; the fragment dropped.
pub(super) fn resolve(base: &Uri, location: &str) -> String {
    let location = location.split_once('#').map_or(location, |(l, _)| l);
    let scheme_end = location.find(':');
    let has_scheme = scheme_end.is_some_and(|end| {
        let scheme = &location[..end];
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if has_scheme {
        return location.to_owned();
    }
    let scheme = base.scheme_str().unwrap_or("https");
    if location.starts_with("//") {
        return format!("{scheme}:{location}");
    }
    let authority = base.authority().map_or("", |a| a.as_str());
    let (path, query) = match location.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (location, None),
    };
    let path = if path.starts_with('/') {
        remove_dot_segments(path)
    } else if path.is_empty() {
        base.path().to_owned()
    } else {
        // `Uri::path` is never empty: at least "/".
        let base_path = base.path();
        let directory = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
        remove_dot_segments(&format!("{directory}{path}"))
    };
    let query = match query {
        Some(query) => format!("?{query}"),
        None if location.is_empty() => base.query().map(|q| format!("?{q}")).unwrap_or_default(),
        None => String::new(),
    };
    format!("{scheme}://{authority}{path}{query}")
}

/// RFC 3986 section 5.2.4 on an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut kept: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            other => {
                kept.push(other);
                continue;
            }
        }
        if last {
            kept.push("");
        }
    }
    format!("/{}", kept.join("/"))
}

/// The members of a discovery document go-oidc reads. One of them of the wrong JSON type fails
/// the document, as in Go; `null` is as if absent.
#[derive(Deserialize)]
struct Discovery {
    #[serde(default)]
    issuer: Option<String>,
    #[serde(default)]
    jwks_uri: Option<String>,
    /// Read only so that a non-string one fails the document as in go-oidc.
    #[serde(default, rename = "authorization_endpoint")]
    _authorization_endpoint: Option<String>,
    #[serde(default, rename = "token_endpoint")]
    _token_endpoint: Option<String>,
    #[serde(default, rename = "userinfo_endpoint")]
    _userinfo_endpoint: Option<String>,
}

/// What a fetch brought.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// Where the discovery document was read.
    pub(crate) discovery_url: String,
    /// Where the key set was read.
    pub(crate) jwks_uri: String,
    /// kube-apiserver's label of the key set document.
    pub(crate) key_set_hash: String,
    /// The keys.
    pub(crate) set: KeySet,
}

/// Where `source`'s discovery document is: `discoveryURL`, else the issuer URL less one
/// trailing slash, then [`DISCOVERY_PATH`] (go-oidc's `NewProvider`).
pub(crate) fn discovery_url(source: &IssuerSource) -> String {
    match &source.discovery_url {
        Some(url) => url.clone(),
        None => format!(
            "{}{DISCOVERY_PATH}",
            source.url.strip_suffix('/').unwrap_or(&source.url)
        ),
    }
}

/// One fetch: the discovery document, whose `issuer` must be `source.url` exactly, then the key
/// set at its `jwks_uri`, through `client`.
pub(crate) async fn fetch(
    client: &IssuerClient,
    source: &IssuerSource,
) -> Result<Fetched, FetchError> {
    let url = discovery_url(source);
    let body = client
        .get(&url)
        .await
        .map_err(|source| FetchError::Request {
            url: url.clone(),
            source,
        })?;
    // An object first: a derived struct would also take an array.
    let discovery = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body)
        .and_then(|object| serde_json::from_value::<Discovery>(object.into()))
        .map_err(|source| FetchError::Discovery {
            url: url.clone(),
            source,
        })?;
    let issuer = discovery.issuer.unwrap_or_default();
    if issuer != source.url {
        return Err(FetchError::IssuerMismatch {
            url,
            expected: source.url.clone(),
            got: issuer,
        });
    }
    let jwks_uri = discovery.jwks_uri.unwrap_or_default();
    if jwks_uri.is_empty() {
        return Err(FetchError::NoJwksUri { url });
    }
    let body = client
        .get(&jwks_uri)
        .await
        .map_err(|source| FetchError::Request {
            url: jwks_uri.clone(),
            source,
        })?;
    let set = jwks::parse(&body).map_err(|source| FetchError::Jwks {
        url: jwks_uri.clone(),
        source,
    })?;
    Ok(Fetched {
        discovery_url: url,
        key_set_hash: hash_label(&body),
        jwks_uri,
        set,
    })
}
