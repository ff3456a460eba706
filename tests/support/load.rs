//! Background traffic for scenarios that change the proxy while it serves: workers that send
//! `GET`s as fast as a short pause allows, over a long-lived HTTP/2 connection, a long-lived
//! HTTP/1.1 connection, and a new connection per request in each protocol. Every response must be
//! a 200 with the expected body; anything else (a status, a reset, a failed handshake) is a failure,
//! counted and kept for the report.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use rustls::pki_types::CertificateDer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::{
    ANY_TLS, Client, Connection, H2_AND_HTTP1, HTTP1_ONLY, Identity, Reply, empty, request,
};
use super::{STEP_TIMEOUT, within};

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

/// What every worker updates as it goes, so that a stalled load can say why.
#[derive(Default)]
struct Progress {
    ok: AtomicU64,
    failed: AtomicU64,
    last_failure: Mutex<Option<String>>,
}

/// Running background traffic; [`Load::stop`] ends it and reports.
pub struct Load {
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<WorkerReport>>,
    progress: Arc<Progress>,
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
        let progress = Arc::new(Progress::default());
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
                    Arc::clone(&progress),
                )));
            }
        }
        Load {
            stop,
            workers,
            progress,
        }
    }

    /// Waits until `n` more requests have succeeded: traffic really flows now. Panics, with the
    /// failures seen, when that takes longer than [`STEP_TIMEOUT`].
    pub async fn advance(&self, n: u64) {
        let target = self.progress.ok.load(Ordering::SeqCst) + n;
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while self.progress.ok.load(Ordering::SeqCst) < target {
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "the load did not make {n} more requests in {STEP_TIMEOUT:?}; {} failed so far, the last: {:?}",
                    self.progress.failed.load(Ordering::SeqCst),
                    self.progress.last_failure.lock().unwrap()
                );
            }
            tokio::time::sleep(PAUSE).await;
        }
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
    progress: Arc<Progress>,
) -> WorkerReport {
    let mut report = WorkerReport::default();
    let fail = |report: &mut WorkerReport, what: String| {
        let what = format!("{name}: {what}");
        report.failed += 1;
        progress.failed.fetch_add(1, Ordering::SeqCst);
        *progress.last_failure.lock().unwrap() = Some(what.clone());
        if report.failures.len() < KEPT_FAILURES {
            report.failures.push(what);
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
                progress.ok.fetch_add(1, Ordering::SeqCst);
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
