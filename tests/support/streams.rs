//! Long-lived requests through the proxy, as kubectl makes them: an `exec` session upgraded to
//! WebSocket (the stand-in kubelet echoes every byte), and a followed container log (one line
//! every 50 ms for as long as it is read). Every read and write is bounded.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{Body, Client, empty, request};
use super::within;

/// The WebSocket subprotocol kubectl asks for first.
pub const EXEC_PROTOCOL: &str = "v5.channel.k8s.io";
/// An exec of a shell with stdin and stdout.
pub const EXEC_TARGET: &str = "/exec/ns/pod/ctr?command=sh&stdin=true&stdout=true";
/// A followed container log.
pub const FOLLOW_TARGET: &str = "/containerLogs/ns/pod/ctr?follow=true";

/// The prefix of the WebSocket subprotocol that carries a bearer token (unpadded base64url), as
/// browsers, which cannot set `Authorization` on a WebSocket, present one.
pub const WEBSOCKET_TOKEN_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// A WebSocket upgrade of `target` asking for the subprotocols `protocols`, as kubectl sends one.
pub fn websocket_request(target: &str, protocols: &str) -> Request<Body> {
    request("GET", target)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", protocols)
        .body(empty())
        .unwrap()
}

/// A WebSocket upgrade of `target` offering `token` as the bearer subprotocol, then
/// `v4.channel.k8s.io`.
pub fn websocket_with_token(target: &str, token: &str) -> Request<Body> {
    let encoded = URL_SAFE_NO_PAD.encode(token);
    let protocols = format!("{WEBSOCKET_TOKEN_PREFIX}{encoded}, v4.channel.k8s.io");
    websocket_request(target, &protocols)
}

/// An open exec session: the bytes after the 101.
pub struct ExecSession {
    /// The headers of the 101 response.
    pub headers: HeaderMap,
    io: TokioIo<Upgraded>,
}

impl ExecSession {
    /// Opens [`EXEC_TARGET`] as a WebSocket with `Sec-WebSocket-Protocol: protocols` through
    /// `client`, which must offer only HTTP/1.1; panics unless the answer is 101.
    pub async fn open(client: &Client, protocols: &str) -> ExecSession {
        let response = client.open(websocket_request(EXEC_TARGET, protocols)).await;
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        let headers = response.headers().clone();
        let upgraded = within("the upgrade", hyper::upgrade::on(response))
            .await
            .unwrap();
        ExecSession {
            headers,
            io: TokioIo::new(upgraded),
        }
    }

    /// Sends `message` and reads it back from the kubelet's echo; panics if the session is broken.
    pub async fn echo(&mut self, message: &[u8]) {
        within("writing to the session", self.io.write_all(message))
            .await
            .unwrap();
        let mut back = vec![0u8; message.len()];
        within("reading the echo", self.io.read_exact(&mut back))
            .await
            .unwrap();
        assert_eq!(back, message);
    }

    /// Waits (bounded) until the other side closes the session, cleanly or not.
    pub async fn closed(&mut self) {
        let mut rest = Vec::new();
        // Clean (EOF) or truncated (an error): either way the session is over.
        let _ = within("the session to be closed", self.io.read_to_end(&mut rest)).await;
        assert!(rest.is_empty(), "nothing was left to echo: {rest:?}");
    }

    /// Waits (bounded) until the other side ends the session, and says whether it was cut (a
    /// read error: the connection dropped without a TLS close) rather than closed cleanly.
    pub async fn cut(&mut self) -> bool {
        let mut rest = Vec::new();
        within("the session to end", self.io.read_to_end(&mut rest))
            .await
            .is_err()
    }

    /// Ends the session from the caller's side and waits for the kubelet's side to end too.
    pub async fn close(mut self) {
        within("closing the session", self.io.shutdown())
            .await
            .unwrap();
        self.closed().await;
    }
}

/// A followed container log being read.
pub struct FollowedLog {
    body: Incoming,
    /// Text received and not yet returned as whole lines.
    pending: String,
}

impl FollowedLog {
    /// Opens [`FOLLOW_TARGET`] through `client`; panics unless the answer is 200.
    pub async fn open(client: &Client) -> FollowedLog {
        let response = client
            .open(request("GET", FOLLOW_TARGET).body(empty()).unwrap())
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        FollowedLog {
            body: response.into_body(),
            pending: String::new(),
        }
    }

    /// Reads the next `n` lines; panics if the stream ends or breaks first.
    pub async fn lines(&mut self, n: usize) -> Vec<String> {
        let mut lines = Vec::new();
        while lines.len() < n {
            if let Some(end) = self.pending.find('\n') {
                lines.push(self.pending[..end].to_owned());
                self.pending.drain(..=end);
                continue;
            }
            let frame = within("the next log line", self.body.frame())
                .await
                .expect("the log stream goes on")
                .unwrap_or_else(|e| panic!("the log stream broke: {e}"));
            if let Ok(data) = frame.into_data() {
                self.pending.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
        lines
    }

    /// Waits (bounded) until the proxy ends the stream, and says whether it was cut (an error:
    /// an HTTP/1.1 chunked body without its last chunk, an HTTP/2 stream reset or connection
    /// lost) rather than ended the way a finished log ends.
    pub async fn cut(&mut self) -> bool {
        within("the end of the log stream", async {
            loop {
                match self.body.frame().await {
                    Some(Ok(_)) => {}
                    Some(Err(_)) => return true,
                    None => return false,
                }
            }
        })
        .await
    }

    /// Waits (bounded) until the proxy ends the stream, cleanly or not.
    pub async fn ended(&mut self) {
        within("the end of the log stream", async {
            while let Some(Ok(_)) = self.body.frame().await {}
        })
        .await;
    }
}

/// A request body of `chunks` chunks of `chunk_size` bytes, fed by a task so it can be larger
/// than any buffer on the way; returns the body and the feeder.
pub fn large_body(
    chunk_size: usize,
    chunks: usize,
) -> (super::client::Body, tokio::task::JoinHandle<()>) {
    let (tx, body) = super::client::channel_body();
    let feeder = tokio::spawn(async move {
        for i in 0..chunks {
            if tx
                .send(Bytes::from(vec![i as u8; chunk_size]))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    (body, feeder)
}
