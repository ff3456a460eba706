//! The proxy's shutdown, in two steps every long-lived task watches, and the tasks it waits for.
//!
//! 1. **Draining** (SIGTERM): stop accepting, readiness turns false, every connection closes
//!    gracefully (in-flight requests finish), the file watcher stops.
//! 2. **Closing** (the grace period is over): connections and upgraded sessions still open are
//!    dropped.
//!
//! Connections and upgraded sessions run on one [`TaskTracker`], so draining waits exactly for
//! them, whoever spawned them (the server or the forwarder).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shared by the server, the admin listener, the file watcher and the forwarder; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    draining: CancellationToken,
    closing: CancellationToken,
    tasks: TaskTracker,
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

    /// Runs `task` as one of the connections or sessions draining waits for.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Waits up to `grace_period` for every tracked task to end; then starts closing and waits
    /// for them to go. Returns whether everything ended within the grace period.
    pub async fn drain(&self, grace_period: Duration) -> bool {
        self.tasks.close();
        let in_time = tokio::time::timeout(grace_period, self.tasks.wait())
            .await
            .is_ok();
        if !in_time {
            self.closing.cancel();
            self.tasks.wait().await;
        }
        in_time
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test(start_paused = true)]
    async fn draining_waits_for_tasks_and_closing_ends_the_stragglers() {
        let shutdown = Shutdown::new();
        let finished = Arc::new(AtomicBool::new(false));
        let quick = Arc::clone(&finished);
        shutdown.spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            quick.store(true, Ordering::SeqCst);
        });
        assert!(shutdown.drain(Duration::from_secs(5)).await);
        assert!(finished.load(Ordering::SeqCst));
        assert!(!shutdown.closing().is_cancelled());

        let shutdown = Shutdown::new();
        let closing = shutdown.closing().clone();
        shutdown.spawn(async move { closing.cancelled().await });
        assert!(!shutdown.drain(Duration::from_secs(5)).await);
        assert!(shutdown.closing().is_cancelled());
    }
}
