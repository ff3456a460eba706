//! Accepting: one loop per listener on the main runtime, sharing the bound on open connections
//! (`--max-connections`), each connection handed to the serving thread with the fewest; when
//! draining begins, the connections already queued are still served before the listener closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, warn};

use super::connection::Accepted;
use super::drain::Drain;
use super::serving_threads::{Dispatcher, Load, ServingThreads};
use crate::base::shutdown::Shutdown;

/// A connection accepted on the main runtime, on its way to a serving thread.
pub(super) struct Handed {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    /// Its place under `--max-connections`, held for its whole life.
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// Accepts on every listener, sharing one bound on open connections, and hands each connection to
/// a serving thread, until draining begins; then waits for the threads to have taken everything,
/// for the connections and sessions to end or be closed ([`Drain`]), and ends the threads.
pub(super) async fn serve(
    listeners: Vec<TcpListener>,
    slots: Arc<Semaphore>,
    dispatcher: Dispatcher<Handed>,
    mut threads: ServingThreads,
    drain: Drain,
    shutdown: Shutdown,
) {
    let mut loops = tokio::task::JoinSet::new();
    for listener in listeners {
        loops.spawn(accept_loop(
            listener,
            Arc::clone(&slots),
            dispatcher.clone(),
            shutdown.clone(),
        ));
    }
    while loops.join_next().await.is_some() {}
    // The threads' queues end once every dispatcher is gone; each thread then has started
    // serving everything handed to it.
    drop(dispatcher);
    threads.serving_ended().await;
    // Connections and upgraded sessions are the shutdown's tasks: the drain waits for them,
    // then closes those still open.
    drain.run(&shutdown).await;
    threads.stop().await;
}

/// One serving thread's intake: serves every connection handed to it, on this thread's runtime,
/// until the main runtime stops handing them over.
pub(super) async fn serve_handed(
    mut handed: mpsc::UnboundedReceiver<(Handed, Load)>,
    accepted: Accepted,
) {
    while let Some((Handed { tcp, peer, permit }, load)) = handed.recv().await {
        match TcpStream::from_std(tcp) {
            Ok(tcp) => accepted.serve(tcp, peer, permit, load),
            Err(e) => debug!(%peer, error = %e, "a serving thread cannot take a connection"),
        }
    }
}

/// Hands `tcp` to a serving thread, unless none is left (the process is stopping).
fn hand_over(
    dispatcher: &Dispatcher<Handed>,
    tcp: TcpStream,
    peer: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let tcp = match tcp.into_std() {
        Ok(tcp) => tcp,
        Err(e) => {
            debug!(%peer, error = %e, "cannot hand a connection to a serving thread");
            return;
        }
    };
    if dispatcher.dispatch(Handed { tcp, peer, permit }).is_err() {
        debug!(%peer, "no serving thread left to take a connection");
    }
}

/// Accepts connections on one listener until draining begins, then those already queued.
async fn accept_loop(
    listener: TcpListener,
    slots: Arc<Semaphore>,
    dispatcher: Dispatcher<Handed>,
    shutdown: Shutdown,
) {
    let mut accept_errors = AcceptBackoff::default();
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown.draining().cancelled() => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    accept_errors.succeeded();
                    accepted
                }
                Err(e) => {
                    // EMFILE or ENFILE when something beyond the budget holds descriptors: back
                    // off, doubling up to a second, and say so once a second at most.
                    let pause = accept_errors.failed(&e);
                    tokio::time::sleep(pause).await;
                    continue;
                }
            },
            () = shutdown.draining().cancelled() => break,
        };
        hand_over(&dispatcher, tcp, peer, permit);
    }
    accept_queued(listener, &slots, &dispatcher);
}

/// Serves the connections already in `listener`'s queue when draining begins, before the
/// listener is closed. Closing a listening socket resets every connection still queued on it;
/// beside another process on the same address (a surge rollout) those clients would see a reset
/// for a connection the kernel had already established. Served here, each gets its request
/// answered and the connection closed politely (see [`super::deadlines::LAST_CALL`]). Connections
/// that arrive between this sweep and the close are moved to the other process's socket by the
/// kernel only with `net.ipv4.tcp_migrate_req=1`
/// ([`crate::server::handover::explain_queue_migration`]).
fn accept_queued(listener: TcpListener, slots: &Arc<Semaphore>, dispatcher: &Dispatcher<Handed>) {
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(e) => {
            debug!(error = %e, "cannot take the queued connections");
            return;
        }
    };
    let mut served = 0usize;
    loop {
        let Ok(permit) = Arc::clone(slots).try_acquire_owned() else {
            break;
        };
        let Ok((tcp, peer)) = listener.accept() else {
            // WouldBlock: the queue is empty; anything else ends the sweep the same way.
            break;
        };
        if let Err(e) = tcp.set_nonblocking(true) {
            debug!(%peer, error = %e, "cannot serve a queued connection");
            continue;
        }
        if dispatcher.dispatch(Handed { tcp, peer, permit }).is_err() {
            debug!(%peer, "no serving thread left to take a queued connection");
            break;
        }
        served += 1;
    }
    if served > 0 {
        debug!(served, "served the connections queued when draining began");
    }
}

/// The accept loop's answer to failing `accept` calls: a pause that doubles from 10 ms to 1 s, and
/// a warning at most once a second with the count of failures since the last one.
#[derive(Debug)]
struct AcceptBackoff {
    pause: std::time::Duration,
    failures: u64,
    last_warning: Option<Instant>,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pause: ACCEPT_PAUSE_MIN,
            failures: 0,
            last_warning: None,
        }
    }
}

const ACCEPT_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(10);
const ACCEPT_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

impl AcceptBackoff {
    /// Records a failure; returns how long to pause before accepting again.
    fn failed(&mut self, error: &std::io::Error) -> std::time::Duration {
        self.failures += 1;
        if self
            .last_warning
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1))
        {
            warn!(%error, failures = self.failures, "accept failed; pausing");
            self.failures = 0;
            self.last_warning = Some(Instant::now());
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_PAUSE_MAX);
        pause
    }

    /// An accepted connection ends a run of failures.
    fn succeeded(&mut self) {
        self.pause = ACCEPT_PAUSE_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_back_off_doubling_to_a_second_and_reset_on_success() {
        let mut backoff = AcceptBackoff::default();
        let error = std::io::Error::from_raw_os_error(24);
        let pauses: Vec<u64> = (0..9)
            .map(|_| backoff.failed(&error).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(&error), ACCEPT_PAUSE_MIN);
    }
}
