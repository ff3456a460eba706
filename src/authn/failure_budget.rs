//! The failed-authentication budget: a bearer token the node cannot check (not a service-account
//! JWT of the cluster's issuer, or the issuer's keys are not held) costs the API server a
//! TokenReview, so whoever reaches the port could make it review as many tokens as they can send.
//! Each source address therefore has a budget of failed reviews ([`SOURCE_LIMITS`]), and the node
//! one for all sources together ([`OVERALL_LIMITS`]): past it, such tokens are answered 401
//! without a review until the budget refills.
//!
//! A review holds a place in both budgets while it is in flight ([`FailureBudget::reserve`]): a
//! review is sent only if, should every review in flight fail, the failures stay within budget,
//! so no burst of concurrent requests can overdraw it. When the review settles, the place is
//! charged if the API server rejected the token ([`Reservation::charge`]) and freed if the token
//! authenticated or the call itself failed ([`Reservation::refund`]). A request that finds the
//! budget taken only by reviews in flight waits for one to settle rather than being refused, so
//! concurrent valid tokens are delayed, never refused. Cached answers never touch the budget, and
//! neither do service-account tokens whose signature the node verified: a valid token from a
//! flooding source is still served.
//!
//! Sources are keyed by address (an IPv4-mapped IPv6 address as its IPv4 address) in a bounded
//! table ([`crate::base::budget::table`]); sources beyond it share one budget, and the overall bucket
//! bounds what any number of sources can cost. Refusals are counted in
//! `kubelet_auth_proxy_token_reviews_skipped_total{budget}` and reported, one summary per source
//! and [`SUMMARY_INTERVAL`], in the process log and the audit log ([`FailureBudget::report`]).

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::base::budget::table::{self, Place, Table};
use crate::base::budget::{Bucket, Limits};

/// Each source's failed reviews: five at once, then one every 10 s.
pub const SOURCE_LIMITS: Limits = Limits {
    burst: 5.0,
    rate: 0.1,
};
/// The node's failed reviews, all sources together: twenty at once, then one every 2 s.
pub const OVERALL_LIMITS: Limits = Limits {
    burst: 20.0,
    rate: 0.5,
};
/// Sources per shard of the table: 4096 in all.
const SHARD_CAPACITY: usize = 256;
/// Shortest time between two summaries of one source.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);
/// How often the sources are looked through for summaries due.
const SWEEP: Duration = Duration::from_secs(10);
/// Summaries written per sweep, all sources together: 18 a minute. A source not reported in one
/// sweep keeps its count for the next.
const SUMMARIES_PER_SWEEP: usize = 3;

/// Which budget was spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// The source's own.
    Source,
    /// The node's, all sources together.
    Overall,
}

impl Spent {
    /// Why the token was not reviewed, for logs.
    pub fn reason(self) -> &'static str {
        match self {
            Spent::Source => {
                "token review skipped: this source's failed authentications are over budget"
            }
            Spent::Overall => {
                "token review skipped: failed authentications on this node are over budget"
            }
        }
    }
}

/// What a source had refused since its last summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Refused {
    requests: u64,
    own_budget: u64,
    since: Option<SystemTime>,
}

impl table::Pending for Refused {
    fn is_empty(&self) -> bool {
        self.requests == 0
    }
}

/// The budgets of failed token reviews, per source and for the node.
#[derive(Debug)]
pub struct FailureBudget {
    sources: Table<IpAddr, Refused>,
    overall: Mutex<Overall>,
    /// Woken whenever a review settles, for requests waiting for a place.
    settled: Notify,
    /// `kubelet_auth_proxy_token_reviews_skipped_total`, `source` then `overall`.
    skipped: [Counter; 2],
}

/// The node's bucket and the places reviews in flight hold in it.
#[derive(Debug)]
struct Overall {
    bucket: Bucket,
    held: u32,
}

/// Whether a bucket with `held` places taken has room for one more failure.
fn room(bucket: &Bucket, held: u32) -> bool {
    bucket.tokens - f64::from(held) >= 1.0
}

/// Why no place was given now.
enum Blocked {
    /// The budget is spent by failures: refuse.
    Spent(Spent),
    /// The budget is taken by reviews in flight: wait for one to settle.
    InFlight,
}

/// One review's place in the budgets, held while it is in flight. Settled by
/// [`charge`](Reservation::charge) or [`refund`](Reservation::refund); dropped unsettled (the
/// request went away mid-review), it is charged.
#[derive(Debug)]
#[must_use = "a reservation is settled by charge or refund"]
pub struct Reservation {
    budget: Arc<FailureBudget>,
    source: IpAddr,
    place: Place,
    settled: bool,
}

impl Reservation {
    /// The API server rejected the token: a failure, charged.
    pub fn charge(mut self) {
        self.settle(true);
    }

    /// The review did not fail because of the token (it authenticated, or the call failed):
    /// the place is freed.
    pub fn refund(mut self) {
        self.settle(false);
    }

    fn settle(&mut self, failed: bool) {
        if !std::mem::replace(&mut self.settled, true) {
            self.budget
                .settle(self.source, self.place, failed, Instant::now());
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.settle(true);
    }
}

impl FailureBudget {
    /// Full budgets; `skipped` counts refusals by the budget spent (`source`, `overall`).
    pub fn new(skipped: [Counter; 2]) -> FailureBudget {
        FailureBudget::starting(skipped, Instant::now())
    }

    fn starting(skipped: [Counter; 2], now: Instant) -> FailureBudget {
        FailureBudget {
            sources: Table::new(SOURCE_LIMITS, SHARD_CAPACITY, now),
            overall: Mutex::new(Overall {
                bucket: Bucket::full(OVERALL_LIMITS, now),
                held: 0,
            }),
            settled: Notify::new(),
            skipped,
        }
    }

    /// Takes a place for one review of a token from `source`, waiting while the budget is taken
    /// only by reviews in flight, or says which budget is spent (the refusal is counted and kept
    /// for the source's summary).
    pub async fn reserve(self: &Arc<Self>, source: IpAddr) -> Result<Reservation, Spent> {
        let source = source.to_canonical();
        loop {
            let settled = self.settled.notified();
            let mut settled = std::pin::pin!(settled);
            // Registered before looking, so a settle between the look and the wait is not missed.
            settled.as_mut().enable();
            match self.try_reserve(source, Instant::now(), SystemTime::now()) {
                Ok(place) => {
                    return Ok(Reservation {
                        budget: Arc::clone(self),
                        source,
                        place,
                        settled: false,
                    });
                }
                Err(Blocked::Spent(spent)) => return Err(spent),
                Err(Blocked::InFlight) => settled.await,
            }
        }
    }

    fn try_reserve(
        &self,
        source: IpAddr,
        now: Instant,
        wall: SystemTime,
    ) -> Result<Place, Blocked> {
        let verdict = self.sources.with_entry(&source, now, |entry, place| {
            let spent = if !room(&entry.bucket, entry.held) {
                if entry.held > 0 {
                    return Err(Blocked::InFlight);
                }
                Spent::Source
            } else {
                let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
                overall.bucket.refill(OVERALL_LIMITS, now);
                if room(&overall.bucket, overall.held) {
                    overall.held += 1;
                    entry.held += 1;
                    return Ok(place);
                }
                if overall.held > 0 {
                    return Err(Blocked::InFlight);
                }
                Spent::Overall
            };
            let refused = &mut entry.pending;
            refused.requests += 1;
            refused.own_budget += u64::from(spent == Spent::Source);
            refused.since.get_or_insert(wall);
            Err(Blocked::Spent(spent))
        });
        if let Err(Blocked::Spent(spent)) = verdict {
            self.skipped[usize::from(spent == Spent::Overall)].inc();
        }
        verdict
    }

    fn settle(&self, source: IpAddr, place: Place, failed: bool, now: Instant) {
        let cost = if failed { 1.0 } else { 0.0 };
        self.sources.with_place(&source, place, now, |entry, _| {
            entry.held = entry.held.saturating_sub(1);
            entry.bucket.tokens = (entry.bucket.tokens - cost).max(0.0);
        });
        {
            let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
            overall.bucket.refill(OVERALL_LIMITS, now);
            overall.held = overall.held.saturating_sub(1);
            overall.bucket.tokens = (overall.bucket.tokens - cost).max(0.0);
        }
        self.settled.notify_waiters();
    }

    /// Reports, every [`SWEEP`], the sources that had tokens refused: a warning in the process
    /// log and a call of `summarize` (which writes the audit log's summary event, whatever the
    /// audit log's flood budget, when there is an audit log), at most one per source per
    /// [`SUMMARY_INTERVAL`]. When `stop` is cancelled it reports what is still pending and
    /// returns.
    pub async fn report(
        self: Arc<Self>,
        summarize: impl Fn(Option<IpAddr>, ReviewsSkipped, SystemTime, SystemTime) + Send + 'static,
        stop: CancellationToken,
    ) {
        let mut sweep = tokio::time::interval(SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                () = stop.cancelled() => true,
                _ = sweep.tick() => false,
            };
            let due = if last {
                self.sources
                    .take_due(Instant::now(), Duration::ZERO, usize::MAX)
            } else {
                self.sources
                    .take_due(Instant::now(), SUMMARY_INTERVAL, SUMMARIES_PER_SWEEP)
            };
            let until = SystemTime::now();
            for due in due {
                report(due, until, &summarize);
            }
            if last {
                return;
            }
        }
    }
}

/// Says what one source (`None`: the sources beyond the table) had refused.
fn report(
    due: table::Due<IpAddr, Refused>,
    until: SystemTime,
    summarize: impl Fn(Option<IpAddr>, ReviewsSkipped, SystemTime, SystemTime),
) {
    let refused = due.pending;
    let since = refused.since.unwrap_or(until);
    let seconds = until.duration_since(since).unwrap_or_default().as_secs();
    let source = due.key.map_or_else(
        || "(sources beyond the table)".to_owned(),
        |ip| ip.to_string(),
    );
    warn!(
        %source,
        requests = refused.requests,
        own_budget = refused.own_budget,
        seconds,
        "bearer tokens answered 401 without a TokenReview: failed authentications over budget \
         (a client sending tokens the API server rejects; see kubelet_auth_proxy_token_reviews_skipped_total)"
    );
    let skipped = ReviewsSkipped {
        requests: refused.requests,
        own_budget: refused.own_budget,
        one_source: due.key.is_some(),
    };
    summarize(due.key, skipped, since, until);
}

/// One source's bearer tokens refused without a TokenReview because its failed authentications
/// were over budget, as [`FailureBudget::report`] summarizes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewsSkipped {
    /// Requests refused so.
    pub requests: u64,
    /// Of those, how many because the source's own budget was spent; the rest because the
    /// node's overall budget was.
    pub own_budget: u64,
    /// False for the sources beyond the budget's table, which share one budget.
    pub one_source: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn budget(now: Instant) -> Arc<FailureBudget> {
        Arc::new(FailureBudget::starting(Default::default(), now))
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    /// `tries` reviews from `source` at `now`, one after the other, each failing: how many were
    /// sent.
    fn failures(budget: &FailureBudget, source: IpAddr, tries: usize, now: Instant) -> usize {
        let wall = SystemTime::now();
        (0..tries)
            .filter(|_| match budget.try_reserve(source, now, wall) {
                Ok(place) => {
                    budget.settle(source, place, true, now);
                    true
                }
                Err(Blocked::Spent(_)) => false,
                Err(Blocked::InFlight) => panic!("nothing is in flight"),
            })
            .count()
    }

    #[test]
    fn a_source_spends_its_burst_then_its_rate_and_others_are_not_held() {
        let start = Instant::now();
        let budget = budget(start);
        assert_eq!(failures(&budget, ip(1), 100, start), 5);
        assert_eq!(budget.skipped[0].get(), 95);
        assert_eq!(
            failures(&budget, ip(1), 100, start + Duration::from_secs(10)),
            1
        );
        // Another source still has its own burst.
        assert_eq!(failures(&budget, ip(2), 100, start), 5);
        let due = budget.sources.take_due(start, Duration::ZERO, usize::MAX);
        let one = due.iter().find(|d| d.key == Some(ip(1))).unwrap();
        assert_eq!((one.pending.requests, one.pending.own_budget), (194, 194));
    }

    #[test]
    fn many_sources_are_held_by_the_overall_budget() {
        let start = Instant::now();
        let budget = budget(start);
        let reviewed: usize = (0..=255)
            .map(|last| failures(&budget, ip(last), 10, start))
            .sum();
        assert_eq!(reviewed, 20);
        assert!(budget.skipped[1].get() > 0);
        // A minute later the overall bucket is full again, and again the bound.
        let later = start + Duration::from_secs(60);
        let reviewed: usize = (0..=255)
            .map(|last| failures(&budget, ip(last), 10, later))
            .sum();
        assert_eq!(reviewed, 20);
    }

    #[tokio::test]
    async fn reviews_in_flight_hold_places_and_refunds_free_them() {
        let budget = budget(Instant::now());
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        // Five in flight take the source's whole budget: a sixth waits for one to settle.
        let mut in_flight = Vec::new();
        for _ in 0..5 {
            in_flight.push(budget.reserve(ip(1)).await.expect("within the burst"));
        }
        let waiting = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.reserve(mapped).await.map(Reservation::refund) }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the mapped address is the same source"
        );
        in_flight.pop().unwrap().refund();
        assert_eq!(waiting.await.unwrap(), Ok(()));
        // Four charged (one by being dropped unsettled): one place left, and no more.
        let last = in_flight.pop().unwrap();
        for reservation in in_flight.drain(..) {
            reservation.charge();
        }
        drop(last);
        budget.reserve(ip(1)).await.expect("one left").charge();
        assert_eq!(budget.reserve(ip(1)).await.err(), Some(Spent::Source));
        assert_eq!(budget.skipped[0].get(), 1);
    }
}
