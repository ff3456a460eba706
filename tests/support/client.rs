//! An HTTP client over TLS as a kubelet API caller would use: ALPN picks HTTP/2 or HTTP/1.1, and
//! the client certificate is whatever the test says, including a valid certificate presented with
//! somebody else's private key. Every connection is fresh, so each request uses the identity of
//! the client it was sent with. No step waits longer than [`super::STEP_TIMEOUT`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::ResolvesClientCert;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, SignatureScheme, SupportedProtocolVersion};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

use super::pki::{Issued, unrelated_key};
use super::within;

/// Any error of connecting or exchanging a request.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A request body.
pub type Body = BoxBody<Bytes, Infallible>;

/// No body.
pub fn empty() -> Body {
    Empty::new().boxed()
}

/// A body streamed from a channel: each message is one frame; dropping the sender ends the body.
pub fn channel_body() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel(4);
    (tx, ChannelBody { rx }.boxed())
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// A request for `target` (path and query, sent exactly as written).
pub fn request(method: &str, target: &str) -> http::request::Builder {
    Request::builder().method(method).uri(target)
}

/// `GET target` with `Authorization: <value>`: a credential other than a certificate, or
/// something that only looks like one.
pub fn authorized(target: &str, value: &str) -> Request<Body> {
    request("GET", target)
        .header("authorization", value)
        .body(empty())
        .unwrap()
}

/// `GET target` with `Authorization: Bearer <token>`, as kubectl and Prometheus present a token.
pub fn bearer(target: &str, token: &str) -> Request<Body> {
    authorized(target, &format!("Bearer {token}"))
}

/// The client certificate a client presents.
pub enum Identity {
    /// None, even when asked.
    None,
    /// This chain (leaf first), proving possession with this key.
    Chain {
        /// Sent as is.
        chain: Vec<CertificateDer<'static>>,
        /// Signs the handshake.
        key: PrivateKeyDer<'static>,
    },
}

impl Clone for Identity {
    fn clone(&self) -> Identity {
        match self {
            Identity::None => Identity::None,
            Identity::Chain { chain, key } => Identity::Chain {
                chain: chain.clone(),
                key: key.clone_key(),
            },
        }
    }
}

impl Identity {
    /// The certificate with its intermediates and its own key.
    pub fn of(issued: &Issued) -> Identity {
        Identity::Chain {
            chain: issued.chain.clone(),
            key: issued.key(),
        }
    }

    /// The leaf without the intermediates that link it to the CA.
    pub fn leaf_only(issued: &Issued) -> Identity {
        Identity::Chain {
            chain: vec![issued.leaf().clone()],
            key: issued.key(),
        }
    }

    /// The certificate, but the handshake signed by a key that is not the certificate's: a client
    /// that copied someone's certificate without the private key.
    pub fn wrong_key(issued: &Issued) -> Identity {
        Identity::Chain {
            chain: issued.chain.clone(),
            key: unrelated_key(),
        }
    }
}

/// Hands rustls a fixed certificate and key (never checked against each other, so a wrong key
/// really goes on the wire) and records whether the server asked for a certificate at all.
#[derive(Debug)]
struct OfferedCertificate {
    key: Option<Arc<CertifiedKey>>,
    asked: Arc<AtomicBool>,
}

impl ResolvesClientCert for OfferedCertificate {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::SeqCst);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}

/// ALPN protocols offered by default: HTTP/2 first, as kubectl and the API server do.
pub const H2_AND_HTTP1: &[&[u8]] = &[b"h2", b"http/1.1"];
/// Only HTTP/1.1, as needed for upgrades.
pub const HTTP1_ONLY: &[&[u8]] = &[b"http/1.1"];
/// TLS 1.2 and 1.3.
pub const ANY_TLS: &[&SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];
/// TLS 1.2 only.
pub const TLS12_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];

/// A TCP connection to `addr` from the local address `source` when given (any of 127/8 is
/// loopback on Linux, so a server sees another client address), else from the system's choice.
pub async fn connect_from(
    source: Option<std::net::IpAddr>,
    addr: SocketAddr,
) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr).await;
    };
    let socket = if source.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(addr).await
}

/// A TLS client of one server, trusting one root.
#[derive(Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    addr: SocketAddr,
    /// The name the server's certificate is verified for: the address, unless
    /// [`Client::for_name`] says otherwise.
    server_name: ServerName<'static>,
    asked: Arc<AtomicBool>,
    /// The local address connections come from, when not the system's choice.
    source: Option<std::net::IpAddr>,
}

impl Client {
    /// Offers h2 and http/1.1, TLS 1.2 and 1.3.
    pub fn new(root: &CertificateDer<'static>, addr: SocketAddr, identity: Identity) -> Client {
        Client::configured(root, addr, identity, H2_AND_HTTP1, ANY_TLS)
    }

    /// Offers only HTTP/1.1, TLS 1.2 and 1.3: the protocol of exec, attach and portForward
    /// upgrades, and the only one where connection-specific headers can be sent at all.
    pub fn http1(root: &CertificateDer<'static>, addr: SocketAddr, identity: Identity) -> Client {
        Client::configured(root, addr, identity, HTTP1_ONLY, ANY_TLS)
    }

    /// Offers the given ALPN protocols and TLS versions.
    pub fn configured(
        root: &CertificateDer<'static>,
        addr: SocketAddr,
        identity: Identity,
        alpn: &[&[u8]],
        versions: &[&'static SupportedProtocolVersion],
    ) -> Client {
        let mut roots = RootCertStore::empty();
        roots.add(root.clone()).unwrap();
        let key = match identity {
            Identity::None => None,
            Identity::Chain { chain, key } => Some(Arc::new(CertifiedKey::new(
                chain,
                rustls::crypto::ring::sign::any_supported_type(&key).unwrap(),
            ))),
        };
        let asked = Arc::new(AtomicBool::new(false));
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots)
                .with_client_cert_resolver(Arc::new(OfferedCertificate {
                    key,
                    asked: Arc::clone(&asked),
                }));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Client {
            config: Arc::new(config),
            addr,
            server_name: ServerName::from(addr.ip()),
            asked,
            source: None,
        }
    }

    /// Connects from `source` (e.g. `127.0.0.2`: all of 127/8 is loopback on Linux), so the
    /// proxy sees another client address.
    pub fn connecting_from(mut self, source: std::net::IpAddr) -> Client {
        self.source = Some(source);
        self
    }

    /// Verifies the server's certificate for `name` instead of the address, as a client that
    /// dials a node by address but knows its name.
    pub fn for_name(mut self, name: &str) -> Client {
        self.server_name = ServerName::try_from(name.to_owned()).unwrap();
        self
    }

    /// Whether any server this client connected to asked for a client certificate.
    pub fn asked_for_certificate(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    /// Opens a TLS connection and an HTTP connection on it, by the protocol ALPN chose.
    pub async fn connect(&self) -> Result<Connection, Error> {
        within("connecting to the proxy", async {
            let tcp = connect_from(self.source, self.addr).await?;
            let tls = TlsConnector::from(Arc::clone(&self.config))
                .connect(self.server_name.clone(), tcp)
                .await?;
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let peer_certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| leaf.clone().into_owned())
                .ok_or("the server presented no certificate")?;
            let io = TokioIo::new(tls);
            let sender = if h2 {
                let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
                tokio::spawn(conn);
                Sender::H2(sender)
            } else {
                let (sender, conn) = http1::handshake(io).await?;
                tokio::spawn(conn.with_upgrades());
                Sender::H1(sender)
            };
            Ok(Connection {
                sender,
                authority: self.addr.to_string(),
                peer_certificate,
            })
        })
        .await
    }

    /// Sends `req` on a new connection and returns the response head; the body is the caller's
    /// to read (streams, upgrades).
    pub async fn try_open(&self, req: Request<Body>) -> Result<Response<Incoming>, Error> {
        let mut conn = self.connect().await?;
        conn.send(req).await
    }

    /// [`Client::try_open`], panicking on a transport error.
    pub async fn open(&self, req: Request<Body>) -> Response<Incoming> {
        self.try_open(req)
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"))
    }

    /// Sends `req` on a new connection and reads the whole response.
    pub async fn try_send(&self, req: Request<Body>) -> Result<Reply, Error> {
        let response = self.try_open(req).await?;
        Reply::read(response).await
    }

    /// [`Client::try_send`], panicking on a transport error.
    pub async fn send(&self, req: Request<Body>) -> Reply {
        self.try_send(req)
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"))
    }

    /// `GET target`.
    pub async fn get(&self, target: &str) -> Reply {
        self.send(request("GET", target).body(empty()).unwrap())
            .await
    }

    /// `GET target` with `token` as a bearer token (see [`bearer`]).
    pub async fn get_with_token(&self, target: &str, token: &str) -> Reply {
        self.send(bearer(target, token)).await
    }
}

enum Sender {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>),
}

/// One HTTP connection to the proxy.
pub struct Connection {
    sender: Sender,
    authority: String,
    peer_certificate: CertificateDer<'static>,
}

impl Connection {
    /// The leaf certificate the server presented in this connection's handshake.
    pub fn peer_certificate(&self) -> &CertificateDer<'static> {
        &self.peer_certificate
    }

    /// Whether a request can go out on this connection now: false once the server closed it
    /// (or, in HTTP/2, said `GOAWAY`), when a client opens another.
    pub async fn ready(&mut self) -> bool {
        match &mut self.sender {
            Sender::H1(sender) => sender.ready().await.is_ok(),
            Sender::H2(sender) => sender.ready().await.is_ok(),
        }
    }

    /// The HTTP version ALPN chose.
    pub fn version(&self) -> Version {
        match self.sender {
            Sender::H1(_) => Version::HTTP_11,
            Sender::H2(_) => Version::HTTP_2,
        }
    }

    /// Sends a request whose URI is a path and query; adds `Host` (HTTP/1.1) or the scheme and
    /// authority (HTTP/2).
    pub async fn send(&mut self, mut req: Request<Body>) -> Result<Response<Incoming>, Error> {
        let authority = self.authority.clone();
        within("waiting for response headers", async move {
            match &mut self.sender {
                Sender::H1(sender) => {
                    if !req.headers().contains_key(HOST) {
                        req.headers_mut().insert(HOST, authority.parse()?);
                    }
                    sender.ready().await?;
                    Ok(sender.send_request(req).await?)
                }
                Sender::H2(sender) => {
                    *req.uri_mut() = format!("https://{authority}{}", req.uri()).parse()?;
                    *req.version_mut() = Version::HTTP_2;
                    sender.ready().await?;
                    Ok(sender.send_request(req).await?)
                }
            }
        })
        .await
    }
}

/// A complete response.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: StatusCode,
    /// HTTP version the response came over.
    pub version: Version,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Reply {
    /// Reads the whole body of `response`.
    pub async fn read(response: Response<Incoming>) -> Result<Reply, Error> {
        let (parts, body) = response.into_parts();
        let body = within("reading a response body", body.collect())
            .await?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            version: parts.version,
            headers: parts.headers,
            body,
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A response header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The stand-in kubelet's echo of the request that reached it.
    pub fn echo(&self) -> Echo {
        assert_eq!(
            self.status,
            StatusCode::OK,
            "expected the kubelet's echo, got: {}",
            self.text()
        );
        Echo(serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("echo is not JSON ({e}): {}", self.text());
        }))
    }
}

/// What the stand-in kubelet saw: method, raw path and query, and headers.
pub struct Echo(serde_json::Value);

impl Echo {
    /// The method.
    pub fn method(&self) -> &str {
        self.0["method"].as_str().unwrap()
    }

    /// The raw path, as received.
    pub fn path(&self) -> &str {
        self.0["path"].as_str().unwrap()
    }

    /// The raw query, as received ("" when none).
    pub fn query(&self) -> &str {
        self.0["query"].as_str().unwrap()
    }

    /// Every header name (lowercase).
    pub fn header_names(&self) -> Vec<String> {
        self.0["headers"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    /// All values of a header, in order (none: empty).
    pub fn header(&self, name: &str) -> Vec<String> {
        self.0["headers"][name.to_ascii_lowercase()]
            .as_array()
            .map(|values| {
                values
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The size of the request body that arrived.
    pub fn body_bytes(&self) -> u64 {
        self.0["bodyBytes"].as_u64().unwrap()
    }

    /// The identity headers, decoded as Kubernetes' requestheader authenticator decodes them (the
    /// extra key is the header-name suffix, lowercased and percent-decoded).
    pub fn identity(&self) -> ForwardedIdentity {
        let mut extra = BTreeMap::new();
        for name in self.header_names() {
            if let Some(key) = name.strip_prefix("x-remote-extra-") {
                extra.insert(percent_decode(key), self.header(&name));
            }
        }
        ForwardedIdentity {
            user: self.header("x-remote-user"),
            uid: self.header("x-remote-uid"),
            groups: self.header("x-remote-group"),
            extra,
        }
    }
}

/// The identity the proxy told the kubelet about, header by header.
#[derive(Debug, PartialEq, Eq)]
pub struct ForwardedIdentity {
    /// `X-Remote-User` values.
    pub user: Vec<String>,
    /// `X-Remote-Uid` values.
    pub uid: Vec<String>,
    /// `X-Remote-Group` values, in order.
    pub groups: Vec<String>,
    /// `X-Remote-Extra-<key>` values by decoded key.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl ForwardedIdentity {
    /// What the proxy forwards for `name` with `uid` (no header when empty) in `groups`, extras
    /// to be added: the expected side of a scenario's comparison, written once.
    pub fn new(name: &str, uid: &str, groups: &[&str]) -> ForwardedIdentity {
        ForwardedIdentity {
            user: vec![name.to_owned()],
            uid: [uid]
                .into_iter()
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: BTreeMap::new(),
        }
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Sends `req` in plain HTTP/1.1 (the admin listener, or a plain-HTTP kubelet).
pub async fn plain_send(addr: SocketAddr, mut req: Request<Body>) -> Reply {
    within("plain HTTP request", async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = http1::handshake::<_, Body>(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        req.headers_mut()
            .insert(HOST, addr.to_string().parse().unwrap());
        let response = sender.send_request(req).await.unwrap();
        Reply::read(response).await.unwrap()
    })
    .await
}

/// `GET path` in plain HTTP/1.1.
pub async fn plain_get(addr: SocketAddr, path: &str) -> Reply {
    plain_send(addr, request("GET", path).body(empty()).unwrap()).await
}
