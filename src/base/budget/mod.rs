//! Token buckets, and a bounded table of them keyed by what a client chooses (a user name, a
//! source address). Two budgets meter clients this way: the audit log's flood budget
//! ([`crate::audit::budget`], bytes per identity) and the failed-authentication budget of token
//! reviews ([`crate::authn::failure_budget`], reviews per source address).

pub mod table;

use std::time::Instant;

/// A bucket's size and refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// What is spent at once after a quiet spell.
    pub burst: f64,
    /// What comes back a second.
    pub rate: f64,
}

impl Limits {
    /// `share` of these limits: the same fraction of burst and rate.
    pub fn share(self, share: f64) -> Limits {
        Limits {
            burst: self.burst * share,
            rate: self.rate * share,
        }
    }
}

/// A token bucket, refilled lazily when looked at.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    /// What is left to spend.
    pub tokens: f64,
    refilled: Instant,
}

impl Bucket {
    /// A bucket holding its whole burst at `now`.
    pub fn full(limits: Limits, now: Instant) -> Bucket {
        Bucket {
            tokens: limits.burst,
            refilled: now,
        }
    }

    /// Adds what `limits.rate` brought since the last refill, up to the burst.
    pub fn refill(&mut self, limits: Limits, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limits.rate).min(limits.burst);
        self.refilled = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let limits = Limits {
            burst: 3.0,
            rate: 0.5,
        };
        let start = Instant::now();
        let mut bucket = Bucket::full(limits, start);
        bucket.tokens = 0.0;
        bucket.refill(limits, start + Duration::from_secs(2));
        assert_eq!(bucket.tokens, 1.0);
        bucket.refill(limits, start + Duration::from_secs(3600));
        assert_eq!(bucket.tokens, 3.0, "never above the burst");
        assert_eq!(limits.share(0.5).burst, 1.5);
    }
}
