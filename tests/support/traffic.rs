//! Live traffic that counts what it gets instead of insisting on 200s, for scenarios where a
//! neighbour fails on purpose: each worker sends requests over one keep-alive connection
//! (reconnecting when it breaks), and every answer is tallied by worker, by the phase of the
//! scenario it started and ended in, and by what came back (status and the start of the body, or
//! the transport error). Every request is bounded: one that takes longer than the scenario's
//! bound is tallied as `overdue`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Request;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::{Body, Client, Connection, Reply};

/// Between two requests of one worker: keeps the traffic from starving a shared machine.
const PAUSE: Duration = Duration::from_millis(5);
/// How much of a refusal's body goes into its tally key.
const BODY_PREFIX: usize = 48;

/// Builds a worker's `n`th request.
pub type MakeRequest = Arc<dyn Fn(u64) -> Request<Body> + Send + Sync>;

/// One worker: a name for the tally, the client it connects with, and its requests.
pub struct Worker {
    name: &'static str,
    client: Client,
    make: MakeRequest,
}

impl Worker {
    /// A worker named `name` sending `make(0)`, `make(1)`, … over connections of `client`.
    pub fn new(
        name: &'static str,
        client: Client,
        make: impl Fn(u64) -> Request<Body> + Send + Sync + 'static,
    ) -> Worker {
        Worker {
            name,
            client,
            make: Arc::new(make),
        }
    }
}

/// Answers by worker and phase: `"200"`, `"502 Bad Gateway: kubelet unavailable: …"`,
/// `"error: …"` or `"overdue"`, each with its count. A request that started in one phase and
/// ended in another is counted under `"straddled"` in the phase it ended in.
pub type Tally = BTreeMap<(&'static str, usize), BTreeMap<String, u64>>;

/// Shared between the workers and the scenario.
struct Shared {
    phase: AtomicUsize,
    tally: Mutex<Tally>,
    /// Requests finished, for waits.
    finished: AtomicU64,
}

impl Shared {
    fn count(&self, worker: &'static str, phase: usize, what: String) {
        *self
            .tally
            .lock()
            .unwrap()
            .entry((worker, phase))
            .or_default()
            .entry(what)
            .or_default() += 1;
        self.finished.fetch_add(1, Ordering::SeqCst);
    }
}

/// Running traffic; [`Traffic::stop`] ends it and hands back the tally.
pub struct Traffic {
    stop: watch::Sender<bool>,
    workers: Vec<(&'static str, JoinHandle<()>)>,
    shared: Arc<Shared>,
}

impl Traffic {
    /// Starts `workers` in phase 0; each request may take up to `bound`.
    pub fn start(workers: Vec<Worker>, bound: Duration) -> Traffic {
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            phase: AtomicUsize::new(0),
            tally: Mutex::new(Tally::new()),
            finished: AtomicU64::new(0),
        });
        let workers = workers
            .into_iter()
            .map(|w| {
                let name = w.name;
                let task = tokio::spawn(run(w, bound, stopped.clone(), Arc::clone(&shared)));
                (name, task)
            })
            .collect();
        Traffic {
            stop,
            workers,
            shared,
        }
    }

    /// Requests started from now on belong to `phase`.
    pub fn set_phase(&self, phase: usize) {
        self.shared.phase.store(phase, Ordering::SeqCst);
    }

    /// The answers of `worker` in `phase` so far.
    pub fn seen(&self, worker: &'static str, phase: usize) -> BTreeMap<String, u64> {
        self.shared
            .tally
            .lock()
            .unwrap()
            .get(&(worker, phase))
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `worker` has had `n` answers starting with `prefix` in `phase`, for at most
    /// `limit`; panics with the tally otherwise.
    pub async fn wait_for(
        &self,
        worker: &'static str,
        phase: usize,
        prefix: &str,
        n: u64,
        limit: Duration,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let seen: u64 = self
                .seen(worker, phase)
                .iter()
                .filter(|(what, _)| what.starts_with(prefix))
                .map(|(_, count)| count)
                .sum();
            if seen >= n {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{worker} had {seen} of {n} {prefix:?} answers in phase {phase} within \
                     {limit:?}; tally: {:#?}",
                    self.shared.tally.lock().unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the workers (each finishes or abandons the request it is in) and returns the tally.
    pub async fn stop(self) -> Tally {
        self.stop.send_replace(true);
        for (name, worker) in self.workers {
            if let Err(e) = worker.await {
                let phase = self.shared.phase.load(Ordering::SeqCst);
                self.shared
                    .count(name, phase, format!("worker failed: {e}"));
            }
        }
        self.shared.tally.lock().unwrap().clone()
    }
}

async fn run(
    worker: Worker,
    bound: Duration,
    mut stop: watch::Receiver<bool>,
    shared: Arc<Shared>,
) {
    let mut open: Option<Connection> = None;
    let mut n = 0;
    while !*stop.borrow() {
        let phase = shared.phase.load(Ordering::SeqCst);
        let request = (worker.make)(n);
        n += 1;
        let exchange = async {
            let conn = match &mut open {
                Some(conn) => conn,
                None => open.insert(worker.client.connect().await?),
            };
            let response = conn.send(request).await?;
            Reply::read(response).await
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(bound, exchange) => outcome,
            _ = stop.changed() => break,
        };
        let what = match outcome {
            Ok(Ok(reply)) if reply.status.is_success() => reply.status.as_u16().to_string(),
            Ok(Ok(reply)) => {
                let text = reply.text();
                let prefix: String = text.chars().take(BODY_PREFIX).collect();
                format!("{} {}", reply.status.as_u16(), prefix.trim_end())
            }
            Ok(Err(e)) => {
                open = None;
                format!("error: {e}")
            }
            Err(_) => {
                open = None;
                "overdue".to_owned()
            }
        };
        let ended = shared.phase.load(Ordering::SeqCst);
        if ended == phase {
            shared.count(worker.name, phase, what);
        } else {
            shared.count(worker.name, ended, "straddled".to_owned());
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// The answers of a tally entry other than `allowed` (prefixes), for assertion messages.
pub fn unexpected(seen: &BTreeMap<String, u64>, allowed: &[&str]) -> BTreeMap<String, u64> {
    seen.iter()
        .filter(|(what, _)| !allowed.iter().any(|a| what.starts_with(a)))
        .map(|(what, count)| (what.clone(), *count))
        .collect()
}
