//! Background traffic for scenarios that change the proxy while it serves: workers that send
//! `GET`s as fast as a short pause allows, over a long-lived HTTP/2 connection, a long-lived
//! HTTP/1.1 connection, and a new connection per request in each protocol. Every response must be
//! a 200 with the expected body; anything else (a status, a reset, a failed handshake) is a failure,
//! counted and kept for the report.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use rustls::pki_types::CertificateDer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::{
    ANY_TLS, Client, Connection, H2_AND_HTTP1, HTTP1_ONLY, Identity, Reply, empty, request,
};
use super::within;

/// Between two requests of one worker: keeps the load from starving the rest of a shared machine.
const PAUSE: Duration = Duration::from_millis(5);
/// Failure messages kept per worker (all of them are counted).
const KEPT_FAILURES: usize = 20;

/// How a worker uses connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// One connection for as long as it works.
    Persistent,
    /// A new connection (and TLS handshake) per request.
    Fresh,
}

/// What a worker saw.
#[derive(Debug, Default)]
struct WorkerReport {
    ok: u64,
    connections: u64,
    failed: u64,
    failures: Vec<String>,
}

/// What the whole load saw.
#[derive(Debug)]
pub struct LoadReport {
    /// Requests answered 200 with the expected body.
    pub ok: u64,
    /// Connections opened (handshakes completed).
    pub connections: u64,
    /// Requests that failed in any way.
    pub failed: u64,
    /// The first failures of each worker, described.
    pub failures: Vec<String>,
}

impl LoadReport {
    /// Panics, listing the failures, unless every request succeeded; prints the counts.
    pub fn assert_no_failures(&self, scenario: &str) {
        println!(
            "{scenario}: {} requests succeeded over {} connections, {} failed",
            self.ok, self.connections, self.failed
        );
        assert_eq!(
            self.failed,
            0,
            "{scenario}: {} of {} requests failed: {:#?}",
            self.failed,
            self.ok + self.failed,
            self.failures
        );
    }
}

/// Running background traffic; [`Load::stop`] ends it and reports.
pub struct Load {
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<WorkerReport>>,
    ok: Arc<AtomicU64>,
}

impl Load {
    /// Starts four workers sending `GET path` to `addr` as `identity`, trusting `root`; each
    /// response must be 200 with a body containing `expected`.
    pub fn start(
        root: &CertificateDer<'static>,
        addr: SocketAddr,
        identity: &Identity,
        path: &str,
        expected: &str,
    ) -> Load {
        let (stop, stopped) = watch::channel(false);
        let ok = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for (alpn, name) in [(H2_AND_HTTP1, "h2"), (HTTP1_ONLY, "http/1.1")] {
            let client = Client::configured(root, addr, identity.clone(), alpn, ANY_TLS);
            for reuse in [Reuse::Persistent, Reuse::Fresh] {
                workers.push(tokio::spawn(worker(
                    format!("{name} {reuse:?}"),
                    client.clone(),
                    reuse,
                    (path.to_owned(), expected.to_owned()),
                    stopped.clone(),
                    Arc::clone(&ok),
                )));
            }
        }
        Load { stop, workers, ok }
    }

    /// Waits (bounded) until `n` more requests have succeeded: traffic really flows now.
    pub async fn advance(&self, n: u64) {
        let target = self.ok.load(Ordering::SeqCst) + n;
        within(&format!("{n} more requests of the load"), async {
            while self.ok.load(Ordering::SeqCst) < target {
                tokio::time::sleep(PAUSE).await;
            }
        })
        .await;
    }

    /// Stops the workers (each finishes the request it is in) and adds up what they saw.
    pub async fn stop(self) -> LoadReport {
        self.stop.send_replace(true);
        let mut report = LoadReport {
            ok: 0,
            connections: 0,
            failed: 0,
            failures: Vec::new(),
        };
        for worker in self.workers {
            match within("stopping a load worker", worker).await {
                Ok(seen) => {
                    report.ok += seen.ok;
                    report.connections += seen.connections;
                    report.failed += seen.failed;
                    report.failures.extend(seen.failures);
                }
                Err(e) => {
                    report.failed += 1;
                    report.failures.push(format!("a worker panicked: {e}"));
                }
            }
        }
        report
    }
}

async fn worker(
    name: String,
    client: Client,
    reuse: Reuse,
    (path, expected): (String, String),
    stop: watch::Receiver<bool>,
    ok: Arc<AtomicU64>,
) -> WorkerReport {
    let mut report = WorkerReport::default();
    let fail = |report: &mut WorkerReport, what: String| {
        report.failed += 1;
        if report.failures.len() < KEPT_FAILURES {
            report.failures.push(format!("{name}: {what}"));
        }
    };
    let mut open: Option<Connection> = None;
    while !*stop.borrow() {
        let conn = match &mut open {
            Some(conn) => conn,
            None => match client.connect().await {
                Ok(conn) => {
                    report.connections += 1;
                    open.insert(conn)
                }
                Err(e) => {
                    fail(&mut report, format!("connecting: {e}"));
                    tokio::time::sleep(PAUSE).await;
                    continue;
                }
            },
        };
        let sent = conn
            .send(request("GET", &path).body(empty()).unwrap())
            .await;
        let reply = match sent {
            Ok(response) => Reply::read(response).await,
            Err(e) => Err(e),
        };
        match reply {
            Ok(reply) if reply.status == StatusCode::OK && reply.text().contains(&expected) => {
                report.ok += 1;
                ok.fetch_add(1, Ordering::SeqCst);
            }
            Ok(reply) => fail(
                &mut report,
                format!("{path}: {} {}", reply.status, reply.text()),
            ),
            Err(e) => {
                fail(&mut report, format!("{path}: {e}"));
                open = None;
            }
        }
        if reuse == Reuse::Fresh {
            open = None;
        }
        tokio::time::sleep(PAUSE).await;
    }
    report
}
