//! The flood budget: a caller who can send requests, authenticated or not, must not be able to
//! write audit bytes faster than the kept files can hold them, or an exec recorded before a flood
//! is rotated out of every kept file within seconds. Every event passes it ([`Budget::charge`]),
//! and every request that acts passes it once more before it reaches the kubelet
//! ([`Budget::admit_act`]): the one admission point of audit bytes.
//!
//! Audit bytes are metered by two token buckets (in bytes of events as written): one per identity
//! (the user name; requests refused before authentication share one identity of their own) and
//! one overall. With K the kept bytes ([`kept_bytes`]) and R `--audit-log-flood-retention`, the
//! overall bucket holds K/18, may be overdrawn by K/18 more for acts ([`FloodLimits::floor`]),
//! and refills at 8K/(9R): however long a flood lasts, what it writes in any span of R is at most
//! K, so the kept files still reach back at least R. Each identity gets a quarter of the overall
//! bucket and rate for events that do not act, so one flooder cannot spend what others need.
//!
//! **Reads.** An event that does not act and is over budget is not written: it is counted in
//! `kubelet_auth_proxy_audit_events_suppressed_total{reason,authenticated}` and reported per
//! identity, with the subresources it asked for, in summary events ([`super::summary`]). It is
//! never invisible: the first event of an identity, verb and subresource in each
//! [`SAMPLE_INTERVAL`] is written whatever the budget ([`Admission::Sample`]).
//!
//! **Acts** ([`super::acts`]) are never unaudited: an act the budget admits is written whatever
//! the buckets hold. So acts are admitted before they act: at once while the overall bucket holds
//! bytes; once it is spent, only for identities writing at most their max-min fair share of the
//! overall rate among the identities writing ([`Budget::fair_share`], rates measured over
//! [`RATE_WINDOW`]), and only until the overdraft is spent. An identity that floods is refused
//! (`429` with `Retry-After`, counted in `kubelet_auth_proxy_audit_acts_refused_total` and in its
//! summary), so it cannot push another identity's exec out of the kept files within R; one that
//! acts at an ordinary rate is never refused because others flood.
//!
//! Identities are kept in a bounded table ([`crate::base::budget::table`]) of [`SHARD_CAPACITY`] per
//! shard, each while its rate matters; identities beyond it share one entry.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::event::Suppressed;
use super::metrics::SuppressedLabels;
use crate::base::budget::table::{self, Table};
use crate::base::budget::{Bucket, Limits};

/// Identities per shard of the table: 1024 in all.
pub const SHARD_CAPACITY: usize = 64;
/// The kept bytes assumed when rotation does not bound them: standard output, whose collector's
/// retention the proxy cannot see, and a file never rotated or whose backups are all kept.
pub const UNROTATED_KEPT_BYTES: u64 = 40 * 1024 * 1024;
/// Bytes a second set aside for summary events: [`super::summary::PER_MINUTE`] of at most 1 KiB.
pub const SUMMARY_RATE: f64 = super::summary::PER_MINUTE as f64 * 1024.0 / 60.0;
/// One identity's share of the overall bucket and rate, for events that do not act.
pub const IDENTITY_SHARE: f64 = 0.25;
/// How often an identity's suppressed events of one verb and subresource are sampled: the first
/// of each interval is written whatever the budget.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(60);
/// The window an identity's rate of audit bytes is measured over (an exponential average), for
/// the fair share of acts.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);
/// The part of the overall rate shared among identities while the overall bucket is overdrawn:
/// the rest repays the overdraft.
const REPAYING: f64 = 0.875;
/// How long a fair share, once computed, is used: it needs a look at every identity.
const FAIR_SHARE_REUSE: Duration = Duration::from_secs(1);
/// Longest `Retry-After` an act refused is told.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The bytes of audit events that survive rotation: `--audit-log-maxsize` ×
/// `--audit-log-maxbackup` (the current file is not counted: it may have just been started), or
/// [`UNROTATED_KEPT_BYTES`] when either is 0 or the log goes to standard output.
pub fn kept_bytes(file: bool, max_size_mb: u64, max_backups: u32) -> u64 {
    if !file || max_size_mb == 0 || max_backups == 0 {
        return UNROTATED_KEPT_BYTES;
    }
    max_size_mb
        .saturating_mul(super::rotate::MEGABYTE)
        .saturating_mul(u64::from(max_backups))
}

/// The overall bucket's limits and how far acts may overdraw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloodLimits {
    /// The bucket's size and rate.
    pub bucket: Limits,
    /// How far below empty acts admitted at their fair share may take it.
    pub floor: f64,
}

/// The overall bucket for `kept` bytes to last `retention` under any flood:
/// burst + floor + (rate + summaries) × retention = kept, with the burst and the overdraft each
/// an eighteenth of it. Summary events are written even when the bucket is empty, so their
/// bytes ([`SUMMARY_RATE`]) are set aside. The rate is never below one event of 1 KiB a minute.
pub fn flood_limits(kept: u64, retention: Duration) -> FloodLimits {
    let kept = kept as f64;
    let rate = kept * 8.0 / 9.0 / retention.as_secs_f64().max(1.0) - SUMMARY_RATE;
    FloodLimits {
        bucket: Limits {
            burst: kept / 18.0,
            rate: rate.max(1024.0 / 60.0),
        },
        floor: kept / 18.0,
    }
}

/// Who is charged: a user name, or every request refused before authentication.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Refused before authentication (401, and the path gate's 400 and 301).
    Unauthenticated,
    /// An authenticated user, by name.
    User(String),
}

/// Whether an event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Write it.
    Write,
    /// Write it, though over budget: the identity's first of this verb and subresource in
    /// [`SAMPLE_INTERVAL`], so that no read is invisible.
    Sample,
    /// Not written: the identity's own budget is spent.
    OwnBudget,
    /// Not written: the overall budget is spent.
    OverallBudget,
}

impl Admission {
    /// Whether the event is written.
    pub fn writes(self) -> bool {
        matches!(self, Admission::Write | Admission::Sample)
    }
}

/// An event to charge: whose, how large, and what it was for.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// Whose.
    pub identity: &'a Identity,
    /// Its bytes as written.
    pub bytes: u64,
    /// Its request acts: admitted already by [`Budget::admit_act`], so written whatever.
    pub acts: bool,
    /// Its verb, for samples and summaries.
    pub verb: &'static str,
    /// Its subresource (empty before the path was mapped), for samples and summaries.
    pub subresource: &'static str,
}

/// An act refused: over its identity's fair share while the overall budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActRefused {
    /// When an act of this identity may be admitted again, at the earliest.
    pub retry_after: Duration,
}

/// Most (verb, subresource) pairs an identity remembers samples and counts for: the kubelet's
/// subresources times the verbs that reach them, with room to spare.
const MAX_PAIRS: usize = 32;

/// What an identity had suppressed since its last summary, and what it is remembered by beyond
/// one (its rate, its samples).
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    pub(super) events: u64,
    pub(super) bytes: u64,
    pub(super) own_budget: u64,
    /// Acts refused before they reached the kubelet.
    pub(super) acts_refused: u64,
    /// Suppressed events by subresource (empty: before the path was mapped).
    pub(super) subresources: Vec<(&'static str, u64)>,
    /// When the first of them was suppressed.
    pub(super) since: Option<SystemTime>,
    /// The identity's rates of bytes and of events written, averaged over [`RATE_WINDOW`], as
    /// of `rated`.
    rate: f64,
    event_rate: f64,
    rated: Option<Instant>,
    /// When each (verb, subresource) was last written as a sample.
    sampled: Vec<(&'static str, &'static str, Instant)>,
}

impl Pending {
    /// How much of a rate measured at `rated` is left at `now`.
    fn decay(&self, now: Instant) -> f64 {
        self.rated.map_or(0.0, |at| {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            (-elapsed / RATE_WINDOW.as_secs_f64()).exp()
        })
    }

    /// The rate of bytes decayed to `now`.
    fn rate_at(&self, now: Instant) -> f64 {
        self.rate * self.decay(now)
    }

    /// The rate of bytes at `now` once one more of the identity's events (of its average size)
    /// is written.
    fn rate_after_one_more(&self, now: Instant) -> f64 {
        let decay = self.decay(now);
        let (rate, events) = (self.rate * decay, self.event_rate * decay);
        let average = if events > 0.0 { rate / events } else { 0.0 };
        rate + average / RATE_WINDOW.as_secs_f64()
    }

    /// Adds `bytes` written at `now` to the rates.
    fn wrote(&mut self, bytes: u64, now: Instant) {
        let decay = self.decay(now);
        let window = RATE_WINDOW.as_secs_f64();
        self.rate = self.rate * decay + bytes as f64 / window;
        self.event_rate = self.event_rate * decay + 1.0 / window;
        self.rated = Some(now);
    }

    /// Whether an event of `verb` on `subresource` is due as a sample at `now`; if so, it is
    /// taken as the sample. With [`MAX_PAIRS`] pairs remembered, the oldest is forgotten.
    fn take_sample(&mut self, verb: &'static str, subresource: &'static str, now: Instant) -> bool {
        let due = |at: Instant| now.saturating_duration_since(at) >= SAMPLE_INTERVAL;
        match self
            .sampled
            .iter_mut()
            .find(|(v, s, _)| *v == verb && *s == subresource)
        {
            Some((_, _, at)) if due(*at) => *at = now,
            Some(_) => return false,
            None => {
                if self.sampled.len() >= MAX_PAIRS {
                    self.sampled.retain(|(_, _, at)| !due(*at));
                }
                if self.sampled.len() >= MAX_PAIRS {
                    return false;
                }
                self.sampled.push((verb, subresource, now));
            }
        }
        true
    }

    fn suppressed(&mut self, charge: &Charge<'_>, own: bool, wall: SystemTime) {
        self.events += 1;
        self.bytes += charge.bytes;
        self.own_budget += u64::from(own);
        self.since.get_or_insert(wall);
        let known = self.subresources.len();
        match self
            .subresources
            .iter_mut()
            .find(|(s, _)| *s == charge.subresource)
        {
            Some((_, n)) => *n += 1,
            None if known < MAX_PAIRS => self.subresources.push((charge.subresource, 1)),
            None => {}
        }
    }
}

impl table::Pending for Pending {
    fn is_empty(&self) -> bool {
        self.events == 0 && self.acts_refused == 0
    }

    fn remembers(&self, now: Instant) -> bool {
        // Kept while it writes more than an event of 1 KiB a window, or a sample is recent.
        self.rate_at(now) * RATE_WINDOW.as_secs_f64() > 1024.0
            || self
                .sampled
                .iter()
                .any(|(_, _, at)| now.saturating_duration_since(*at) < SAMPLE_INTERVAL)
    }

    fn take_report(&mut self) -> Pending {
        Pending {
            events: std::mem::take(&mut self.events),
            bytes: std::mem::take(&mut self.bytes),
            own_budget: std::mem::take(&mut self.own_budget),
            acts_refused: std::mem::take(&mut self.acts_refused),
            subresources: std::mem::take(&mut self.subresources),
            since: self.since.take(),
            ..Pending::default()
        }
    }
}

/// A summary due: for whom (`None`: the identities beyond the table), and what.
pub(super) type Due = table::Due<Identity, Pending>;

/// The per-identity and overall byte budgets of the audit log.
#[derive(Debug)]
pub struct Budget {
    limits: FloodLimits,
    overall: Mutex<Bucket>,
    identities: Table<Identity, Pending>,
    /// The last fair share computed, and when.
    fair_share: Mutex<Option<(Instant, f64)>>,
    suppressed: Family<SuppressedLabels, Counter>,
    acts_refused: Counter,
}

impl Budget {
    /// Budgets for `kept` bytes to span `retention`, counting what they keep out in `suppressed`
    /// and the acts they refuse in `acts_refused`.
    pub fn new(
        kept: u64,
        retention: Duration,
        suppressed: Family<SuppressedLabels, Counter>,
        acts_refused: Counter,
    ) -> Budget {
        Budget::starting(kept, retention, suppressed, acts_refused, Instant::now())
    }

    fn starting(
        kept: u64,
        retention: Duration,
        suppressed: Family<SuppressedLabels, Counter>,
        acts_refused: Counter,
        now: Instant,
    ) -> Budget {
        let limits = flood_limits(kept, retention);
        Budget {
            limits,
            overall: Mutex::new(Bucket::full(limits.bucket, now)),
            identities: Table::new(limits.bucket.share(IDENTITY_SHARE), SHARD_CAPACITY, now),
            fair_share: Mutex::new(None),
            suppressed,
            acts_refused,
        }
    }

    /// The overall bucket's limits.
    pub fn limits(&self) -> FloodLimits {
        self.limits
    }

    /// Charges an event. One that acts is always written; a sample ([`Admission::Sample`]) too;
    /// any other only while both buckets hold its bytes.
    pub fn charge(&self, charge: &Charge<'_>) -> Admission {
        self.charge_at(charge, Instant::now(), SystemTime::now())
    }

    pub(super) fn charge_at(
        &self,
        charge: &Charge<'_>,
        now: Instant,
        wall: SystemTime,
    ) -> Admission {
        let cost = charge.bytes as f64;

        let admission = self
            .identities
            .with_entry(charge.identity, now, |entry, _| {
                let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
                overall.refill(self.limits.bucket, now);
                let admission = if charge.acts {
                    Admission::Write
                } else if entry.bucket.tokens < cost {
                    Admission::OwnBudget
                } else if overall.tokens < cost {
                    Admission::OverallBudget
                } else {
                    Admission::Write
                };
                let admission = match admission {
                    Admission::OwnBudget | Admission::OverallBudget
                        if entry
                            .pending
                            .take_sample(charge.verb, charge.subresource, now) =>
                    {
                        Admission::Sample
                    }
                    other => other,
                };
                match admission {
                    Admission::Write | Admission::Sample => {
                        entry.bucket.tokens = (entry.bucket.tokens - cost).max(0.0);
                        // An act admitted is written whole and its bytes owed whole: the overdraft
                        // is what keeps the next ones out. Other events only take what is there.
                        overall.tokens = if charge.acts {
                            overall.tokens - cost
                        } else {
                            (overall.tokens - cost).max(0.0)
                        };
                        entry.pending.wrote(charge.bytes, now);
                    }
                    Admission::OwnBudget | Admission::OverallBudget => {
                        entry
                            .pending
                            .suppressed(charge, admission == Admission::OwnBudget, wall);
                    }
                }
                admission
            });
        if !admission.writes() {
            let reason = match admission {
                Admission::OwnBudget => "budget",
                _ => "overall_budget",
            };
            self.suppressed
                .get_or_create(&SuppressedLabels {
                    reason,
                    authenticated: charge.identity != &Identity::Unauthenticated,
                })
                .inc();
        }
        admission
    }

    /// Whether `identity` may act now (its act's event will be written whatever the buckets
    /// hold): while the overall bucket holds bytes, yes; once it is spent, only if the identity,
    /// one more event of its average size written, still writes at most its fair share
    /// ([`Budget::fair_share`]), and the overdraft is not spent. A refusal is counted and kept
    /// for the identity's summary.
    pub fn admit_act(&self, identity: &Identity) -> Result<(), ActRefused> {
        self.admit_act_at(identity, Instant::now(), SystemTime::now())
    }

    pub(super) fn admit_act_at(
        &self,
        identity: &Identity,
        now: Instant,
        wall: SystemTime,
    ) -> Result<(), ActRefused> {
        let tokens = {
            let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
            overall.refill(self.limits.bucket, now);
            overall.tokens
        };
        if tokens > 0.0 {
            return Ok(());
        }
        let rate = self.limits.bucket.rate;
        // Until the bucket holds bytes again, at its rate.
        let refilled = seconds(-tokens / rate);
        let fair = self.fair_share(now);
        let verdict = self.identities.with_entry(identity, now, |entry, _| {
            let after = entry.pending.rate_after_one_more(now);
            let wait = if tokens <= -self.limits.floor {
                Some(refilled)
            } else if after > fair {
                // Until its rate has decayed to the fair share.
                Some(seconds(RATE_WINDOW.as_secs_f64() * (after / fair).ln()))
            } else {
                None
            };
            if wait.is_some() {
                entry.pending.acts_refused += 1;
                entry.pending.since.get_or_insert(wall);
            }
            wait
        });
        match verdict {
            None => Ok(()),
            Some(wait) => {
                self.acts_refused.inc();
                Err(ActRefused {
                    retry_after: wait.clamp(Duration::from_secs(1), MAX_RETRY_AFTER),
                })
            }
        }
    }

    /// The max-min fair share of the overall rate ([`REPAYING`] of it) among the identities
    /// writing: the rate `f` such that the identities writing less than `f` keep their rates and
    /// the others get `f` each, all together that rate. Computed from every identity's rate, so
    /// used for [`FAIR_SHARE_REUSE`] once computed; asked only while the overall bucket is spent.
    fn fair_share(&self, now: Instant) -> f64 {
        let mut cached = self
            .fair_share
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((at, share)) = *cached
            && now.saturating_duration_since(at) < FAIR_SHARE_REUSE
        {
            return share;
        }
        let mut rates = self.identities.fold(Vec::new(), now, |mut rates, entry| {
            let rate = entry.pending.rate_at(now);
            if rate > 0.0 {
                rates.push(rate);
            }
            rates
        });
        rates.sort_by(f64::total_cmp);
        let share = water_fill(&rates, self.limits.bucket.rate * REPAYING);
        *cached = Some((now, share));
        share
    }

    /// Takes the overall bucket's bytes for an event written whatever the budget (a summary).
    pub(super) fn take(&self, bytes: u64) {
        let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
        overall.refill(self.limits.bucket, Instant::now());
        overall.tokens = (overall.tokens - bytes as f64).max(0.0);
    }

    /// Takes, for at most `limit` identities, what they had suppressed, from those whose last
    /// summary is at least `interval` old (all of them when `interval` is zero).
    pub(super) fn take_due(&self, now: Instant, interval: Duration, limit: usize) -> Vec<Due> {
        self.identities.take_due(now, interval, limit)
    }
}

/// `value` seconds as a duration: none when negative, the longest when too large or not a number.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(Duration::MAX)
}

/// The max-min fair share of `capacity` among demands `sorted` in ascending order: the most the
/// largest may have once the others have theirs (so that, all together, they never ask more
/// than the capacity, even when they all fit).
fn water_fill(sorted: &[f64], capacity: f64) -> f64 {
    let mut left = capacity;
    for (i, &demand) in sorted.iter().enumerate() {
        let share = left / (sorted.len() - i) as f64;
        if demand > share || i + 1 == sorted.len() {
            return share;
        }
        left -= demand;
    }
    capacity
}

/// What the summary event of `due` reports.
pub(super) fn suppressed(due: &Due) -> Suppressed {
    Suppressed {
        identity: due.key.as_ref().map(|identity| match identity {
            Identity::Unauthenticated => String::new(),
            Identity::User(name) => name.clone(),
        }),
        events: due.pending.events,
        bytes: due.pending.bytes,
        own_budget: due.pending.own_budget,
        acts_refused: due.pending.acts_refused,
        subresources: due.pending.subresources.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::budget::table::SHARDS;

    const KEPT: u64 = 9 * 1024 * 1024;
    const HOUR: Duration = Duration::from_secs(3600);

    fn budget(now: Instant) -> (Budget, Family<SuppressedLabels, Counter>, Counter) {
        let (suppressed, refused) = (Family::default(), Counter::default());
        (
            Budget::starting(KEPT, HOUR, suppressed.clone(), refused.clone(), now),
            suppressed,
            refused,
        )
    }

    fn count(
        family: &Family<SuppressedLabels, Counter>,
        reason: &'static str,
        authenticated: bool,
    ) -> u64 {
        family
            .get_or_create(&SuppressedLabels {
                reason,
                authenticated,
            })
            .get()
    }

    fn user(name: &str) -> Identity {
        Identity::User(name.to_owned())
    }

    /// A `get` of `subresource` by `identity`, `bytes` long.
    fn read<'a>(identity: &'a Identity, bytes: u64, subresource: &'static str) -> Charge<'a> {
        Charge {
            identity,
            bytes,
            acts: false,
            verb: "get",
            subresource,
        }
    }

    /// An exec by `identity`, `bytes` long.
    fn act(identity: &Identity, bytes: u64) -> Charge<'_> {
        Charge {
            identity,
            bytes,
            acts: true,
            verb: "create",
            subresource: "proxy",
        }
    }

    #[test]
    fn the_limits_keep_the_kept_bytes_for_the_retention() {
        let limits = flood_limits(KEPT, HOUR);
        let written = limits.bucket.burst
            + limits.floor
            + (limits.bucket.rate + SUMMARY_RATE) * HOUR.as_secs_f64();
        assert!((written - KEPT as f64).abs() < 1.0, "{written}");
        assert_eq!(kept_bytes(true, 100, 4), 400 * 1024 * 1024);
        assert_eq!(kept_bytes(false, 100, 4), UNROTATED_KEPT_BYTES);
        assert_eq!(kept_bytes(true, 0, 4), UNROTATED_KEPT_BYTES);
        assert_eq!(kept_bytes(true, 100, 0), UNROTATED_KEPT_BYTES);
    }

    #[test]
    fn one_identity_gets_its_share_then_its_rate_and_the_rest_is_counted() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, family, _) = budget(start);
        let share = (KEPT / 18 / 4) as usize; // 128 KiB
        let event = 1024;
        let flood = user("flood");
        let written = (0..1000)
            .filter(|_| {
                budget
                    .charge_at(&read(&flood, event, "proxy"), start, wall)
                    .writes()
            })
            .count();
        // Its share, and one sample of what it asks for.
        assert_eq!(written, share / event as usize + 1);
        assert_eq!(count(&family, "budget", true), 1000 - written as u64);
        // Another identity is not held by the first one's flood.
        let other = user("other");
        assert_eq!(
            budget.charge_at(&read(&other, event, "proxy"), start, wall),
            Admission::Write
        );
        // An hour later the identity has its burst again.
        let later = start + HOUR;
        let written = (0..1000)
            .filter(|_| {
                budget
                    .charge_at(&read(&flood, event, "proxy"), later, wall)
                    .writes()
            })
            .count();
        assert_eq!(written, share / event as usize + 1);
    }

    #[test]
    fn no_read_is_invisible_one_sample_per_verb_and_subresource_a_minute() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, _, _) = budget(start);
        let flood = user("flood");
        // Its budget spent on cheap requests, again and again…
        let spend = |at| {
            while budget
                .charge_at(&read(&flood, 1024, "stats"), at, wall)
                .writes()
            {}
        };
        // …its reads of logs are still seen: the first of each minute.
        let logs = |at| {
            spend(at);
            (0..6)
                .filter(|_| {
                    budget
                        .charge_at(&read(&flood, 1024, "log"), at, wall)
                        .writes()
                })
                .count()
        };
        assert_eq!(logs(start), 1);
        assert_eq!(logs(start + Duration::from_secs(30)), 0);
        assert_eq!(logs(start + Duration::from_secs(61)), 1);
        // And the summary says which subresources and how many.
        let due = budget.take_due(start, Duration::ZERO, usize::MAX);
        let summary = suppressed(&due[0]);
        let count_of = |name| {
            summary
                .subresources
                .iter()
                .find(|(s, _)| *s == name)
                .map_or(0, |(_, n)| *n)
        };
        assert_eq!(count_of("log"), 3 * 6 - 2, "all but the two samples");
        assert!(count_of("stats") > 0);
    }

    #[test]
    fn many_identities_are_held_by_the_overall_budget_and_admitted_acts_are_written() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, family, _) = budget(start);
        let event = 4096;
        let mut written = 0u64;
        for i in 0..5000 {
            let who = if i % 2 == 0 {
                Identity::Unauthenticated
            } else {
                user(&format!("u{i}"))
            };
            // Each a subresource already sampled: only the budget decides.
            budget.charge_at(&read(&who, 1, "sampled"), start, wall);
            if budget
                .charge_at(&read(&who, event, "sampled"), start, wall)
                .writes()
            {
                written += event;
            }
        }
        assert!(written <= KEPT / 18, "{written}");
        assert!(written > KEPT / 18 - 2 * event, "{written}");
        assert!(count(&family, "overall_budget", true) > 0);
        assert!(count(&family, "budget", false) > 0);
        // With every bucket empty, an act admitted is still written.
        assert_eq!(
            budget.charge_at(&act(&user("u1"), event), start, wall),
            Admission::Write
        );
    }

    /// The promise for acts: one identity flooding allowed acts is refused once the overall
    /// budget is spent, and what all write within the retention stays within the kept bytes;
    /// an identity acting at an ordinary rate meanwhile is never refused.
    #[test]
    fn a_flooder_of_acts_is_refused_and_an_ordinary_actor_never() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, _, refused) = budget(start);
        let (flooder, admin) = (user("tenant"), user("admin"));
        let event = 16 * 1024;
        let (mut written, mut flood_refused, mut admin_refused) = (0u64, 0, 0);
        // An hour, in tenths of a second: the tenant tries 10 acts each, the admin one a minute.
        for tenth in 0..36_000u64 {
            let now = start + Duration::from_millis(100 * tenth);
            for _ in 0..10 {
                match budget.admit_act_at(&flooder, now, wall) {
                    Ok(()) => {
                        budget.charge_at(&act(&flooder, event), now, wall);
                        written += event;
                    }
                    Err(refusal) => {
                        assert!(refusal.retry_after >= Duration::from_secs(1));
                        flood_refused += 1;
                    }
                }
            }
            if tenth % 600 == 0 {
                match budget.admit_act_at(&admin, now, wall) {
                    Ok(()) => {
                        budget.charge_at(&act(&admin, 2048), now, wall);
                        written += 2048;
                    }
                    Err(_) => admin_refused += 1,
                }
            }
        }
        assert_eq!(admin_refused, 0, "the ordinary actor is never refused");
        assert!(flood_refused > 0);
        assert_eq!(refused.get(), flood_refused);
        // Within the hour (the retention), no more than the kept bytes.
        assert!(written <= KEPT, "{written} > {KEPT}");
        let due = budget.take_due(start, Duration::ZERO, usize::MAX);
        let tenant = due.iter().find(|d| d.key == Some(flooder.clone())).unwrap();
        assert_eq!(tenant.pending.acts_refused, flood_refused);
    }

    #[test]
    fn the_fair_share_fills_the_small_demands_first() {
        assert_eq!(
            water_fill(&[1.0, 2.0], 10.0),
            9.0,
            "all fit: the largest may grow to 9"
        );
        assert_eq!(water_fill(&[1.0, 2.0, 100.0], 10.0), 7.0);
        assert_eq!(water_fill(&[50.0, 100.0], 10.0), 5.0);
        assert_eq!(water_fill(&[], 10.0), 10.0);
    }

    #[test]
    fn identities_beyond_the_table_share_the_overflow_and_idle_ones_make_room() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, _, _) = budget(start);
        let big = KEPT; // more than any bucket: always suppressed, so never idle
        for i in 0..SHARDS * SHARD_CAPACITY * 2 {
            let who = user(&format!("u{i}"));
            budget.charge_at(&read(&who, big, ""), start, wall);
            budget.charge_at(&read(&who, big, ""), start, wall);
        }
        assert_eq!(budget.identities.len(), SHARDS * SHARD_CAPACITY);
        let due = budget.take_due(start, Duration::ZERO, usize::MAX);
        let total: u64 = due.iter().map(|d| d.pending.events).sum();
        // Each identity's first was its sample; those beyond the table share one.
        assert!(total >= (SHARDS * SHARD_CAPACITY * 2) as u64, "{total}");
        assert!(due.iter().any(|d| d.key.is_none()));
        // Reported, and later full again: idle, so a new name takes a place.
        let later = start + 2 * HOUR;
        let newcomer = user("newcomer");
        budget.charge_at(&read(&newcomer, 10, ""), later, wall);
        assert!(budget.identities.contains(&newcomer));
    }

    #[test]
    fn summaries_are_due_once_per_interval_per_identity() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, _, _) = budget(start);
        let flood = user("flood");
        for _ in 0..3 {
            budget.charge_at(&read(&flood, KEPT, "log"), start, wall);
        }
        let due = budget.take_due(start, Duration::from_secs(60), 18);
        assert_eq!(due.len(), 1);
        assert_eq!(suppressed(&due[0]).events, 2, "the first was its sample");
        assert_eq!(suppressed(&due[0]).identity.as_deref(), Some("flood"));
        budget.charge_at(&read(&flood, KEPT, "log"), start, wall);
        assert!(
            budget
                .take_due(start + Duration::from_secs(59), Duration::from_secs(60), 18)
                .is_empty()
        );
        let due = budget.take_due(start + Duration::from_secs(60), Duration::from_secs(60), 18);
        assert_eq!(due[0].pending.events, 1);
    }
}
