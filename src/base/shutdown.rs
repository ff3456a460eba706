//! The proxy's shutdown, in two steps every long-lived task watches, and the tasks it waits for.
//!
//! 1. **Draining** (SIGTERM): stop accepting, readiness turns false, every connection closes
//!    gracefully (in-flight requests finish), the file watcher stops.
//! 2. **Closing**: connections and upgraded sessions still open are dropped. When that happens is
//!    the server's decision (`server::drain`): at the end of the grace period, or, once a
//!    successor serves on the sockets this process handed over, when the sessions still open
//!    then have ended or their own bound is over; at once on [`Shutdown::end_now`].
//!
//! Connections and upgraded sessions run on one [`TaskTracker`], so draining waits exactly for
//! them, whoever spawned them (the server or the forwarder).

use std::future::Future;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shared by the server, the admin listener, the file watcher and the forwarder; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    draining: CancellationToken,
    closing: CancellationToken,
    tasks: TaskTracker,
    /// Set once another process serves on this one's listening sockets (a handover).
    succeeded: Arc<AtomicBool>,
}

impl Shutdown {
    /// A shutdown that has not begun.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Cancelled when draining begins.
    pub fn draining(&self) -> &CancellationToken {
        &self.draining
    }

    /// Cancelled when the grace period is over and what is still open must close.
    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// Begins draining.
    pub fn begin(&self) {
        self.draining.cancel();
    }

    /// Closes everything still open now, whatever the drain was waiting for (a second stop
    /// signal, `SIGQUIT`, or a successor that begins its own drain).
    pub fn end_now(&self) {
        self.draining.cancel();
        self.closing.cancel();
    }

    /// Records that another process serves on this one's listening sockets: what is still open
    /// when this one stops may then be served on past the grace period.
    pub fn succeeded(&self) {
        self.succeeded.store(true, Ordering::Release);
    }

    /// Whether another process took this one's listening sockets over and serves on them.
    pub fn has_successor(&self) -> bool {
        self.succeeded.load(Ordering::Acquire)
    }

    /// Connections and sessions open now.
    pub fn open(&self) -> usize {
        self.tasks.len()
    }

    /// Runs `task` as one of the connections or sessions draining waits for.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Waits up to `period` for every tracked task to end (no new one is taken from now on);
    /// returns whether they all did. Closing meanwhile ([`Shutdown::end_now`]) ends the wait
    /// early.
    pub async fn wait(&self, period: Duration) -> bool {
        self.tasks.close();
        tokio::select! {
            done = tokio::time::timeout(period, self.tasks.wait()) => done.is_ok(),
            () = self.closing.cancelled() => self.tasks.is_empty(),
        }
    }

    /// Starts closing and waits for every tracked task to go.
    pub async fn close(&self) {
        self.tasks.close();
        self.closing.cancel();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[tokio::test(start_paused = true)]
    async fn draining_waits_for_tasks_and_closing_ends_the_stragglers() {
        let shutdown = Shutdown::new();
        let finished = Arc::new(AtomicBool::new(false));
        let quick = Arc::clone(&finished);
        shutdown.spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            quick.store(true, Ordering::SeqCst);
        });
        assert!(shutdown.wait(Duration::from_secs(5)).await);
        assert!(finished.load(Ordering::SeqCst));
        assert!(!shutdown.closing().is_cancelled());

        let shutdown = Shutdown::new();
        let closing = shutdown.closing().clone();
        shutdown.spawn(async move { closing.cancelled().await });
        assert!(!shutdown.wait(Duration::from_secs(5)).await);
        assert_eq!(shutdown.open(), 1, "waiting closes nothing");
        shutdown.close().await;
        assert!(shutdown.closing().is_cancelled());
        assert_eq!(shutdown.open(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn ending_now_cuts_a_wait_short_and_closes_what_is_open() {
        let shutdown = Shutdown::new();
        let closing = shutdown.closing().clone();
        shutdown.spawn(async move { closing.cancelled().await });
        assert_eq!(shutdown.open(), 1);
        let ender = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            ender.end_now();
        });
        let started = tokio::time::Instant::now();
        shutdown.wait(Duration::from_secs(3600)).await;
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(3),
            "ended by end_now, not the period"
        );
        shutdown.close().await;
        assert_eq!(shutdown.open(), 0);
        assert!(shutdown.draining().is_cancelled());
    }
}
