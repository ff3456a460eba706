//! Hand-written bytes on the proxy's port, for what a well-behaved client library will not send:
//! malformed or ambiguous HTTP/1.1 over TLS, and bytes that are not TLS at all. Every read is
//! bounded by [`within`], so a proxy that never answers fails the scenario instead of hanging it.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::pki::Issued;
use super::within;

/// A TLS 1.2/1.3 client configuration trusting `root`, presenting `identity` when given, and
/// offering the `alpn` protocols.
pub fn tls_config(
    root: &CertificateDer<'static>,
    identity: Option<&Issued>,
    alpn: &[&[u8]],
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match identity {
        Some(issued) => builder
            .with_client_auth_cert(issued.chain.clone(), issued.key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Opens a TLS connection to `addr` with `config`.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    within("raw TLS connect", async {
        let tcp = TcpStream::connect(addr).await?;
        TlsConnector::from(config)
            .connect(ServerName::from(addr.ip()), tcp)
            .await
    })
    .await
}

/// Writes `bytes` and reads until the server closes the connection (a write or read error, e.g.
/// a reset after the server gave up, also ends the exchange). Returns what was read.
pub async fn exchange<S>(stream: &mut S, bytes: &[u8]) -> Vec<u8>
where
    S: AsyncReadExt + AsyncWriteExt + Unpin,
{
    within("raw exchange until the server closes", async {
        if stream.write_all(bytes).await.is_err() || stream.flush().await.is_err() {
            return Vec::new();
        }
        read_to_close(stream).await
    })
    .await
}

/// Reads until EOF or an error, returning what arrived before.
pub async fn read_to_close<S: AsyncReadExt + Unpin>(stream: &mut S) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return received,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

/// The status codes of the HTTP/1.1 responses in `received`, in order (status lines are found
/// at the start of the stream and after each `\r\n`).
pub fn statuses(received: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(received);
    text.split("\r\n")
        .filter_map(|line| line.strip_prefix("HTTP/1.1 "))
        .filter_map(|rest| rest.get(..3)?.parse().ok())
        .collect()
}
