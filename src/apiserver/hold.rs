//! The API server's back-pressure, obeyed by the whole client. A 429 or 5xx answer with
//! `Retry-After` (the header or `details.retryAfterSeconds`) means: no review of either kind to
//! this API server before that time, whatever its key. API Priority and Fairness throttles a flow
//! (this proxy's identity), not a key, so a per-call backoff, as the kubelet's, would still send
//! one call per key and client while the API server asks for less.
//!
//! While a hold is in force, calls wait for its end, each within its own budget (the review
//! timeout); one whose budget ends first fails closed at once, without calling. When the hold
//! ends, one call goes first (the probe) while the others keep waiting for its answer: another
//! `Retry-After` renews the hold, anything else lifts it. So under a 429 period of P seconds with
//! `Retry-After: R`, at most P/R + 1 calls go out, whatever the number of keys and callers, and
//! service is back within one R of the 429s stopping.
//!
//! Outside a hold the check is one atomic load per review call; cache hits never reach it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The longest hold one answer can impose. API Priority and Fairness asks for seconds; a larger
/// value (a misconfigured front, a clock-like date) would otherwise fail every review of the node
/// for as long. 30 s is the longest webhook `timeout` kube-apiserver accepts.
pub const MAX_HOLD: Duration = Duration::from_secs(30);

/// The hold-off shared by every review call of one API server client.
#[derive(Debug, Default)]
pub struct HoldOff {
    /// Whether a hold may be in force: the fast path reads only this.
    held: AtomicBool,
    state: Mutex<State>,
    /// Woken when a hold is renewed or lifted, so waiters look again.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// No call before this instant; `None` when no hold is in force.
    until: Option<Instant>,
    /// A call is out after the hold ended, and the others wait for its answer.
    probing: bool,
}

/// A call may go out. Tell [`Pass::answered`] what came back; dropped without an answer (the
/// call was cancelled), a probe lets the next waiter probe.
#[must_use = "the answer must be reported to the hold-off"]
pub struct Pass<'a> {
    hold: &'a HoldOff,
    /// This call is the one sent after a hold ended.
    probe: bool,
    answered: bool,
}

/// The call was not made: the hold outlasts its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// How much longer the hold is in force.
    pub remaining: Duration,
}

impl HoldOff {
    /// Waits, at most `budget`, until a call may go out.
    pub async fn admit(&self, budget: Duration) -> Result<Pass<'_>, Held> {
        let deadline = Instant::now() + budget;
        loop {
            if !self.held.load(Ordering::Acquire) {
                return Ok(self.pass(false));
            }
            // Registered before the state is read, so a change made after the read wakes it.
            let changed = self.changed.notified();
            let wake = {
                let mut state = self.lock();
                let now = Instant::now();
                match state.until {
                    None => return Ok(self.pass(false)),
                    Some(until) if now >= until && !state.probing => {
                        state.probing = true;
                        return Ok(self.pass(true));
                    }
                    Some(until) if until > deadline => {
                        return Err(Held {
                            remaining: until - now,
                        });
                    }
                    // Held: wake at its end. Ended, with a probe out: wait for its answer.
                    Some(until) if now < until => until,
                    Some(_) => deadline,
                }
            };
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wake.min(deadline)) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                let state = self.lock();
                return Err(Held {
                    remaining: state.until.map_or(Duration::ZERO, |u| u - now.min(u)),
                });
            }
        }
    }

    /// Records what a call got back; see [`Pass::answered`].
    fn record(&self, probe: bool, retry_after: Option<Duration>) {
        let mut state = self.lock();
        match retry_after {
            Some(delay) => {
                let until = Instant::now() + delay.min(MAX_HOLD);
                state.until = Some(state.until.map_or(until, |u| u.max(until)));
                state.probing = false;
                self.held.store(true, Ordering::Release);
            }
            None if probe => {
                state.until = None;
                state.probing = false;
                self.held.store(false, Ordering::Release);
            }
            None => return,
        }
        drop(state);
        self.changed.notify_waiters();
    }

    fn pass(&self, probe: bool) -> Pass<'_> {
        Pass {
            hold: self,
            probe,
            answered: false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two plain fields, consistent after every assignment: a panic elsewhere
        // while it was held leaves nothing half-done.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Pass<'_> {
    /// What the call got back: `Some(delay)` for a 429 or 5xx with `Retry-After` (the hold is set
    /// or extended to `delay`, at most [`MAX_HOLD`], from now), `None` for anything else (a
    /// probe's answer lifts the hold).
    pub fn answered(mut self, retry_after: Option<Duration>) {
        self.answered = true;
        self.hold.record(self.probe, retry_after);
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.probe && !self.answered {
            self.hold.lock().probing = false;
            self.hold.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;
