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

use std::ops::{Add, Sub};
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
    state: Mutex<HoldState<Instant>>,
    /// Woken when a hold is renewed or lifted, so waiters look again.
    changed: Notify,
}

/// The hold-off's decisions on a clock of type `T`, without waiting or locking: [`HoldOff`] runs
/// them on tokio's clock, the fleet simulation (`examples/fleet_sim.rs`) on a virtual one, so the
/// simulated gate is this one.
#[derive(Debug, Clone, Copy)]
pub struct HoldState<T> {
    /// No call before this instant; `None` when no hold is in force.
    until: Option<T>,
    /// A call is out after the hold ended, and the others wait for its answer.
    probing: bool,
}

impl<T> Default for HoldState<T> {
    fn default() -> Self {
        HoldState {
            until: None,
            probing: false,
        }
    }
}

/// What a call that wants to go out at some instant must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission<T> {
    /// Go; `probe` if it is the one call sent after a hold ended, whose answer the others await.
    Pass {
        /// See [`Admission::Pass`].
        probe: bool,
    },
    /// Ask again at this instant, or sooner if the hold changes.
    Wait(T),
    /// The hold outlasts the call's deadline: fail without calling.
    Held(Held),
}

impl<T> HoldState<T>
where
    T: Copy + Ord + Add<Duration, Output = T> + Sub<Output = Duration>,
{
    /// The decision for a call at `now` that may wait until `deadline`. A `Pass { probe: true }`
    /// must be followed by [`record`](Self::record) or [`cancel_probe`](Self::cancel_probe).
    pub fn admit(&mut self, now: T, deadline: T) -> Admission<T> {
        match self.until {
            None => Admission::Pass { probe: false },
            Some(until) if now >= until && !self.probing => {
                self.probing = true;
                Admission::Pass { probe: true }
            }
            Some(until) if until > deadline => Admission::Held(Held {
                remaining: until - now.min(until),
            }),
            // Held: wake at its end. Ended, with a probe out: wait for its answer.
            Some(until) if now < until => Admission::Wait(until),
            Some(_) => Admission::Wait(deadline),
        }
    }

    /// Records at `now` what a call got back: `Some(delay)` for a 429 or 5xx with `Retry-After`
    /// (the hold is set or extended to `delay`, at most [`MAX_HOLD`], from now), `None` for
    /// anything else (a probe's answer lifts the hold). Returns whether the hold changed.
    pub fn record(&mut self, now: T, probe: bool, retry_after: Option<Duration>) -> bool {
        match retry_after {
            Some(delay) => {
                let until = now + delay.min(MAX_HOLD);
                self.until = Some(self.until.map_or(until, |u| u.max(until)));
                self.probing = false;
                true
            }
            None if probe => {
                self.until = None;
                self.probing = false;
                true
            }
            None => false,
        }
    }

    /// A probe went without an answer (cancelled): the next waiter may probe.
    pub fn cancel_probe(&mut self) {
        self.probing = false;
    }

    /// The end of the hold in force, if any (it may have passed without a probe yet).
    pub fn until(&self) -> Option<T> {
        self.until
    }

    /// How much of the hold is left at `now`; zero when there is none.
    pub fn remaining(&self, now: T) -> Duration {
        self.until.map_or(Duration::ZERO, |u| u - now.min(u))
    }
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
            let wake = match self.lock().admit(Instant::now(), deadline) {
                Admission::Pass { probe } => return Ok(self.pass(probe)),
                Admission::Held(held) => return Err(held),
                Admission::Wait(wake) => wake,
            };
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wake.min(deadline)) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Held {
                    remaining: self.lock().remaining(now),
                });
            }
        }
    }

    /// The end of the hold in force, if any.
    pub fn until(&self) -> Option<Instant> {
        if !self.held.load(Ordering::Acquire) {
            return None;
        }
        self.lock().until()
    }

    /// Records what a call got back; see [`Pass::answered`].
    fn record(&self, probe: bool, retry_after: Option<Duration>) {
        let mut state = self.lock();
        if !state.record(Instant::now(), probe, retry_after) {
            return;
        }
        self.held.store(state.until().is_some(), Ordering::Release);
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HoldState<Instant>> {
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
            self.hold.lock().cancel_probe();
            self.hold.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;
