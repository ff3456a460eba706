//! Summary events: what the flood budget ([`super::budget`]) kept out of the log is never lost
//! silently. Each identity with suppressed events gets an audit event saying how many, how many
//! bytes, why, and over which interval (`requestReceivedTimestamp` to `stageTimestamp`): at most
//! one per identity per [`INTERVAL`], and at most [`PER_MINUTE`] a minute in all, so summaries
//! cannot become a flood of their own. What is still pending when the log closes is summarized
//! then, whatever those limits. [`reviews_skipped_event`] is the summary of another budget's
//! refusals, written by its owner.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::Uri;

use super::budget::{Budget, Due, Identity, suppressed};
use super::event::{AuditEvent, AuditId, ReviewsSkipped, Stage, Summary};
use crate::authn::User;

/// Shortest time between two summaries of one identity.
pub const INTERVAL: Duration = Duration::from_secs(60);
/// Most summary events written a minute, all identities together.
pub const PER_MINUTE: usize = 18;
/// How often the identities are looked through for summaries due.
const SWEEP: Duration = Duration::from_secs(10);
/// Summaries written per sweep: [`PER_MINUTE`] a minute.
const PER_SWEEP: usize = PER_MINUTE * SWEEP.as_secs() as usize / 60;

/// When the identities were last looked through.
#[derive(Debug)]
pub(super) struct Summaries {
    swept: Mutex<Instant>,
}

impl Summaries {
    pub(super) fn new() -> Summaries {
        Summaries {
            swept: Mutex::new(Instant::now()),
        }
    }

    /// The summary events due now: none unless a sweep is due and no other thread is sweeping.
    pub(super) fn due(&self, budget: &Budget) -> Vec<AuditEvent> {
        let now = Instant::now();
        let Ok(mut swept) = self.swept.try_lock() else {
            return Vec::new();
        };
        if now.saturating_duration_since(*swept) < SWEEP {
            return Vec::new();
        }
        *swept = now;
        drop(swept);
        events(budget.take_due(now, INTERVAL, PER_SWEEP))
    }

    /// Every summary still pending, for when the log closes.
    pub(super) fn remaining(budget: &Budget) -> Vec<AuditEvent> {
        events(budget.take_due(Instant::now(), Duration::ZERO, usize::MAX))
    }
}

fn events(due: Vec<Due>) -> Vec<AuditEvent> {
    let until = SystemTime::now();
    due.iter().filter_map(|due| event(due, until)).collect()
}

/// The summary event of `due`, up to `until`; `None` when no audit ID can be had.
pub(super) fn event(due: &Due, until: SystemTime) -> Option<AuditEvent> {
    let user = match &due.key {
        Some(Identity::User(name)) => Some(Arc::new(User {
            name: name.clone(),
            ..User::default()
        })),
        _ => None,
    };
    let mut event = summary_event(
        Summary::Suppressed(suppressed(due)),
        due.pending.since.unwrap_or(until),
        until,
    )?;
    event.user = user;
    Some(event)
}

/// The summary event of a source's requests answered 401 without a TokenReview from `since` to
/// `until` ([`crate::authn::failure_budget`]); `source` is `None` for the sources beyond the
/// budget's table. `None` when no audit ID can be had.
pub fn reviews_skipped_event(
    source: Option<IpAddr>,
    skipped: ReviewsSkipped,
    since: SystemTime,
    until: SystemTime,
) -> Option<AuditEvent> {
    let mut event = summary_event(Summary::ReviewsSkipped(skipped), since, until)?;
    if let Some(source) = source {
        event.source_ip = source;
    }
    event.response_code = 401;
    Some(event)
}

/// An event reporting `summary` over `since` to `until`: no request of its own (`requestURI`
/// `/`, no verb, user, source or status); `None` when no audit ID can be had.
fn summary_event(summary: Summary, since: SystemTime, until: SystemTime) -> Option<AuditEvent> {
    Some(AuditEvent {
        id: AuditId::random().ok()?,
        stage: Stage::ResponseComplete,
        request_uri: Uri::from_static("/"),
        verb: "",
        user: None,
        source_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        user_agent: None,
        object_ref: None,
        response_code: 0,
        request_received: since,
        stage_timestamp: until,
        authorization: None,
        summary: Some(Box::new(summary)),
    })
}
