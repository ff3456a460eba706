//! The one gate every TokenReview passes unless a cache answers: a token the node cannot settle
//! costs the API server a review, so whoever reaches the port could make it review as many
//! tokens as they can send. What the API server refuses is a *failure*, and failures are
//! budgeted: per source address ([`SOURCE_LIMITS`]) and for the node, all sources together
//! ([`OVERALL_LIMITS`]). Past the budget, tokens are answered 401 without a review until it
//! refills. Service-account tokens whose signature the node verified pass the gate too (a token
//! of a deleted pod or service account verifies until it expires, and the API server refuses
//! it); they are held by the node's budget but not by their source's, so a verified token from
//! an address shared with a flooder (the node's own, for host-network pods) is still reviewed.
//! Refused answers are cached by the caller ([`super::token`]), so a replayed token costs
//! nothing.
//!
//! A review holds a place in the budgets while it is in flight ([`FailureBudget::reserve`]): it
//! is sent only if, should every review in flight fail, the failures stay within budget, so no
//! burst of concurrent requests can overdraw it. When it settles, the place is charged if the API
//! server refused the token ([`Reservation::charge`]) and freed if the token authenticated or the
//! call itself failed ([`Reservation::refund`]). A request that finds the budget taken only by
//! reviews in flight waits for one to settle rather than being refused, so concurrent valid
//! tokens are delayed, never refused.
//!
//! **Fair to clean sources.** First come, first served would let a handful of flooding sources
//! spend the node's budget and lock every other source's new tokens out for as long as they
//! flood. Like kube-apiserver's API Priority and Fairness, the gate has two levels, and the
//! flows of the upper one have seats the lower cannot take. A *flow* is a source address and
//! whether its token was verified on the node; it is *in good standing* while none of its tokens
//! was refused, by the API server or by the budget, within [`STANDING`], and none of its reviews
//! is in flight. A review from a flow in good standing may take the node's last place; any other
//! leaves [`RESERVE`] places for them. A flooding source is out of standing after its first
//! refusal, so a clean source's first token is reviewed at once whatever the flooders do; and
//! when other clean sources took the reserve just before, it waits (at most [`STANDING_WAIT`])
//! for the next place the refill brings, which no flow out of standing can take first. The
//! cost to the API server is unchanged: the node's bucket bounds failures from every level.
//!
//! Sources are keyed by address (an IPv4-mapped IPv6 address as its IPv4 address) in a bounded
//! table ([`crate::base::budget::table`]) that remembers each source while its standing matters;
//! sources beyond it share one entry. Refusals are counted in
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
/// Places of the node's budget only flows in good standing may take.
pub const RESERVE: f64 = 1.0;
/// How long after a refused token a flow is out of standing: long enough that an attacker
/// resting each of a node's 110 pod addresses until it stands again gets fewer reviews in good
/// standing (110 per 10 minutes, 0.18/s) than the node's refill brings (0.5/s).
pub const STANDING: Duration = Duration::from_secs(600);
/// Longest a review in good standing waits for a place before its token is answered 401:
/// twice the node's refill interval.
pub const STANDING_WAIT: Duration = Duration::from_secs(4);
/// Sources per shard of the table: 4096 in all.
const SHARD_CAPACITY: usize = 256;
/// Shortest time between two summaries of one source.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);
/// How often the sources are looked through for summaries due.
const SWEEP: Duration = Duration::from_secs(10);
/// Summaries written per sweep, all sources together: 18 a minute. A source not reported in one
/// sweep keeps its count for the next.
const SUMMARIES_PER_SWEEP: usize = 3;

/// What the node knows of a token before its review, which decides the budgets it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Not a service-account token the node could verify: held by its source's budget and the
    /// node's.
    Unverified,
    /// A service-account token whose signature and claims the node verified: not a forgery, so
    /// held by the node's budget only.
    Verified,
}

impl Checked {
    fn index(self) -> usize {
        match self {
            Checked::Unverified => 0,
            Checked::Verified => 1,
        }
    }
}

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

/// One source's entry beside its bucket: what it has to report, and how its two flows
/// ([`Checked`]) stand.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceState {
    refused: Refused,
    /// When each flow last had a token refused, by the API server or by a budget.
    last_refused: [Option<Instant>; 2],
    /// Each flow's reviews in flight.
    in_flight: [u32; 2],
}

impl SourceState {
    fn in_good_standing(&self, checked: Checked, now: Instant) -> bool {
        let flow = checked.index();
        self.in_flight[flow] == 0
            && self.last_refused[flow]
                .is_none_or(|at| now.saturating_duration_since(at) >= STANDING)
    }
}

impl table::Pending for SourceState {
    fn is_empty(&self) -> bool {
        self.refused.requests == 0
    }

    fn remembers(&self, now: Instant) -> bool {
        self.last_refused
            .iter()
            .flatten()
            .any(|at| now.saturating_duration_since(*at) < STANDING)
    }

    fn take_report(&mut self) -> SourceState {
        SourceState {
            refused: std::mem::take(&mut self.refused),
            ..SourceState::default()
        }
    }
}

/// The budgets of failed token reviews, per source and for the node.
#[derive(Debug)]
pub struct FailureBudget {
    sources: Table<IpAddr, SourceState>,
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

/// What is free in a bucket with `held` places taken.
fn free(bucket: &Bucket, held: u32) -> f64 {
    bucket.tokens - f64::from(held)
}

/// Why no place was given now.
enum Blocked {
    /// The budget is spent by failures: refuse.
    Spent(Spent),
    /// The budget is taken by reviews in flight: wait for one to settle.
    InFlight,
    /// A flow in good standing finds no place: wait for a settle or for the refill to bring
    /// one, which only such flows may take.
    Refill(Duration),
}

/// One review's place in the budgets, held while it is in flight. Settled by
/// [`charge`](Reservation::charge) or [`refund`](Reservation::refund); dropped unsettled (the
/// request went away mid-review), it is charged.
#[derive(Debug)]
#[must_use = "a reservation is settled by charge or refund"]
pub struct Reservation {
    budget: Arc<FailureBudget>,
    source: IpAddr,
    checked: Checked,
    place: Place,
    settled: bool,
}

impl Reservation {
    /// The API server refused the token: a failure, charged.
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
            self.budget.settle(
                self.source,
                self.checked,
                self.place,
                failed,
                Instant::now(),
            );
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

    /// Takes a place for one review of a token from `source`, checked on the node as
    /// `checked`: at once when the budgets have one for this flow, after a wait while they are
    /// taken only by reviews in flight (or, in good standing, until the refill brings one, at
    /// most [`STANDING_WAIT`]), or never, saying which budget is spent (the refusal is counted
    /// and kept for the source's summary).
    pub async fn reserve(
        self: &Arc<Self>,
        source: IpAddr,
        checked: Checked,
    ) -> Result<Reservation, Spent> {
        let source = source.to_canonical();
        let give_up = Instant::now() + STANDING_WAIT;
        loop {
            let settled = self.settled.notified();
            let mut settled = std::pin::pin!(settled);
            // Registered before looking, so a settle between the look and the wait is not missed.
            settled.as_mut().enable();
            let now = Instant::now();
            match self.try_reserve(source, checked, now, SystemTime::now(), now >= give_up) {
                Ok(place) => {
                    return Ok(Reservation {
                        budget: Arc::clone(self),
                        source,
                        checked,
                        place,
                        settled: false,
                    });
                }
                Err(Blocked::Spent(spent)) => return Err(spent),
                Err(Blocked::InFlight) => settled.await,
                Err(Blocked::Refill(wait)) => {
                    let until = (now + wait).min(give_up);
                    tokio::select! {
                        () = settled => {}
                        () = tokio::time::sleep_until(until.into()) => {}
                    }
                }
            }
        }
    }

    /// One look at the budgets for a review of a `checked` token from `source`; `last` when
    /// a wait in good standing is over, so that no place is a refusal.
    fn try_reserve(
        &self,
        source: IpAddr,
        checked: Checked,
        now: Instant,
        wall: SystemTime,
        last: bool,
    ) -> Result<Place, Blocked> {
        let flow = checked.index();
        let verdict = self.sources.with_entry(&source, now, |entry, place| {
            let state = &mut entry.pending;
            let standing = state.in_good_standing(checked, now);
            let spent = if checked == Checked::Unverified
                && free(&entry.bucket, state.in_flight[flow]) < 1.0
            {
                if state.in_flight[flow] > 0 {
                    return Err(Blocked::InFlight);
                }
                Spent::Source
            } else {
                let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
                overall.bucket.refill(OVERALL_LIMITS, now);
                let needed = if standing { 1.0 } else { 1.0 + RESERVE };
                let free = free(&overall.bucket, overall.held);
                if free >= needed {
                    overall.held += 1;
                    entry.held += 1;
                    state.in_flight[flow] += 1;
                    return Ok(place);
                }
                if standing && !last {
                    let wait = (needed - free) / OVERALL_LIMITS.rate;
                    return Err(Blocked::Refill(Duration::from_secs_f64(wait.max(0.001))));
                }
                if overall.held > 0 && !last {
                    return Err(Blocked::InFlight);
                }
                Spent::Overall
            };
            state.last_refused[flow] = Some(now);
            let refused = &mut state.refused;
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

    fn settle(&self, source: IpAddr, checked: Checked, place: Place, failed: bool, now: Instant) {
        let flow = checked.index();
        self.sources.with_place(&source, place, now, |entry, _| {
            entry.held = entry.held.saturating_sub(1);
            let state = &mut entry.pending;
            state.in_flight[flow] = state.in_flight[flow].saturating_sub(1);
            if failed {
                state.last_refused[flow] = Some(now);
                if checked == Checked::Unverified {
                    entry.bucket.tokens = (entry.bucket.tokens - 1.0).max(0.0);
                }
            }
        });
        {
            let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
            overall.bucket.refill(OVERALL_LIMITS, now);
            overall.held = overall.held.saturating_sub(1);
            if failed {
                overall.bucket.tokens = (overall.bucket.tokens - 1.0).max(0.0);
            }
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
    due: table::Due<IpAddr, SourceState>,
    until: SystemTime,
    summarize: impl Fn(Option<IpAddr>, ReviewsSkipped, SystemTime, SystemTime),
) {
    let refused = due.pending.refused;
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

    /// `tries` reviews of `checked` tokens from `source` at `now`, one after the other, each
    /// failing: how many were sent.
    fn failures_of(
        budget: &FailureBudget,
        source: IpAddr,
        checked: Checked,
        tries: usize,
        now: Instant,
    ) -> usize {
        let wall = SystemTime::now();
        (0..tries)
            .filter(
                |_| match budget.try_reserve(source, checked, now, wall, true) {
                    Ok(place) => {
                        budget.settle(source, checked, place, true, now);
                        true
                    }
                    Err(Blocked::Spent(_)) => false,
                    Err(Blocked::InFlight | Blocked::Refill(_)) => {
                        panic!("nothing is in flight, and no wait is left")
                    }
                },
            )
            .count()
    }

    fn failures(budget: &FailureBudget, source: IpAddr, tries: usize, now: Instant) -> usize {
        failures_of(budget, source, Checked::Unverified, tries, now)
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
        let refused = one.pending.refused;
        assert_eq!((refused.requests, refused.own_budget), (194, 194));
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
        // A minute later the overall bucket is full again, and again the bound; every source
        // is out of standing now, so the reserve is left.
        let later = start + Duration::from_secs(60);
        let reviewed: usize = (0..=255)
            .map(|last| failures(&budget, ip(last), 10, later))
            .sum();
        assert_eq!(reviewed, 20 - RESERVE as usize);
    }

    #[test]
    fn verified_tokens_are_held_by_the_nodes_budget_not_their_sources() {
        let start = Instant::now();
        let budget = budget(start);
        // The source's own budget spent by tokens it could not verify…
        assert_eq!(failures(&budget, ip(1), 10, start), 5);
        // …its verified tokens are still reviewed, up to the node's budget (less the reserve
        // once out of standing), and no further.
        let verified = failures_of(&budget, ip(1), Checked::Verified, 100, start);
        assert_eq!(verified, 20 - 5 - RESERVE as usize);
        // The reserve is left to a clean source, and then nothing.
        assert_eq!(failures(&budget, ip(2), 2, start), 1);
        assert_eq!(failures(&budget, ip(3), 1, start), 0);
    }

    /// The promise of fairness, as the gate sees it: whatever sources out of standing do, a
    /// flow in good standing finds a place at once, and the node's failures stay within its
    /// budget.
    #[test]
    fn flooders_never_take_the_place_kept_for_flows_in_good_standing() {
        for flooders in [5u8, 20, 110] {
            let start = Instant::now();
            let budget = budget(start);
            let mut reviewed = 0;
            // A minute of flooding, every flooder trying ten times a second.
            for tenth in 0..600u64 {
                let now = start + Duration::from_millis(100 * tenth);
                for last in 1..=flooders {
                    reviewed += failures(&budget, ip(last), 1, now);
                    reviewed += failures_of(&budget, ip(last), Checked::Verified, 1, now);
                }
            }
            let bound = OVERALL_LIMITS.burst + OVERALL_LIMITS.rate * 60.0;
            assert!(reviewed as f64 <= bound, "{flooders}: {reviewed} > {bound}");
            let now = start + Duration::from_secs(60);
            let clean = ip(200);
            let place =
                budget.try_reserve(clean, Checked::Unverified, now, SystemTime::now(), false);
            assert!(
                matches!(place, Ok(Place::Own)),
                "{flooders} flooders: the clean source waits"
            );
        }
    }

    #[test]
    fn a_flow_stands_again_once_its_refusals_are_old() {
        let start = Instant::now();
        let budget = budget(start);
        let flow = |now| {
            budget.sources.with_entry(&ip(1), now, |entry, _| {
                entry.pending.in_good_standing(Checked::Unverified, now)
            })
        };
        assert!(flow(start));
        failures(&budget, ip(1), 1, start);
        assert!(!flow(start + STANDING - Duration::from_secs(1)));
        assert!(flow(start + STANDING));
        // The verified flow of the same address was never refused.
        assert!(budget.sources.with_entry(&ip(1), start, |entry, _| {
            entry.pending.in_good_standing(Checked::Verified, start)
        }));
    }

    #[tokio::test]
    async fn reviews_in_flight_hold_places_and_refunds_free_them() {
        let budget = budget(Instant::now());
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        let reserve = |source| budget.reserve(source, Checked::Unverified);
        // Five in flight take the source's whole budget: a sixth waits for one to settle.
        let mut in_flight = Vec::new();
        for _ in 0..5 {
            in_flight.push(reserve(ip(1)).await.expect("within the burst"));
        }
        let waiting = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move {
                budget
                    .reserve(mapped, Checked::Unverified)
                    .await
                    .map(Reservation::refund)
            }
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
        reserve(ip(1)).await.expect("one left").charge();
        assert_eq!(reserve(ip(1)).await.err(), Some(Spent::Source));
        assert_eq!(budget.skipped[0].get(), 1);
    }

    #[test]
    fn a_flow_in_good_standing_waits_for_the_refill_others_cannot_take() {
        let start = Instant::now();
        let budget = budget(start);
        let wall = SystemTime::now();
        // Twenty sources' failures spend the node's budget.
        for last in 1..=20 {
            assert_eq!(failures(&budget, ip(last), 1, start), 1);
        }
        // A source out of standing is refused; a clean one is told to wait for the refill,
        // no longer than one place takes to come back.
        assert!(matches!(
            budget.try_reserve(ip(1), Checked::Unverified, start, wall, false),
            Err(Blocked::Spent(Spent::Overall))
        ));
        let Err(Blocked::Refill(wait)) =
            budget.try_reserve(ip(100), Checked::Unverified, start, wall, false)
        else {
            panic!("a clean source waits");
        };
        assert!(wait <= Duration::from_secs_f64(1.0 / OVERALL_LIMITS.rate));
        // When the place comes, a flooder still cannot take it; the clean source can.
        let refilled = start + wait;
        assert!(matches!(
            budget.try_reserve(ip(2), Checked::Unverified, refilled, wall, false),
            Err(Blocked::Spent(Spent::Overall))
        ));
        let Ok(place) = budget.try_reserve(ip(100), Checked::Unverified, refilled, wall, false)
        else {
            panic!("the clean source takes the place");
        };
        budget.settle(ip(100), Checked::Unverified, place, true, refilled);
        // Its wait over with no place, a clean source is refused and out of standing.
        assert!(matches!(
            budget.try_reserve(ip(101), Checked::Unverified, refilled, wall, true),
            Err(Blocked::Spent(Spent::Overall))
        ));
        assert!(matches!(
            budget.try_reserve(ip(101), Checked::Unverified, refilled, wall, false),
            Err(Blocked::Spent(Spent::Overall))
        ));
    }
}
