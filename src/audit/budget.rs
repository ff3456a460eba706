//! The flood budget: a caller who can send requests, authenticated or not, must not be able to
//! write audit bytes faster than the kept files can hold them, or an exec recorded before a flood
//! is rotated out of every kept file within seconds.
//!
//! Audit bytes are metered by two token buckets (in bytes of events as written): one per identity
//! (the user name; requests refused before authentication share one identity of their own) and
//! one overall. With K the kept bytes ([`kept_bytes`]) and R `--audit-log-flood-retention`, the
//! overall bucket holds K/9 and refills at 8K/(9R): however long a flood lasts, what it writes in
//! any span of R is at most K, so the kept files still reach back at least R. Each identity gets
//! a quarter of the overall bucket and rate, so one flooder cannot spend what others need; four
//! or more flooders together are held by the overall bucket.
//!
//! An event over budget is not written: it is counted in
//! `kubelet_auth_proxy_audit_events_suppressed_total{reason,authenticated}` and reported per
//! identity in summary events ([`super::summary`]). Events of requests that act
//! ([`super::acts`]) and summary events are never suppressed; their bytes are still taken from
//! the buckets (down to empty), so they leave less room for floods, never more.
//!
//! Identities are kept in a bounded table ([`crate::base::budget::table`]) of [`SHARD_CAPACITY`] per
//! shard; identities beyond it share one bucket.

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
/// One identity's share of the overall bucket and rate.
pub const IDENTITY_SHARE: f64 = 0.25;

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

/// The overall bucket's size and rate for `kept` bytes to last `retention` under any flood:
/// burst + (rate + summaries) × retention = kept, with the burst a ninth of it. Summary events
/// are written even when the bucket is empty, so their bytes ([`SUMMARY_RATE`]) are set aside.
/// The rate is never below one event of 1 KiB a minute.
pub fn flood_limits(kept: u64, retention: Duration) -> Limits {
    let kept = kept as f64;
    let rate = kept * 8.0 / 9.0 / retention.as_secs_f64().max(1.0) - SUMMARY_RATE;
    Limits {
        burst: kept / 9.0,
        rate: rate.max(1024.0 / 60.0),
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
    /// Not written: the identity's own budget is spent.
    OwnBudget,
    /// Not written: the overall budget is spent.
    OverallBudget,
}

/// What an identity had suppressed since its last summary.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pending {
    pub(super) events: u64,
    pub(super) bytes: u64,
    pub(super) own_budget: u64,
    /// When the first of them was suppressed.
    pub(super) since: Option<SystemTime>,
}

impl table::Pending for Pending {
    fn is_empty(&self) -> bool {
        self.events == 0
    }
}

/// A summary due: for whom (`None`: the identities beyond the table), and what.
pub(super) type Due = table::Due<Identity, Pending>;

/// The per-identity and overall byte budgets of the audit log.
#[derive(Debug)]
pub struct Budget {
    overall_limits: Limits,
    overall: Mutex<Bucket>,
    identities: Table<Identity, Pending>,
    suppressed: Family<SuppressedLabels, Counter>,
}

impl Budget {
    /// Budgets for `kept` bytes to span `retention`, counting what they keep out in `suppressed`.
    pub fn new(
        kept: u64,
        retention: Duration,
        suppressed: Family<SuppressedLabels, Counter>,
    ) -> Budget {
        Budget::starting(kept, retention, suppressed, Instant::now())
    }

    fn starting(
        kept: u64,
        retention: Duration,
        suppressed: Family<SuppressedLabels, Counter>,
        now: Instant,
    ) -> Budget {
        let overall_limits = flood_limits(kept, retention);
        Budget {
            overall_limits,
            overall: Mutex::new(Bucket::full(overall_limits, now)),
            identities: Table::new(overall_limits.share(IDENTITY_SHARE), SHARD_CAPACITY, now),
            suppressed,
        }
    }

    /// The overall bucket's size and rate.
    pub fn limits(&self) -> Limits {
        self.overall_limits
    }

    /// Charges an event of `bytes` to `identity`. An event that `acts` is always written; any
    /// other only while both buckets hold its bytes.
    pub fn charge(&self, identity: &Identity, bytes: u64, acts: bool) -> Admission {
        self.charge_at(identity, bytes, acts, Instant::now(), SystemTime::now())
    }

    pub(super) fn charge_at(
        &self,
        identity: &Identity,
        bytes: u64,
        acts: bool,
        now: Instant,
        wall: SystemTime,
    ) -> Admission {
        let cost = bytes as f64;
        let admission = self.identities.with_entry(identity, now, |entry, _| {
            let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
            overall.refill(self.overall_limits, now);
            let admission = if acts {
                Admission::Write
            } else if entry.bucket.tokens < cost {
                Admission::OwnBudget
            } else if overall.tokens < cost {
                Admission::OverallBudget
            } else {
                Admission::Write
            };
            if admission == Admission::Write {
                entry.bucket.tokens = (entry.bucket.tokens - cost).max(0.0);
                overall.tokens = (overall.tokens - cost).max(0.0);
            } else {
                let pending = &mut entry.pending;
                pending.events += 1;
                pending.bytes += bytes;
                pending.own_budget += u64::from(admission == Admission::OwnBudget);
                pending.since.get_or_insert(wall);
            }
            admission
        });
        if admission != Admission::Write {
            let reason = match admission {
                Admission::OwnBudget => "budget",
                _ => "overall_budget",
            };
            self.suppressed
                .get_or_create(&SuppressedLabels {
                    reason,
                    authenticated: identity != &Identity::Unauthenticated,
                })
                .inc();
        }
        admission
    }

    /// Takes the overall bucket's bytes for an event written whatever the budget (a summary).
    pub(super) fn take(&self, bytes: u64) {
        let mut overall = self.overall.lock().unwrap_or_else(PoisonError::into_inner);
        overall.refill(self.overall_limits, Instant::now());
        overall.tokens = (overall.tokens - bytes as f64).max(0.0);
    }

    /// Takes, for at most `limit` identities, what they had suppressed, from those whose last
    /// summary is at least `interval` old (all of them when `interval` is zero).
    pub(super) fn take_due(&self, now: Instant, interval: Duration, limit: usize) -> Vec<Due> {
        self.identities.take_due(now, interval, limit)
    }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::budget::table::SHARDS;

    const KEPT: u64 = 9 * 1024 * 1024;
    const HOUR: Duration = Duration::from_secs(3600);

    fn budget(now: Instant) -> (Budget, Family<SuppressedLabels, Counter>) {
        let suppressed = Family::default();
        (
            Budget::starting(KEPT, HOUR, suppressed.clone(), now),
            suppressed,
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

    #[test]
    fn the_limits_keep_the_kept_bytes_for_the_retention() {
        let limits = flood_limits(KEPT, HOUR);
        let written = limits.burst + (limits.rate + SUMMARY_RATE) * HOUR.as_secs_f64();
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
        let (budget, family) = budget(start);
        let share = (KEPT / 9 / 4) as usize; // 256 KiB
        let event = 1024;
        let written = (0..1000)
            .filter(|_| {
                budget.charge_at(&user("flood"), event, false, start, wall) == Admission::Write
            })
            .count();
        assert_eq!(written, share / event as usize);
        assert_eq!(count(&family, "budget", true), 1000 - written as u64);
        // Another identity is not held by the first one's flood.
        assert_eq!(
            budget.charge_at(&user("other"), event, false, start, wall),
            Admission::Write
        );
        // An hour later the identity has its burst again (a quarter of 7 MiB an hour is more).
        let later = start + HOUR;
        let written = (0..1000)
            .filter(|_| {
                budget.charge_at(&user("flood"), event, false, later, wall) == Admission::Write
            })
            .count();
        assert_eq!(written, share / event as usize);
    }

    #[test]
    fn many_identities_are_held_by_the_overall_budget_and_acts_never() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, family) = budget(start);
        let event = 4096;
        let mut written = 0u64;
        for i in 0..5000 {
            let who = if i % 2 == 0 {
                Identity::Unauthenticated
            } else {
                user(&format!("u{i}"))
            };
            if budget.charge_at(&who, event, false, start, wall) == Admission::Write {
                written += event;
            }
        }
        assert!(written <= KEPT / 9, "{written}");
        assert!(written > KEPT / 9 - 2 * event, "{written}");
        assert!(count(&family, "overall_budget", true) > 0);
        assert!(count(&family, "budget", false) > 0);
        // With every bucket empty, an act is still written.
        assert_eq!(
            budget.charge_at(&user("u1"), event, true, start, wall),
            Admission::Write
        );
        assert_eq!(
            budget.charge_at(&Identity::Unauthenticated, event, true, start, wall),
            Admission::Write
        );
    }

    #[test]
    fn identities_beyond_the_table_share_the_overflow_and_idle_ones_make_room() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, _) = budget(start);
        let big = KEPT; // more than any bucket: always suppressed, so never idle
        for i in 0..SHARDS * SHARD_CAPACITY * 2 {
            budget.charge_at(&user(&format!("u{i}")), big, false, start, wall);
        }
        assert_eq!(budget.identities.len(), SHARDS * SHARD_CAPACITY);
        let due = budget.take_due(start, Duration::ZERO, usize::MAX);
        let total: u64 = due.iter().map(|d| d.pending.events).sum();
        assert_eq!(total, (SHARDS * SHARD_CAPACITY * 2) as u64);
        assert!(due.iter().any(|d| d.key.is_none()));
        // Reported, and later full again: idle, so a new name takes a place.
        let later = start + HOUR;
        budget.charge_at(&user("newcomer"), 10, false, later, wall);
        assert!(budget.identities.contains(&user("newcomer")));
    }

    #[test]
    fn summaries_are_due_once_per_interval_per_identity() {
        let start = Instant::now();
        let wall = SystemTime::now();
        let (budget, _) = budget(start);
        for _ in 0..2 {
            budget.charge_at(&user("flood"), KEPT, false, start, wall);
        }
        let due = budget.take_due(start, Duration::from_secs(60), 18);
        assert_eq!(due.len(), 1);
        assert_eq!(suppressed(&due[0]).events, 2);
        assert_eq!(suppressed(&due[0]).identity.as_deref(), Some("flood"));
        budget.charge_at(&user("flood"), KEPT, false, start, wall);
        assert!(
            budget
                .take_due(start + Duration::from_secs(59), Duration::from_secs(60), 18)
                .is_empty()
        );
        let due = budget.take_due(start + Duration::from_secs(60), Duration::from_secs(60), 18);
        assert_eq!(due[0].pending.events, 1);
    }
}
