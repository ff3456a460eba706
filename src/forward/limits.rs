//! Bounds on what forwarded requests hold at the kubelet. Every request in flight to the kubelet
//! holds one upstream connection (the upstream client speaks HTTP/1.1) until its response body
//! ends, and an exec/attach/portForward session for its whole life. A caller that opens HTTP/2
//! streams and never reads their answers would otherwise hold as many upstream connections, and
//! descriptors, as it likes. So:
//!
//! - at most `--upstream-max-requests-inflight` requests are in flight to the kubelet in all;
//!   a request beyond waits for a place at most the upstream connect timeout, then gets 503;
//! - at most `--upstream-max-requests-inflight-per-user` of them belong to one user; a request
//!   beyond gets 429 at once, so one identity cannot take every place from the others.
//!
//! A [`Lease`] holds both places; the forwarder moves it into the response body ([`Leased`]) or
//! into the splice of an upgraded session, so the places are given back when the kubelet's
//! connection is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::base::held_body::Holding;

/// Why a request was not sent to the kubelet for want of a place. `Display` names the flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// The user already has its share of requests in flight.
    #[error(
        "too many requests in flight for this user (--upstream-max-requests-inflight-per-user={0})"
    )]
    User(usize),
    /// Every place was taken for longer than the wait allows.
    #[error("too many requests in flight to the kubelet (--upstream-max-requests-inflight={0})")]
    Total(usize),
}

/// The places of every forwarded request, shared by all connections.
#[derive(Debug)]
pub struct UpstreamLimits {
    total: Arc<Semaphore>,
    total_limit: usize,
    per_user_limit: usize,
    /// Requests in flight by user name, each count shared with its requests' places, which give
    /// it back without the lock. A user whose count nobody else holds is dropped from the map
    /// once the map reaches [`prune_at`](Self::prune_at) entries, so it holds at most that many.
    per_user: Mutex<HashMap<Arc<str>, Arc<AtomicUsize>>>,
    /// Twice the total limit: users with no request in flight are dropped when the map grows to
    /// this, which happens at most once per that many new users.
    prune_at: usize,
    wait: Duration,
    in_flight: Gauge,
}

impl UpstreamLimits {
    /// `total_limit` requests in flight, `per_user_limit` of them per user, a wait of at most
    /// `wait` for a place; `in_flight` counts the places taken.
    pub fn new(
        total_limit: usize,
        per_user_limit: usize,
        wait: Duration,
        in_flight: Gauge,
    ) -> Self {
        UpstreamLimits {
            total: Arc::new(Semaphore::new(total_limit)),
            total_limit,
            per_user_limit,
            per_user: Mutex::new(HashMap::new()),
            prune_at: total_limit.saturating_mul(2).max(64),
            wait,
            in_flight,
        }
    }

    /// Takes a place for one request of `user`.
    pub async fn acquire(self: &Arc<Self>, user: &str) -> Result<Lease, Busy> {
        let user = self.enter_user(user)?;
        let permit = match Arc::clone(&self.total).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                match tokio::time::timeout(self.wait, Arc::clone(&self.total).acquire_owned()).await
                {
                    Ok(Ok(permit)) => permit,
                    // Never closed; a timeout and a closed semaphore both mean no place.
                    Ok(Err(_)) | Err(_) => return Err(Busy::Total(self.total_limit)),
                }
            }
        };
        self.in_flight.inc();
        Ok(Lease {
            _user: user,
            _permit: permit,
            in_flight: self.in_flight.clone(),
        })
    }

    /// Counts one more request of `user`, unless it has its share. The count is checked and
    /// raised under the map's lock, so two requests cannot both take a user's last place; it is
    /// lowered without the lock, which can only make room.
    fn enter_user(&self, user: &str) -> Result<UserPlace, Busy> {
        let mut per_user = self.per_user.lock().unwrap_or_else(PoisonError::into_inner);
        let count = match per_user.get(user) {
            Some(count) => Arc::clone(count),
            None => {
                if per_user.len() >= self.prune_at {
                    // Only the map holds these counts: nobody has a request in flight.
                    per_user.retain(|_, count| Arc::strong_count(count) > 1);
                }
                let count = Arc::new(AtomicUsize::new(0));
                per_user.insert(Arc::from(user), Arc::clone(&count));
                count
            }
        };
        if count.load(Ordering::Acquire) >= self.per_user_limit {
            return Err(Busy::User(self.per_user_limit));
        }
        count.fetch_add(1, Ordering::AcqRel);
        Ok(UserPlace(count))
    }

    /// Users in the map, for tests of its bound.
    #[cfg(test)]
    fn users(&self) -> usize {
        self.per_user
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// One request's place in its user's share; given back on drop.
#[derive(Debug)]
struct UserPlace(Arc<AtomicUsize>);

impl Drop for UserPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A forwarded request's places (its user's and the total); given back when dropped.
#[derive(Debug)]
pub struct Lease {
    _user: UserPlace,
    _permit: OwnedSemaphorePermit,
    in_flight: Gauge,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.in_flight.dec();
    }
}

/// The kubelet's response body, holding its request's [`Lease`] until it ends or is dropped (an
/// upgraded session's lease is held by the splice instead, and its body holds none).
pub type Leased<B> = Holding<B, Lease>;

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_user: usize) -> Arc<UpstreamLimits> {
        Arc::new(UpstreamLimits::new(
            total,
            per_user,
            Duration::from_secs(1),
            Gauge::default(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn one_user_gets_its_share_and_no_more_while_others_still_get_places() {
        let limits = limits(4, 2);
        let a1 = limits.acquire("mallory").await.unwrap();
        let _a2 = limits.acquire("mallory").await.unwrap();
        assert_eq!(limits.acquire("mallory").await.unwrap_err(), Busy::User(2));
        let _b = limits.acquire("apiserver").await.unwrap();
        assert_eq!(limits.in_flight.get(), 3);
        drop(a1);
        let _a3 = limits.acquire("mallory").await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn beyond_the_total_a_request_waits_then_is_refused() {
        let limits = limits(1, 1);
        let first = limits.acquire("a").await.unwrap();
        assert_eq!(limits.acquire("b").await.unwrap_err(), Busy::Total(1));
        let waiting = {
            let limits = Arc::clone(&limits);
            tokio::spawn(async move { limits.acquire("c").await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(first);
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn the_map_of_users_stays_bounded_and_keeps_the_shares_in_use() {
        let limits = limits(40, 2);
        assert_eq!(limits.prune_at, 80);
        let held = acquire_all(&limits, &["held", "held"]).await;
        for n in 0..500 {
            let lease = limits.acquire(&format!("user-{n}")).await.unwrap();
            drop(lease);
            assert!(limits.users() <= 80, "{} users kept", limits.users());
        }
        // The user with requests in flight was never dropped: its share is still taken.
        assert_eq!(limits.acquire("held").await.unwrap_err(), Busy::User(2));
        drop(held);
        assert_eq!(limits.in_flight.get(), 0);
        let _again = acquire_all(&limits, &["held", "held"]).await;
    }

    async fn acquire_all(limits: &Arc<UpstreamLimits>, users: &[&str]) -> Vec<Lease> {
        let mut leases = Vec::new();
        for user in users {
            leases.push(limits.acquire(user).await.unwrap());
        }
        leases
    }
}
