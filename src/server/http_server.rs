//! The HTTP server a client connection gets, chosen by the protocol its TLS handshake agreed
//! (ALPN), as the kubelet's Go server chooses: HTTP/2 when ALPN chose `h2`, HTTP/1.1 otherwise
//! (no ALPN included; HTTP/2 over TLS is only ever negotiated, RFC 9113 §3.2).
//!
//! Why not hyper-util's auto-detecting server: it sniffs a connection's first bytes through a
//! rewinding wrapper, and hyper's HTTP/1.1 read buffer, handed those few bytes first and the rest
//! by a second read, doubles from 8 to 16 KiB and stays so for the connection's life; and its
//! connection future is as large as the larger protocol's, in every connection's task. Here each
//! protocol's connection is boxed at its own size. Measured in docs/PERFORMANCE.md.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::base::wire::{MAX_HTTP2_HEADER_LIST_BYTES, MAX_REQUEST_HEAD_BYTES};

/// What a client connection is read and written through.
type Io = TokioIo<TlsStream<TcpStream>>;

/// Most streams one HTTP/2 connection may have open at once: Go's net/http default (and so the
/// kubelet's).
const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 250;

/// An error hyper can carry.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What both protocols' servers need of the request handler, said once: a service answering with
/// a body, all of it sendable to the runtime's tasks (HTTP/2 runs each stream as a task).
pub trait Service:
    HttpService<Incoming, ResBody = Self::Body, Error: Into<BoxError>, Future: Send + 'static>
    + Send
    + 'static
{
    /// The response body.
    type Body: Body<Data: Send, Error: Into<BoxError>> + Send + 'static;
}

impl<S, B> Service for S
where
    S: HttpService<Incoming, ResBody = B> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Body = B;
}

/// The settings of both protocols' servers, built once and shared by every connection.
pub struct HttpServer {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl HttpServer {
    /// `header_read_timeout` bounds how long an HTTP/1.1 request's head may take to arrive.
    pub fn new(header_read_timeout: Duration) -> HttpServer {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            // The bound on a request head (and so on a token) the cost model of authentication's
            // expressions counts on.
            .max_buf_size(MAX_REQUEST_HEAD_BYTES);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(HTTP2_MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HTTP2_HEADER_LIST_BYTES);
        HttpServer { http1, http2 }
    }

    /// Serves `tls` with `service` in the protocol its handshake agreed; HTTP/1.1 connections
    /// may be upgraded (exec, attach, port-forward).
    pub fn serve<S: Service>(&self, tls: TlsStream<TcpStream>, service: S) -> Served<S> {
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        let io = TokioIo::new(tls);
        if h2 {
            Served::Http2(Box::pin(self.http2.serve_connection(io, service)))
        } else {
            Served::Http1(Box::pin(
                self.http1.serve_connection(io, service).with_upgrades(),
            ))
        }
    }
}

/// One connection being served: a future that ends with the connection.
pub enum Served<S: Service> {
    /// HTTP/1.1, upgrades allowed.
    Http1(Pin<Box<http1::UpgradeableConnection<Io, S>>>),
    /// HTTP/2.
    Http2(Pin<Box<http2::Connection<Io, S, TokioExecutor>>>),
}

impl<S: Service> Served<S> {
    /// Stops taking requests and ends the connection once those in flight are answered
    /// (HTTP/2: GOAWAY).
    pub fn graceful_shutdown(&mut self) {
        match self {
            Served::Http1(conn) => conn.as_mut().graceful_shutdown(),
            Served::Http2(conn) => conn.as_mut().graceful_shutdown(),
        }
    }
}

impl<S: Service> Future for Served<S> {
    type Output = hyper::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Served::Http1(conn) => conn.as_mut().poll(cx),
            Served::Http2(conn) => conn.as_mut().poll(cx),
        }
    }
}
