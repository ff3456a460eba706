//! Bounds the reviews of one kind in flight to one API server. Every distinct token or attribute
//! set that misses the caches costs an API server call and a socket; without a bound, a client
//! opening HTTP/2 streams with ever new tokens holds as many calls (and descriptors) as it likes.
//! Beyond the bound, reviews wait, at most `--apiserver-request-timeout` and at most
//! [`WAITING_PER_PERMIT`] per place; then they fail, and the request fails closed as any failed
//! review does (401 for a token, 500 for an authorization). Concurrent identical reviews are
//! coalesced before they get here, so one key never takes more than one place.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use super::metrics::{ApiServerMetrics, ReviewKind};

/// How many reviews may wait for each place in flight before new ones are refused at once.
pub const WAITING_PER_PERMIT: usize = 16;

/// Why a review did not get a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Too many reviews were already waiting.
    #[error(
        "{waiting} {kind} reviews already waiting for the {limit} allowed in flight (--apiserver-max-reviews-inflight)"
    )]
    QueueFull {
        kind: &'static str,
        waiting: usize,
        limit: usize,
    },
    /// No place came free in time.
    #[error(
        "no place among the {limit} {kind} reviews allowed in flight within {waited:?} (--apiserver-max-reviews-inflight)"
    )]
    Waited {
        kind: &'static str,
        limit: usize,
        waited: Duration,
    },
}

/// The places of one review kind.
#[derive(Debug)]
pub struct ReviewGate {
    kind: ReviewKind,
    limit: usize,
    places: Semaphore,
    waiting: AtomicUsize,
    wait: Duration,
    metrics: Arc<ApiServerMetrics>,
}

impl ReviewGate {
    /// `limit` reviews of `kind` in flight at once; others wait up to `wait`.
    pub fn new(
        kind: ReviewKind,
        limit: usize,
        wait: Duration,
        metrics: Arc<ApiServerMetrics>,
    ) -> Self {
        ReviewGate {
            kind,
            limit,
            places: Semaphore::new(limit),
            waiting: AtomicUsize::new(0),
            wait,
            metrics,
        }
    }

    /// Takes a place for one review (its attempts and retries), waiting when all are taken.
    pub async fn enter(&self) -> Result<Place<'_>, Refused> {
        let permit = match self.places.try_acquire() {
            Ok(permit) => permit,
            Err(_) => self.wait_for_place().await?,
        };
        self.metrics.in_flight(self.kind).inc();
        Ok(Place {
            _permit: permit,
            gate: self,
        })
    }

    async fn wait_for_place(&self) -> Result<SemaphorePermit<'_>, Refused> {
        let max_waiting = self.limit.saturating_mul(WAITING_PER_PERMIT);
        let waiting = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(self);
        if waiting >= max_waiting {
            self.metrics.refused(self.kind);
            return Err(Refused::QueueFull {
                kind: self.kind.as_str(),
                waiting,
                limit: self.limit,
            });
        }
        self.metrics.waiting(self.kind).inc();
        let acquired = tokio::time::timeout(self.wait, self.places.acquire()).await;
        self.metrics.waiting(self.kind).dec();
        match acquired {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout and a closed one both mean no place.
            Ok(Err(_)) | Err(_) => {
                self.metrics.refused(self.kind);
                Err(Refused::Waited {
                    kind: self.kind.as_str(),
                    limit: self.limit,
                    waited: self.wait,
                })
            }
        }
    }
}

/// Counts a review as waiting until dropped, however the wait ends.
struct Waiting<'a>(&'a ReviewGate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A review's place in flight, given back when dropped.
#[derive(Debug)]
pub struct Place<'a> {
    _permit: SemaphorePermit<'a>,
    gate: &'a ReviewGate,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.gate.metrics.in_flight(self.gate.kind).dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(limit: usize) -> ReviewGate {
        counted_gate(limit).0
    }

    /// A gate whose metrics are in the registry returned with it.
    fn counted_gate(limit: usize) -> (ReviewGate, prometheus_client::registry::Registry) {
        let mut registry = crate::base::metrics::registry();
        let metrics = Arc::new(ApiServerMetrics::register(&mut registry));
        let gate = ReviewGate::new(
            ReviewKind::TokenReview,
            limit,
            Duration::from_secs(1),
            metrics,
        );
        (gate, registry)
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_beyond_the_limit_waits_for_a_place_then_gets_it() {
        let gate = gate(1);
        let first = gate.enter().await.unwrap();
        let waiting = gate.enter();
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), waiting.as_mut())
                .await
                .is_err()
        );
        drop(first);
        assert!(waiting.await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_that_waits_too_long_is_refused_and_counted() {
        let (gate, registry) = counted_gate(1);
        let _first = gate.enter().await.unwrap();
        let refused = gate.enter().await.unwrap_err();
        assert!(matches!(refused, Refused::Waited { .. }), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("--apiserver-max-reviews-inflight")
        );
        let text = crate::base::metrics::encode(&registry);
        assert!(
            text.contains(
                "kubelet_auth_proxy_apiserver_reviews_refused_total{kind=\"TokenReview\"} 1"
            ),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let gate = Arc::new(gate(1));
        let _first = gate.enter().await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..WAITING_PER_PERMIT {
            let gate = Arc::clone(&gate);
            waiters.push(tokio::spawn(async move { gate.enter().await.map(|_| ()) }));
        }
        tokio::task::yield_now().await;
        while gate.waiting.load(Ordering::Acquire) < WAITING_PER_PERMIT {
            tokio::task::yield_now().await;
        }
        let refused = gate.enter().await.unwrap_err();
        assert!(matches!(refused, Refused::QueueFull { .. }), "{refused}");
        for waiter in waiters {
            assert!(waiter.await.unwrap().is_err(), "nobody gave the place back");
        }
    }
}
