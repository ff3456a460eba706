//! Opens connections to the kubelet for the pooled client: TCP (TCP_NODELAY), TLS over TCP
//! (tokio-rustls with the caller's ring-based config), or a unix socket, all under one connect
//! timeout. The endpoint is fixed at construction: a request URI never chooses where we connect.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::batching::BatchedTcp;
use super::drained::Drained;
use crate::base::reload::Reloadable;

/// The TLS client configuration towards the kubelet: fixed, or rebuilt when its files (the
/// kubelet's CA, the proxy's client certificate and key) change. Each new connection takes the
/// configuration in force; pooled connections keep the one they were opened with.
#[derive(Clone)]
pub enum UpstreamTlsConfig {
    /// Never changes (tests, the demo).
    Fixed(Arc<rustls::ClientConfig>),
    /// Follows its files.
    Reloaded(Arc<Reloadable<rustls::ClientConfig>>),
}

impl UpstreamTlsConfig {
    /// The configuration in force.
    pub fn current(&self) -> Arc<rustls::ClientConfig> {
        match self {
            UpstreamTlsConfig::Fixed(config) => Arc::clone(config),
            UpstreamTlsConfig::Reloaded(reloadable) => reloadable.current_arc(),
        }
    }
}

/// Where and how to connect; resolved and validated once by `Forwarder::new`.
pub(crate) enum Endpoint {
    /// Plain TCP to `host:port` (host without IPv6 brackets; DNS names are resolved per connect).
    Tcp { host: String, port: u16 },
    /// TLS over TCP, verifying the kubelet as `server_name`.
    Tls {
        host: String,
        port: u16,
        tls: UpstreamTlsConfig,
        server_name: ServerName<'static>,
    },
    /// A unix domain socket.
    Unix { path: PathBuf },
}

/// Why a connection to the kubelet could not be opened. Its messages name no host, path or
/// credential; the `io::Error` source says what the OS or TLS stack reported.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("connect timed out")]
    Timeout,
    #[error("TCP connect failed")]
    Tcp(#[source] io::Error),
    #[error("unix socket connect failed")]
    Unix(#[source] io::Error),
    #[error("TLS handshake failed")]
    Tls(#[source] io::Error),
}

/// The `tower_service::Service<Uri>` the pooled client calls for each new connection.
/// Cheap to clone (one `Arc`), as the client requires.
#[derive(Clone)]
pub(crate) struct UpstreamConnector {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    /// Bounds name resolution, TCP connect and the TLS handshake together.
    timeout: Duration,
}

impl UpstreamConnector {
    pub(crate) fn new(endpoint: Endpoint, timeout: Duration) -> Self {
        UpstreamConnector {
            inner: Arc::new(Inner { endpoint, timeout }),
        }
    }
}

impl Inner {
    async fn connect(&self) -> Result<UpstreamStream, ConnectError> {
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                Ok(Transport::Tcp(BatchedTcp::new(tcp(host, *port).await?)).into())
            }
            Endpoint::Tls {
                host,
                port,
                tls,
                server_name,
            } => {
                let tcp = tcp(host, *port).await?;
                let stream = TlsConnector::from(tls.current())
                    .connect(server_name.clone(), BatchedTcp::new(tcp))
                    .await
                    .map_err(ConnectError::Tls)?;
                Ok(Transport::Tls(Box::new(stream)).into())
            }
            Endpoint::Unix { path } => UnixStream::connect(path)
                .await
                .map(|stream| Transport::Unix(stream).into())
                .map_err(ConnectError::Unix),
        }
    }
}

async fn tcp(host: &str, port: u16) -> Result<TcpStream, ConnectError> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(ConnectError::Tcp)?;
    // Interactive streams (exec, attach) and small request writes must not wait for Nagle.
    stream.set_nodelay(true).map_err(ConnectError::Tcp)?;
    Ok(stream)
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = TokioIo<UpstreamStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    /// Connects to the configured endpoint; the URI only serves as the pool key.
    fn call(&mut self, _uri: Uri) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            match tokio::time::timeout(inner.timeout, inner.connect()).await {
                Ok(stream) => stream.map(TokioIo::new),
                Err(_elapsed) => Err(ConnectError::Timeout),
            }
        })
    }
}

/// A connection to the kubelet, whichever transport it uses, reporting each read that finds
/// nothing ([`Drained`]).
pub(crate) struct UpstreamStream {
    transport: Transport,
    drained: Drained,
}

enum Transport {
    Tcp(BatchedTcp),
    /// Boxed: a TLS session is much larger than a socket.
    Tls(Box<TlsStream<BatchedTcp>>),
    Unix(UnixStream),
}

impl From<Transport> for UpstreamStream {
    fn from(transport: Transport) -> UpstreamStream {
        UpstreamStream {
            transport,
            drained: Drained::new(),
        }
    }
}

impl Connection for UpstreamStream {
    /// Always plain HTTP/1.1 (we never offer h2 by ALPN), never through an HTTP proxy. The
    /// connection's [`Drained`] rides in every response read from it.
    fn connected(&self) -> Connected {
        Connected::new().extra(self.drained.clone())
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = match &mut this.transport {
            Transport::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Unix(s) => Pin::new(s).poll_read(cx, buf),
        };
        if read.is_pending() {
            this.drained.report();
        }
        read
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().transport {
            Transport::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().transport {
            Transport::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Transport::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.transport {
            Transport::Tcp(s) => s.is_write_vectored(),
            Transport::Tls(s) => s.is_write_vectored(),
            Transport::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().transport {
            Transport::Tcp(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().transport {
            Transport::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
