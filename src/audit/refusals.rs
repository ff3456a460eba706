//! The audit events of requests refused before authentication (401, and the path gate's 400 and
//! 301) cost a client nothing to cause: one socket can send thousands a second, each event as long
//! as its URI, enough to fill a disk or rotate a recorded exec out of every kept file. So they are
//! admitted at [`RATE`] a second (bursts of [`BURST`]); the rest are not written, counted in
//! `kubelet_auth_proxy_audit_events_suppressed_total`, and reported in the process log at most
//! once per [`REPORT_INTERVAL`]. Events of authenticated requests are never suppressed.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

/// Events of refused, unauthenticated requests written per second, sustained.
pub const RATE: f64 = 20.0;
/// Events of refused, unauthenticated requests written at once after a quiet spell.
pub const BURST: f64 = 200.0;
/// Shortest time between two reports of suppressed events.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// A token bucket over the audit events of refused, unauthenticated requests.
#[derive(Debug)]
pub struct RefusalSampler {
    bucket: Mutex<Bucket>,
    suppressed: Counter,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    unreported: u64,
    reported: Instant,
}

impl RefusalSampler {
    /// A full bucket; suppressed events are counted in `suppressed`.
    pub fn new(suppressed: Counter) -> RefusalSampler {
        let now = Instant::now();
        RefusalSampler {
            bucket: Mutex::new(Bucket {
                tokens: BURST,
                refilled: now,
                unreported: 0,
                reported: now,
            }),
            suppressed,
        }
    }

    /// Whether the next such event is written; when not, it is counted.
    pub fn admit(&self) -> bool {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * RATE).min(BURST);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return true;
        }
        self.suppressed.inc();
        bucket.unreported += 1;
        if now.saturating_duration_since(bucket.reported) >= REPORT_INTERVAL {
            tracing::warn!(
                suppressed = bucket.unreported,
                "audit events of requests refused before authentication suppressed: more than {RATE} a second"
            );
            bucket.unreported = 0;
            bucket.reported = now;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_then_the_rate_and_the_rest_is_counted() {
        let sampler = RefusalSampler::new(Counter::default());
        let start = Instant::now();
        let admitted = (0..1000).filter(|_| sampler.admit_at(start)).count();
        assert_eq!(admitted, BURST as usize);
        assert_eq!(sampler.suppressed.get(), 1000 - BURST as u64);
        // One second later, RATE more.
        let later = start + Duration::from_secs(1);
        let admitted = (0..1000).filter(|_| sampler.admit_at(later)).count();
        assert_eq!(admitted, RATE as usize);
    }
}
