//! The audit log: one `audit.k8s.io/v1` Event per kubelet API request, at level `Metadata`, in the
//! JSON shape kube-apiserver writes, so existing audit pipelines parse it unchanged. Events are
//! queued on the request path and written by one background thread; a full queue drops, never waits.

use std::time::{SystemTime, UNIX_EPOCH};

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::Offset;

pub mod acts;
pub mod budget;
mod event;
mod json;
pub mod metrics;
pub mod policy;
mod rotate;
mod summary;
mod writer;

pub use event::{
    AuditEvent, AuditId, AuditIdError, Authorization, ObjectRef, ReviewsSkipped, Stage, Summary,
    Suppressed,
};
pub use json::MIN_EVENT_BOUND;
pub use metrics::AuditMetrics;
pub use rotate::Rotation;
pub use summary::reviews_skipped_event;
pub use writer::{AuditLog, AuditOptions, AuditTarget, check_file_target};

/// `time` as a date and time of day in UTC. Go's formatting is proleptic Gregorian whatever the
/// year; so is jiff's within its range (years -9999 to 9999), and a clock outside it is written as
/// the nearest bound rather than failing the event.
pub(crate) fn utc(time: SystemTime) -> DateTime {
    let (seconds, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (
            i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            after.subsec_nanos() as i32,
        ),
        Err(before) => {
            let before = before.duration();
            (
                i64::try_from(before.as_secs()).map_or(i64::MIN, |s| -s),
                -(before.subsec_nanos() as i32),
            )
        }
    };
    let timestamp = Timestamp::new(seconds, nanos).unwrap_or(if seconds < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    });
    Offset::UTC.to_datetime(timestamp)
}

/// Writes `time` in UTC as `YYYY-MM-DD` `T` `hh:mm:ss` and `digits` (at most 9) digits of the
/// second, truncated, with `separator` between hours, minutes and seconds: the audit events'
/// timestamps (`:`) and the backups' names (`-`) are both this.
pub(crate) fn write_utc(
    out: &mut impl std::fmt::Write,
    time: SystemTime,
    separator: char,
    digits: u32,
) -> std::fmt::Result {
    let t = utc(time);
    let digits = digits.min(9);
    write!(
        out,
        "{:04}-{:02}-{:02}T{:02}{separator}{:02}{separator}{:02}.{:0width$}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.subsec_nanosecond() / 10_i32.pow(9 - digits),
        width = digits as usize,
    )
}

#[cfg(test)]
mod tests;
