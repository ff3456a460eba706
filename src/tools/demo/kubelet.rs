//! A stand-in kubelet for the demo and for tests: it serves what the proxy is exercised with
//! (an echo of every request, container logs with `follow`, healthz, pods, stats, metrics, and
//! exec/attach/portForward upgrades that echo bytes) over TCP, TLS or a unix socket, HTTP/1.1 and h2.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

use bytes::Bytes;
use http::header::{
    CONNECTION, CONTENT_TYPE, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE,
};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::accept::Listen;
use crate::base::wire::is_upgrade_request;
use crate::forward::UpstreamTarget;

/// Bounds a TLS handshake and the switch of an upgraded connection, so a client that stalls
/// cannot keep a task alive.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pace of a followed log stream.
const LOG_LINE_INTERVAL: Duration = Duration::from_millis(50);
/// Lines served by a log request without `follow=true`.
const FINITE_LOG_LINES: u64 = 3;
/// The GUID RFC 6455 appends to `Sec-WebSocket-Key` before hashing.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The response body: a complete buffer, or an endless/finite log stream.
type StandInBody = Either<Full<Bytes>, LogLines>;

/// Where a stand-in listens.
enum Local {
    Tcp { addr: SocketAddr, tls: bool },
    Unix { path: PathBuf },
}

/// A running stand-in kubelet. It stops when dropped or [`shutdown`](Self::shutdown): the accept
/// loop ends, its connection tasks are aborted, upgraded echo tasks see the signal and end, and a
/// unix socket file it created is removed.
pub struct StandInKubelet {
    local: Local,
    /// Sending `true`, or dropping the sender, tells every task of this stand-in to stop.
    stop: watch::Sender<bool>,
    /// The accept loop; it owns the connection tasks (in a `JoinSet`) and aborts them on exit.
    accept: JoinHandle<()>,
}

impl StandInKubelet {
    /// Starts on `127.0.0.1:<free port>`, speaking TLS when `tls` is given (its ALPN setting,
    /// if any, is honoured; h2 and HTTP/1.1 are both served either way).
    pub async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> io::Result<StandInKubelet> {
        StandInKubelet::start_at((std::net::Ipv4Addr::LOCALHOST, 0).into(), tls).await
    }

    /// [`StandInKubelet::start`] on `addr`: `[::1]:0`, say, where a kubelet moved behind the
    /// proxy listens.
    pub async fn start_at(
        addr: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> io::Result<StandInKubelet> {
        let listener = TcpListener::bind(addr).await?;
        let local = Local::Tcp {
            addr: listener.local_addr()?,
            tls: tls.is_some(),
        };
        Ok(Self::spawn(
            local,
            Listener::Tcp(listener, tls.map(TlsAcceptor::from)),
        ))
    }

    /// Starts on a unix socket at `path`, which must not exist yet (an existing file is never
    /// replaced); the socket file is removed when the stand-in stops.
    pub async fn start_unix(path: impl Into<PathBuf>) -> io::Result<StandInKubelet> {
        let path = path.into();
        let listener = UnixListener::bind(&path)?;
        Ok(Self::spawn(Local::Unix { path }, Listener::Unix(listener)))
    }

    fn spawn(local: Local, listener: Listener) -> StandInKubelet {
        let (stop, stop_rx) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, stop_rx));
        StandInKubelet {
            local,
            stop,
            accept,
        }
    }

    /// The TCP address, `None` for a unix-socket stand-in.
    pub fn addr(&self) -> Option<SocketAddr> {
        match &self.local {
            Local::Tcp { addr, .. } => Some(*addr),
            Local::Unix { .. } => None,
        }
    }

    /// The socket path, `None` for a TCP stand-in.
    pub fn socket_path(&self) -> Option<&Path> {
        match &self.local {
            Local::Tcp { .. } => None,
            Local::Unix { path } => Some(path),
        }
    }

    /// The upstream target that reaches this stand-in (`https://127.0.0.1:<port>` when it
    /// speaks TLS, so its certificate must cover the IP `127.0.0.1` or the forwarder must be
    /// given a server name).
    pub fn upstream(&self) -> UpstreamTarget {
        match &self.local {
            Local::Tcp { addr, tls } => {
                // A socket address is always a valid URI authority.
                let authority = http::uri::Authority::try_from(addr.to_string())
                    .expect("a socket address is a valid authority");
                if *tls {
                    UpstreamTarget::Https { authority }
                } else {
                    UpstreamTarget::Http { authority }
                }
            }
            Local::Unix { path } => UpstreamTarget::Unix { path: path.clone() },
        }
    }

    /// Stops the stand-in and waits until its accept loop and connections are gone.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        // The accept loop never panics; a join error could only be a cancelled runtime.
        let _ = (&mut self.accept).await;
    }
}

impl Drop for StandInKubelet {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Local::Unix { path } = &self.local {
            // Best effort: the file is ours, and a leftover would only block a later bind.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A bound listener; TCP optionally with TLS.
enum Listener {
    Tcp(TcpListener, Option<TlsAcceptor>),
    Unix(UnixListener),
}

/// An accepted connection whose transport set-up (TLS) happens in its own task.
enum Accepted {
    Tcp(TcpStream, Option<TlsAcceptor>),
    Unix(UnixStream),
}

impl Listen for Listener {
    type Connection = Accepted;

    async fn next(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(l, tls) => Ok(Accepted::Tcp(l.accept().await?.0, tls.clone())),
            Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?.0)),
        }
    }
}

impl Accepted {
    async fn serve(self, stop: watch::Receiver<bool>) {
        match self {
            Accepted::Tcp(tcp, None) => serve(tcp, stop).await,
            Accepted::Tcp(tcp, Some(acceptor)) => {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                if let Ok(Ok(tls)) = handshake.await {
                    serve(tls, stop).await;
                }
            }
            Accepted::Unix(unix) => serve(unix, stop).await,
        }
    }
}

/// Accepts connections until told to stop, then aborts the connection tasks it spawned.
async fn accept_loop(listener: Listener, stop: watch::Receiver<bool>) {
    let serving = stop.clone();
    super::accept::until_stopped(listener, stop, |conn| conn.serve(serving.clone())).await;
}

/// Serves one connection (HTTP/1.1 with upgrades, or h2) until it closes or the stand-in stops.
async fn serve<S>(stream: S, mut stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handler_stop = stop.clone();
    let service = service_fn(move |req| handle(req, handler_stop.clone()));
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = stop.changed() => {}
    }
}

async fn handle(
    req: Request<Incoming>,
    stop: watch::Receiver<bool>,
) -> Result<Response<StandInBody>, Infallible> {
    if is_exec_upgrade(&req) {
        return Ok(switch_protocols(req, stop));
    }
    let path = req.uri().path();
    let resp = match path {
        "/healthz" => full("text/plain; charset=utf-8", "ok"),
        "/pods" | "/pods/" => full("application/json", POD_LIST),
        "/stats/summary" => full("application/json", STATS_SUMMARY),
        "/metrics" => full("text/plain; version=0.0.4; charset=utf-8", METRICS),
        _ if path.starts_with("/containerLogs/") => {
            let follow = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "follow=true"));
            let mut resp = Response::new(Either::Right(LogLines::new(follow)));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            resp
        }
        _ => echo(req).await,
    };
    Ok(resp)
}

fn full(content_type: &'static str, body: impl Into<Bytes>) -> Response<StandInBody> {
    let mut resp = Response::new(Either::Left(Full::new(body.into())));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Answers with what reached the kubelet: method, raw path and query, version, every header
/// (lowercase names, all values in order) and the number of body bytes received.
async fn echo(req: Request<Incoming>) -> Response<StandInBody> {
    let (parts, mut body) = req.into_parts();
    let mut headers = std::collections::BTreeMap::<&str, Vec<String>>::new();
    for (name, value) in &parts.headers {
        headers
            .entry(name.as_str())
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    let mut body_bytes = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        body_bytes += frame.data_ref().map_or(0, Bytes::len);
    }
    let echo = serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query().unwrap_or(""),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "bodyBytes": body_bytes,
    });
    full("application/json", echo.to_string())
}

/// An exec/attach/portForward handshake: HTTP/1.1 upgrade to WebSocket or SPDY/3.1.
fn is_exec_upgrade(req: &Request<Incoming>) -> bool {
    let path = req.uri().path();
    let streaming_path = ["/exec/", "/attach/", "/portForward/"]
        .iter()
        .any(|p| path.starts_with(p));
    let protocol_known = req.headers().get(UPGRADE).is_some_and(|v| {
        v.as_bytes().eq_ignore_ascii_case(b"websocket")
            || v.as_bytes().eq_ignore_ascii_case(b"SPDY/3.1")
    });
    streaming_path && protocol_known && is_upgrade_request(req.version(), req.headers())
}

/// Answers 101 with the requested protocol and echoes the upgraded connection in a task.
fn switch_protocols(
    mut req: Request<Incoming>,
    stop: watch::Receiver<bool>,
) -> Response<StandInBody> {
    let mut resp = Response::new(Either::Left(Full::new(Bytes::new())));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = resp.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Some(protocol) = req.headers().get(UPGRADE) {
        headers.insert(UPGRADE, protocol.clone());
    }
    if let Some(key) = req.headers().get(SEC_WEBSOCKET_KEY) {
        // Base64 output is plain ASCII, always a valid header value.
        if let Ok(accept) = HeaderValue::from_str(&websocket_accept(key.as_bytes())) {
            headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
        }
    }
    tokio::spawn(echo_upgraded(hyper::upgrade::on(&mut req), stop));
    resp
}

/// Writes back every byte read until the client closes, an I/O error, or the stand-in stops.
async fn echo_upgraded(on_upgrade: OnUpgrade, mut stop: watch::Receiver<bool>) {
    let Ok(Ok(upgraded)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, on_upgrade).await else {
        return;
    };
    let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
    tokio::select! {
        copied = tokio::io::copy(&mut reader, &mut writer) => {
            // The client finished sending: close our side cleanly too (a TLS close_notify), as a
            // kubelet does when a session ends.
            if copied.is_ok() {
                let _ = writer.shutdown().await;
            }
        }
        _ = stop.changed() => {}
    }
}

/// `Sec-WebSocket-Accept` for a key (RFC 6455 §4.2.2): base64(SHA-1(key + GUID)). Public for
/// the benchmark's kubelet-like stand-in and its client, which answer and check the same handshake.
pub fn websocket_accept(key: &[u8]) -> String {
    use base64::Engine as _;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(WEBSOCKET_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(ctx.finish())
}

/// A container log body: `line <n>\n` lines, either [`FINITE_LOG_LINES`] as fast as the client
/// reads, or (follow) one every [`LOG_LINE_INTERVAL`] for as long as the client reads. Written
/// as the kubelet writes a log: each line its own chunk, flushed alone (the kubelet wraps the
/// response in a flush-writer), so a log reaches the proxy in many small writes. Driven by the
/// connection, so it stops when the client goes away.
struct LogLines {
    next: u64,
    /// A line was just given: the next poll lets the connection flush it first.
    unflushed: bool,
    /// `None` while following.
    remaining: Option<u64>,
    /// Paces followed lines; `None` for a finite log.
    interval: Option<tokio::time::Interval>,
}

impl LogLines {
    fn new(follow: bool) -> LogLines {
        LogLines {
            next: 1,
            unflushed: false,
            remaining: (!follow).then_some(FINITE_LOG_LINES),
            interval: follow.then(|| tokio::time::interval(LOG_LINE_INTERVAL)),
        }
    }
}

impl Body for LogLines {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if std::mem::take(&mut this.unflushed) {
            // hyper writes out what it holds when the body has nothing ready: one flush per line.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match &mut this.remaining {
            Some(0) => return Poll::Ready(None),
            Some(n) => *n -= 1,
            None => {}
        }
        if let Some(interval) = &mut this.interval {
            ready!(interval.poll_tick(cx));
        }
        let line = format!("line {}\n", this.next);
        this.next += 1;
        this.unflushed = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(line)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0)
    }
}

const POD_LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"web-0","namespace":"default","uid":"8f1f0c3e-5a63-4a51-9a3e-2d1c1f0b7a11","creationTimestamp":"2025-01-01T00:00:00Z","labels":{"app":"web"}},"spec":{"nodeName":"stand-in","containers":[{"name":"web","image":"nginx:1.27"}]},"status":{"phase":"Running","podIP":"10.244.0.5","containerStatuses":[{"name":"web","ready":true,"restartCount":0,"image":"nginx:1.27"}]}}]}"#;

const STATS_SUMMARY: &str = r#"{"node":{"nodeName":"stand-in","startTime":"2025-01-01T00:00:00Z","cpu":{"time":"2025-01-01T01:00:00Z","usageNanoCores":123456789,"usageCoreNanoSeconds":987654321000},"memory":{"time":"2025-01-01T01:00:00Z","availableBytes":3221225472,"usageBytes":1073741824,"workingSetBytes":805306368}},"pods":[{"podRef":{"name":"web-0","namespace":"default","uid":"8f1f0c3e-5a63-4a51-9a3e-2d1c1f0b7a11"},"startTime":"2025-01-01T00:00:00Z","containers":[{"name":"web","startTime":"2025-01-01T00:00:01Z","cpu":{"time":"2025-01-01T01:00:00Z","usageNanoCores":1234567},"memory":{"time":"2025-01-01T01:00:00Z","workingSetBytes":16777216}}]}]}"#;

const METRICS: &str = "# HELP kubelet_running_pods [ALPHA] Number of pods that have a running pod sandbox\n\
# TYPE kubelet_running_pods gauge\n\
kubelet_running_pods 1\n\
# HELP kubelet_running_containers [ALPHA] Number of containers currently running\n\
# TYPE kubelet_running_containers gauge\n\
kubelet_running_containers{container_state=\"running\"} 1\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{http2_connect, send_http2};
    use http::header::HOST;
    use serde_json::Value;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const WAIT: Duration = Duration::from_secs(10);

    async fn send_h1<S>(stream: S, req: Request<Full<Bytes>>) -> Response<Incoming>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn.with_upgrades());
        tokio::time::timeout(WAIT, sender.send_request(req))
            .await
            .unwrap()
            .unwrap()
    }

    async fn get(kubelet: &StandInKubelet, path: &str) -> Response<Incoming> {
        let tcp = TcpStream::connect(kubelet.addr().unwrap()).await.unwrap();
        let req = Request::get(path)
            .header(HOST, "kubelet")
            .body(Full::default())
            .unwrap();
        send_h1(tcp, req).await
    }

    /// Sends `request` to `kubelet` on a fresh connection, asking to switch to `protocol`.
    async fn ask_upgrade(
        kubelet: &StandInKubelet,
        request: http::request::Builder,
        protocol: &str,
    ) -> Response<Incoming> {
        let tcp = TcpStream::connect(kubelet.addr().unwrap()).await.unwrap();
        let req = request
            .header(HOST, "kubelet")
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, protocol)
            .body(Full::default())
            .unwrap();
        send_h1(tcp, req).await
    }

    async fn text(resp: Response<Incoming>) -> String {
        let body = tokio::time::timeout(WAIT, resp.into_body().collect());
        String::from_utf8(body.await.unwrap().unwrap().to_bytes().to_vec()).unwrap()
    }

    fn unique_socket() -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        std::env::temp_dir().join(format!(
            "kap-standin-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    #[test]
    fn websocket_accept_matches_rfc_6455_example() {
        assert_eq!(
            websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[tokio::test]
    async fn serves_kubelet_endpoints() {
        let kubelet = StandInKubelet::start(None).await.unwrap();
        assert_eq!(text(get(&kubelet, "/healthz").await).await, "ok");

        let pods: Value = serde_json::from_str(&text(get(&kubelet, "/pods").await).await).unwrap();
        assert_eq!(pods["kind"], "PodList");
        assert_eq!(pods["items"][0]["metadata"]["name"], "web-0");

        let stats = text(get(&kubelet, "/stats/summary").await).await;
        let stats: Value = serde_json::from_str(&stats).unwrap();
        assert_eq!(stats["pods"][0]["podRef"]["namespace"], "default");

        let metrics = get(&kubelet, "/metrics").await;
        assert!(
            metrics.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        assert!(text(metrics).await.contains("\nkubelet_running_pods 1\n"));

        let logs = get(&kubelet, "/containerLogs/default/web-0/web?tailLines=3").await;
        assert_eq!(text(logs).await, "line 1\nline 2\nline 3\n");
    }

    #[tokio::test]
    async fn echo_reports_raw_request_over_http1_and_h2() {
        let kubelet = StandInKubelet::start(None).await.unwrap();
        let tcp = TcpStream::connect(kubelet.addr().unwrap()).await.unwrap();
        let req = Request::put("/a;b/c%20d?x=1&y=%2F")
            .header(HOST, "kubelet")
            .header("X-Multi", "one")
            .header("x-multi", "two")
            .body(Full::new(Bytes::from_static(b"12345678")))
            .unwrap();
        let echo: Value = serde_json::from_str(&text(send_h1(tcp, req).await).await).unwrap();
        assert_eq!(echo["method"], "PUT");
        assert_eq!(echo["path"], "/a;b/c%20d");
        assert_eq!(echo["query"], "x=1&y=%2F");
        assert_eq!(echo["version"], "HTTP/1.1");
        assert_eq!(echo["bodyBytes"], 8);
        assert_eq!(
            echo["headers"]["x-multi"],
            serde_json::json!(["one", "two"])
        );

        let mut sender = http2_connect(kubelet.addr().unwrap()).await;
        let req = Request::get("http://kubelet/configz")
            .body(Full::<Bytes>::default())
            .unwrap();
        let resp = send_http2(&mut sender, req).await;
        let echo: Value = serde_json::from_str(&text(resp).await).unwrap();
        assert_eq!(echo["version"], "HTTP/2.0");
        assert_eq!(echo["path"], "/configz");
        assert_eq!(echo["query"], "");
    }

    #[tokio::test]
    async fn exec_upgrade_echoes_and_unknown_protocols_are_not_switched() {
        let kubelet = StandInKubelet::start(None).await.unwrap();
        let mut resp = ask_upgrade(&kubelet, Request::post("/attach/ns/pod/c"), "SPDY/3.1").await;
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.headers()[UPGRADE], "SPDY/3.1");
        let upgraded = hyper::upgrade::on(&mut resp).await.unwrap();
        let mut io = TokioIo::new(upgraded);
        io.write_all(b"stdin").await.unwrap();
        let mut back = [0; 5];
        tokio::time::timeout(WAIT, io.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back, b"stdin");

        let resp = ask_upgrade(&kubelet, Request::get("/exec/ns/pod/c"), "h2c").await;
        assert_eq!(resp.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn shutdown_stops_listening() {
        let kubelet = StandInKubelet::start(None).await.unwrap();
        let addr = kubelet.addr().unwrap();
        assert!(kubelet.socket_path().is_none());
        kubelet.shutdown().await;
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn unix_socket_serves_and_is_removed_on_drop_but_never_replaced() {
        let path = unique_socket();
        let kubelet = StandInKubelet::start_unix(&path).await.unwrap();
        assert_eq!(kubelet.socket_path(), Some(path.as_path()));
        assert!(kubelet.addr().is_none());
        assert_eq!(
            kubelet.upstream(),
            UpstreamTarget::Unix { path: path.clone() }
        );
        assert!(StandInKubelet::start_unix(&path).await.is_err());

        let unix = UnixStream::connect(&path).await.unwrap();
        let req = Request::get("/healthz")
            .header(HOST, "localhost")
            .body(Full::default())
            .unwrap();
        assert_eq!(text(send_h1(unix, req).await).await, "ok");

        drop(kubelet);
        assert!(!path.exists());
    }
}
