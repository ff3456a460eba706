//! When a cached answer stops being used and when it is asked again: pure functions of durations
//! and a random draw, so the fleet simulation (`examples/fleet_sim.rs`) runs exactly the rules the
//! caches follow, on a virtual clock. `docs/FLEET.md` has the figures they were chosen from.

use std::time::Duration;

/// The shortest first lifetime of a key's entry, as a fraction of its TTL. A first lifetime drawn
/// from `[FIRST_LIFETIME_FLOOR × TTL, TTL]` spreads the refreshes of keys filled at one moment
/// (every node restarted, a token rotated) over three quarters of a TTL, so the waves they would
/// make forever are at most 1/(1 − floor) = 1.33× the mean; it costs (1 − floor)/2 = 0.375 of a
/// review per new key and nothing afterwards. The floor keeps a new entry useful for a quarter of
/// its TTL: a key asked a few times in a row is not asked again at once.
pub const FIRST_LIFETIME_FLOOR: f64 = 0.25;

/// Refresh ahead starts in the last 1/`REFRESH_AHEAD_DIVISOR` of an entry's lifetime: a key used
/// then is revalidated in the background, so a key in steady use never makes a request wait.
/// Each refresh shortens that key's cycle by at most this part of its lifetime (+11 % reviews for
/// a key used more often than that part lasts, nothing for one used less often).
pub const REFRESH_AHEAD_DIVISOR: u32 = 10;

/// How an entry is being filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// The key had no entry within the last TTL: a new scraper token, a restarted proxy.
    New,
    /// The key's entry expired within the last TTL, or is being refreshed ahead.
    Renewal,
}

/// The lifetime of an entry whose answer the cache keeps for `ttl`. A renewal lives the whole
/// `ttl`; a new key lives a random part of it, from [`FIRST_LIFETIME_FLOOR`] of it up to all of
/// it, so keys filled together expire apart. Never longer than `ttl`. `draw` is uniform in
/// `[0, 1)` (clamped otherwise).
pub fn lifetime(ttl: Duration, fill: Fill, draw: f64) -> Duration {
    match fill {
        Fill::Renewal => ttl,
        Fill::New => {
            let draw = if draw.is_nan() {
                0.0
            } else {
                draw.clamp(0.0, 1.0)
            };
            let part = 1.0 - draw;
            ttl.mul_f64(FIRST_LIFETIME_FLOOR + (1.0 - FIRST_LIFETIME_FLOOR) * part)
                .min(ttl)
        }
    }
}

/// Whether a use of an entry `age` into its `lifetime` should revalidate it in the background:
/// in the last 1/[`REFRESH_AHEAD_DIVISOR`] of a lifetime, never after it ended.
pub fn refresh_ahead_due(lifetime: Duration, age: Duration) -> bool {
    age < lifetime && age >= lifetime - lifetime / REFRESH_AHEAD_DIVISOR
}

/// How long a key is remembered after its entry expires, so that refilling it counts as a
/// [`Fill::Renewal`]: one TTL, longer than the gap between uses of any key used at least once
/// per TTL.
pub fn remembered_for(lifetime: Duration, ttl: Duration) -> Duration {
    lifetime.saturating_add(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(120);

    #[test]
    fn a_renewal_lives_the_ttl_and_a_new_key_a_random_part_never_longer() {
        assert_eq!(lifetime(TTL, Fill::Renewal, 0.7), TTL);
        assert_eq!(lifetime(TTL, Fill::New, 0.0), TTL);
        assert_eq!(lifetime(TTL, Fill::New, 0.5), Duration::from_secs(75));
        let shortest = lifetime(TTL, Fill::New, 1.0 - f64::EPSILON);
        assert!(shortest >= Duration::from_secs(30) && shortest < Duration::from_millis(30_001));
        for draw in [-1.0, 2.0, f64::NAN] {
            assert!(lifetime(TTL, Fill::New, draw) <= TTL, "{draw}");
        }
        assert_eq!(lifetime(Duration::ZERO, Fill::New, 0.3), Duration::ZERO);
    }

    #[test]
    fn refresh_ahead_is_due_in_the_last_tenth_only() {
        let due = |age| refresh_ahead_due(TTL, Duration::from_secs(age));
        assert!(!due(0));
        assert!(!due(107));
        assert!(due(108));
        assert!(due(119));
        assert!(!due(120), "an expired entry is refilled, not refreshed");
        assert!(!refresh_ahead_due(Duration::ZERO, Duration::ZERO));
    }
}
