//! The [`Forwarder`]: rewrites an authorized request for the kubelet (URI, version, headers),
//! sends it through the pooled client, cleans the answer, and hands upgrades to the splicer.

use crate::base::shutdown::Shutdown;
use std::sync::Arc;
use std::time::Duration;

use super::UpstreamBody;
use super::coalesce::Coalesced;
use super::connector::{Endpoint, UpstreamConnector, UpstreamTlsConfig};
use super::drained::Drained;
use super::limits::{Leased, UpstreamLimits};
use super::{ForwardError, ForwardOptions, ProxyError, UpstreamTarget, headers, upgrade};
use crate::authn::User;
use http::header::{HOST, HeaderValue};
use http::uri::{Authority, Scheme, Uri};
use http::{Extensions, Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::ServerName;

/// The authority of the URIs given to the pooled client. It only names the pool: the connector
/// dials the configured kubelet whatever the URI says, `Host` is set from the real authority, and
/// HTTP/1.1 requests go out in origin form (the path alone). hyper-util hashes the authority byte
/// by byte with SipHash at every checkout and every return of a connection: the real one
/// (`127.0.0.1:10250`) cost about 2,000 instructions per request under callgrind, one byte a
/// tenth of that.
const POOL_AUTHORITY: Authority = Authority::from_static("k");

/// Idle upstream connections are closed after this long (the kubelet's own idle timeout is
/// longer, so we close first and never reuse a connection it is closing).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// At most this many idle connections are kept, in each pool (one per serving thread). It must be
/// above the number of requests in flight at busy times: a connection returned to a full pool is
/// closed, and the next request pays a new TLS handshake with the kubelet (measured: a cap of 32
/// under 64 concurrent clients opened 10,230 connections in 10 s and cut throughput twentyfold).
/// Idle connections still close after `POOL_IDLE_TIMEOUT`.
const POOL_MAX_IDLE: usize = 1024;
/// Most bytes hyper buffers from an upstream connection; a response head still incomplete at this
/// size is refused (502, cause `protocol`). With hyper's default (about 400 KiB) each
/// connection's read buffer grows while a large body streams, its chunks still holding the
/// buffers they were cut from: 64 responses of 1 MiB at once peaked at 76 MiB of RSS (nginx 55).
/// 64 KiB: 33 MiB, for 4% more CPU per response and the same streaming rate; 16 KiB: 26 MiB, but
/// 22% more CPU, as every read then carries less than a TLS record. Measured in
/// docs/PERFORMANCE.md.
pub(super) const UPSTREAM_READ_BUFFER_MAX: usize = 64 * 1024;

/// Sends authorized requests to one kubelet over a pool of HTTP/1.1 connections.
///
/// Cheap to clone: clones share the pool. The upstream client is HTTP/1.1 only, whatever the
/// caller spoke, because an upgrade (exec, attach, portForward) only exists in HTTP/1.1.
#[derive(Clone)]
pub struct Forwarder {
    /// The pooled client; every connection goes to the configured kubelet, whatever the URI.
    client: Client<UpstreamConnector, Incoming>,
    /// How connections are opened, for [`Forwarder::probe`]'s own connection.
    connector: UpstreamConnector,
    /// `http` or `https`, for the upstream URI (and hence the pool key).
    scheme: Scheme,
    /// The upstream authority (`localhost` for a unix socket), for `Host` and logs.
    authority: Authority,
    /// `Host` sent upstream: the authority, made a header value once.
    host: HeaderValue,
    forward_identity_headers: bool,
    /// Upgraded sessions idle this long are closed.
    streaming_idle_timeout: Duration,
    /// Places for requests in flight, in all and per user.
    limits: Arc<UpstreamLimits>,
    /// Upgraded sessions are its tasks.
    shutdown: Shutdown,
}

/// The kubelet's address, resolved and validated (scheme, host and port, TLS server name, ALPN)
/// without opening anything: what `check-config` can vouch for before a pool exists.
pub struct UpstreamEndpoint {
    scheme: Scheme,
    authority: Authority,
    endpoint: Endpoint,
}

impl UpstreamEndpoint {
    /// Resolves `target`. `tls` is required for [`UpstreamTarget::Https`] and ignored otherwise.
    /// It must not offer ALPN protocols other than `http/1.1` (none is best): the client only
    /// speaks HTTP/1.1; a reloaded configuration is checked as it is now, and its later versions
    /// are built the same way. `server_name` overrides the name the kubelet's certificate is
    /// verified against (`--upstream-server-name`); by default it is the upstream host (DNS name or
    /// IP address).
    pub fn resolve(
        target: UpstreamTarget,
        tls: Option<UpstreamTlsConfig>,
        server_name: Option<ServerName<'static>>,
    ) -> Result<UpstreamEndpoint, ProxyError> {
        let (scheme, authority, endpoint) = match target {
            UpstreamTarget::Https { authority } => {
                let tls = tls.ok_or(ProxyError::MissingTlsConfig)?;
                if tls
                    .current()
                    .alpn_protocols
                    .iter()
                    .any(|p| p != b"http/1.1")
                {
                    return Err(ProxyError::AlpnNotHttp11);
                }
                let (host, port) = host_port(&authority, 443)?;
                let server_name = match server_name {
                    Some(name) => name,
                    None => ServerName::try_from(host.clone())
                        .map_err(|_| ProxyError::InvalidServerName(host.clone()))?,
                };
                let endpoint = Endpoint::Tls {
                    host,
                    port,
                    tls,
                    server_name,
                };
                (Scheme::HTTPS, authority, endpoint)
            }
            UpstreamTarget::Http { authority } => {
                let (host, port) = host_port(&authority, 80)?;
                (Scheme::HTTP, authority, Endpoint::Tcp { host, port })
            }
            UpstreamTarget::Unix { path } => (
                Scheme::HTTP,
                Authority::from_static("localhost"),
                Endpoint::Unix { path },
            ),
        };
        Ok(UpstreamEndpoint {
            scheme,
            authority,
            endpoint,
        })
    }
}

impl Forwarder {
    /// [`UpstreamEndpoint::resolve`], then [`Forwarder::with_endpoint`].
    pub fn new(
        target: UpstreamTarget,
        tls: Option<Arc<rustls::ClientConfig>>,
        server_name: Option<ServerName<'static>>,
        options: ForwardOptions,
    ) -> Result<Forwarder, ProxyError> {
        let endpoint =
            UpstreamEndpoint::resolve(target, tls.map(UpstreamTlsConfig::Fixed), server_name)?;
        Ok(Forwarder::with_endpoint(endpoint, options))
    }

    /// Builds the forwarder and its (initially empty) connection pool; no connection is opened
    /// yet, so a kubelet that is still starting is not an error here.
    pub fn with_endpoint(upstream: UpstreamEndpoint, options: ForwardOptions) -> Forwarder {
        let UpstreamEndpoint {
            scheme,
            authority,
            endpoint,
        } = upstream;
        // An `Authority` only holds visible ASCII, which is always a valid header value.
        let host = HeaderValue::from_str(authority.as_str())
            .expect("a URI authority is a valid header value");
        let connector = UpstreamConnector::new(endpoint, options.connect_timeout);
        Forwarder {
            client: pooled_client(&connector),
            connector,
            scheme,
            authority,
            host,
            forward_identity_headers: options.forward_identity_headers,
            streaming_idle_timeout: options.streaming_idle_timeout,
            limits: Arc::new(UpstreamLimits::new(
                options.max_requests_inflight,
                options.max_requests_inflight_per_user,
                options.connect_timeout,
                options.requests_in_flight,
            )),
            shutdown: options.shutdown,
        }
    }

    /// The same forwarder with a connection pool of its own, for one serving thread
    /// ([`crate::server::serving_threads`]): the pool's connections are opened, used and returned
    /// by that thread's tasks alone. The bounds on requests in flight stay shared.
    pub fn with_own_pool(&self) -> Forwarder {
        Forwarder {
            client: pooled_client(&self.connector),
            ..self.clone()
        }
    }

    /// Forwards an authorized request and returns the kubelet's response.
    ///
    /// The method and the raw path and query go upstream byte for byte (so the kubelet sees the
    /// path that was authorized); the body streams up and the response body streams back, never
    /// buffered. Headers are cleaned as [`headers::sanitize_request_headers`] describes, and
    /// identity headers are set from `user` when configured. An HTTP/1.1 upgrade request that
    /// the kubelet accepts with `101` is spliced in a background task once the caller has
    /// received the returned `101`; any other answer is returned as a normal response.
    ///
    /// `CONNECT` and non-path request targets are refused: the client would rewrite them, and
    /// the path we forward must be the one we authorized. A request with no place among those in
    /// flight (`--upstream-max-requests-inflight`, per user and in all) is not sent:
    /// [`ForwardError::Busy`].
    pub async fn forward(
        &self,
        mut req: Request<Incoming>,
        user: &User,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        if req.method() == Method::CONNECT {
            return Err(ForwardError::UnsupportedRequest);
        }
        let lease = self.limits.acquire(&user.name).await?;
        let upgrade = crate::base::wire::is_upgrade_request(req.version(), req.headers())
            && headers::may_upgrade(req.uri().path(), req.headers());
        // Taken before the request is sent: this future resolves to the caller's connection
        // once the server has written our 101 to it.
        let caller_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));

        let (mut parts, body) = req.into_parts();
        parts.uri = self.upstream_uri(&parts.uri)?;
        parts.version = Version::HTTP_11;
        parts.extensions = Extensions::new();
        headers::sanitize_request_headers(&mut parts.headers, upgrade);
        if self.forward_identity_headers {
            headers::set_identity_headers(&mut parts.headers, user)?;
        }
        parts.headers.insert(HOST, self.host.clone());

        let mut resp = self
            .client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(ForwardError::from_client)?;

        let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        // An upgraded session holds its places for its whole life; any other response until
        // its body ends.
        let body_lease = if switched {
            let caller = caller_upgrade.ok_or(ForwardError::UnexpectedSwitchingProtocols)?;
            let stream = upgrade::splice(
                caller,
                hyper::upgrade::on(&mut resp),
                self.streaming_idle_timeout,
                lease,
                &self.shutdown,
            );
            resp.extensions_mut().insert(stream);
            None
        } else {
            Some(lease)
        };
        headers::sanitize_response_headers(resp.headers_mut(), switched);
        let drained = resp.extensions_mut().remove::<Drained>();
        Ok(resp.map(|body| Leased::new(Coalesced::new(body, drained), body_lease)))
    }

    /// Sends `GET /healthz` to the kubelet on a connection of its own, with the configured
    /// address, TLS and client certificate, and returns the status of the answer, or why the
    /// kubelet could not be reached (`check-config --probe`). No identity header is sent.
    pub async fn probe(&self) -> Result<StatusCode, ForwardError> {
        let client = Client::builder(TokioExecutor::new())
            .set_host(false)
            .build::<_, http_body_util::Empty<bytes::Bytes>>(self.connector.clone());
        let uri = self.upstream_uri(&Uri::from_static("/healthz"))?;
        let request = Request::get(uri)
            .header(HOST, self.host.clone())
            .body(http_body_util::Empty::new())
            .map_err(|_| ForwardError::UnsupportedRequest)?;
        let response = client
            .request(request)
            .await
            .map_err(ForwardError::from_client)?;
        Ok(response.status())
    }

    /// `scheme://` [`POOL_AUTHORITY`] + the caller's path and query, unchanged.
    fn upstream_uri(&self, uri: &Uri) -> Result<Uri, ForwardError> {
        let path_and_query = uri
            .path_and_query()
            .filter(|pq| pq.as_str().starts_with('/'))
            .ok_or(ForwardError::UnsupportedRequest)?;
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(POOL_AUTHORITY)
            .path_and_query(path_and_query.clone())
            .build()
            .map_err(|_| ForwardError::UnsupportedRequest)
    }
}

impl std::fmt::Debug for Forwarder {
    /// Shows where requests go; the pool has nothing worth printing.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field(
                "upstream",
                &format_args!("{}://{}", self.scheme, self.authority),
            )
            .field("forward_identity_headers", &self.forward_identity_headers)
            .finish_non_exhaustive()
    }
}

/// A pooled HTTP/1.1 client opening its connections with `connector`. Its connection tasks run
/// on the runtime of whoever sends the request that opens them.
fn pooled_client(connector: &UpstreamConnector) -> Client<UpstreamConnector, Incoming> {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .http1_max_buf_size(UPSTREAM_READ_BUFFER_MAX)
        .set_host(false)
        .build(connector.clone())
}

/// Host (IPv6 brackets removed, for the resolver and the TLS name) and port of an upstream
/// authority.
fn host_port(authority: &Authority, default_port: u16) -> Result<(String, u16), ProxyError> {
    if authority.as_str().contains('@') {
        return Err(ProxyError::AuthorityWithUserInfo);
    }
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Ok((
        host.to_owned(),
        authority.port_u16().unwrap_or(default_port),
    ))
}

#[cfg(test)]
mod tests;
