//! What the micro-benchmarks share: an API server that answers every review the same way, over
//! plain HTTP on loopback, and a kubeconfig for it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// An API server answering every request with `answer` (a review's JSON, status 201), counting
/// them in `reviews`: enough to fill a cache once.
pub async fn answering_api_server(reviews: Arc<AtomicUsize>, answer: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let reviews = Arc::clone(&reviews);
            let service = service_fn(move |_request| {
                reviews.fetch_add(1, Ordering::Relaxed);
                async move {
                    http::Response::builder()
                        .status(201)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(answer.as_bytes())))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

/// A kubeconfig in `dir` for the API server at `addr`.
pub fn kubeconfig(dir: &Path, addr: SocketAddr) -> PathBuf {
    std::fs::create_dir_all(dir).expect("a temporary directory");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://{addr}'}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n\
             current-context: x\n"
        ),
    )
    .expect("a kubeconfig");
    path
}
