//! The deadlines of one client connection after its TLS handshake, for HTTP/1.1 and HTTP/2 alike:
//! the first request must arrive within the header read timeout (so a client that completes TLS
//! and then sends nothing, part of the HTTP/2 preface, or only SETTINGS is dropped), and a
//! connection with no request in flight is closed after the idle timeout. hyper's own HTTP/1.1
//! header timer starts only once the protocol is detected and HTTP/2 has no idle timeout, so the
//! proxy keeps its own account of what each connection has in flight.
//!
//! Closing is graceful first (HTTP/2 `GOAWAY`, HTTP/1.1 no keep-alive), so a request that arrives
//! at that moment is still answered; a peer that does not take the hint is dropped once nothing
//! of it is in flight.
//!
//! When draining begins (a stop, or a handover to a new process), a connection with nothing in
//! flight is not closed at once: closing an idle HTTP/1.1 connection races with a request the
//! client may be sending on it, which then fails. It gets a last call instead: its next request
//! within [`LAST_CALL`] is answered and closes it (`Connection: close`, or after `GOAWAY`), so
//! keep-alive clients move to the new process without an error; one still idle after that is
//! closed gracefully.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Notify, OwnedSemaphorePermit};

use crate::base::shutdown::Shutdown;
use tokio::time::Instant;

use prometheus_client::metrics::gauge::Gauge;

/// How long a connection told to close gracefully has before it is dropped, once nothing of it is
/// in flight: enough for the peer to read a `GOAWAY` and close.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long a connection idle when draining begins waits for one more request (see the module
/// documentation): longer than the period of a client polling every few seconds, short enough
/// not to hold a stop back when idle clients never come back.
pub const LAST_CALL: Duration = Duration::from_secs(5);

/// The two deadlines a connection lives by once TLS is done.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// From the end of the handshake to the first request's headers being complete.
    pub first_request: Duration,
    /// From the last request's response being sent (or the connection becoming idle) to the next
    /// request's headers.
    pub idle: Duration,
}

/// The account of one connection's requests in flight, shared by its request handlers.
///
/// Plain atomics, and nobody is woken when it changes: a request's start and end are two
/// counter updates (and a flag read: only a draining connection's last call asks to be woken by
/// the next request's start). The connection's deadline can only move later while it is served (a request
/// starts, or ends later than the last one), so [`drive`] arms its timer at the deadline it last
/// computed and, when that fires, reads the account again and re-arms if the deadline moved.
/// (Waking the connection's task at each change cost two extra polls of the connection and a
/// timer re-registration per request.)
#[derive(Debug, Clone)]
pub struct Activity(Arc<Account>);

#[derive(Debug)]
struct Account {
    /// Requests in flight.
    in_flight: AtomicUsize,
    /// Whether a request has been seen (the first-request deadline applies until then).
    served: AtomicBool,
    /// When the connection last had nothing in flight, in nanoseconds since `origin`.
    idle_since: AtomicU64,
    origin: Instant,
    /// Set by [`drive`] while it waits for a request to begin (the last call of a draining
    /// connection); only then does a request's start wake it, through `began`.
    watched: AtomicBool,
    began: Notify,
}

impl Account {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Activity {
    /// A connection with nothing in flight and no request yet, from now.
    pub fn new() -> Activity {
        Activity(Arc::new(Account {
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            origin: Instant::now(),
            watched: AtomicBool::new(false),
            began: Notify::new(),
        }))
    }

    /// Counts a request as in flight until the returned guard is dropped (with the response body,
    /// see [`crate::base::held_body::Holding`]).
    pub fn begin(&self) -> InFlight {
        // SeqCst with `watch_for_requests`: either this sees the flag, or `drive` sees this
        // request in flight.
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        self.0.served.store(true, Ordering::Release);
        if self.0.watched.load(Ordering::SeqCst) {
            self.0.began.notify_one();
        }
        InFlight(self.clone())
    }

    /// From now on, a request's start wakes [`Activity::request_began`]; returns whether a
    /// request is in flight already.
    fn watch_for_requests(&self) -> bool {
        self.0.watched.store(true, Ordering::SeqCst);
        self.0.in_flight.load(Ordering::SeqCst) > 0
    }

    /// Resolves once a request begins after [`Activity::watch_for_requests`].
    async fn request_began(&self) {
        self.0.began.notified().await;
    }

    /// When the connection must be closed if nothing changes: `None` while a request is in flight.
    fn deadline(&self, deadlines: Deadlines) -> Option<Instant> {
        let account = &self.0;
        (account.in_flight.load(Ordering::Acquire) == 0).then(|| {
            let allowed = if account.served.load(Ordering::Acquire) {
                deadlines.idle
            } else {
                deadlines.first_request
            };
            let idle_since = Duration::from_nanos(account.idle_since.load(Ordering::Acquire));
            account.origin + idle_since + allowed
        })
    }

    fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::Acquire)
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// One request in flight; dropping it ends the request for the connection's account.
#[derive(Debug)]
pub struct InFlight(Activity);

impl Drop for InFlight {
    fn drop(&mut self) {
        let account = &self.0.0;
        // Set before the count drops, so that whoever sees nothing in flight sees this request's
        // end as the start of idleness. Should another request begin meanwhile, the value is
        // unused until that one ends and sets it again.
        account.idle_since.store(account.now(), Ordering::Release);
        account.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client connection's place under `--max-connections`, held for the connection's whole life,
/// upgraded sessions included: the connection gauge counts it until it is dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
    /// The open-connections gauge.
    open: Gauge,
}

impl ConnectionSlot {
    /// Takes the slot and counts the connection as open in `open`.
    pub fn new(permit: OwnedSemaphorePermit, open: Gauge) -> ConnectionSlot {
        open.inc();
        ConnectionSlot {
            _permit: permit,
            open,
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// Why [`drive`] stopped serving a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended<T> {
    /// hyper finished the connection (the peer closed, an error, an upgrade, or a graceful close
    /// completed).
    Finished(T),
    /// The connection missed a deadline and was closed (gracefully, or dropped after
    /// one second).
    TimedOut,
    /// The shutdown grace period is over and the connection was dropped.
    ForceClosed,
}

/// Serves `conn` under `deadlines`: a missed deadline starts a graceful close (`close_gracefully`:
/// stop taking requests, let in-flight ones finish), and a connection still open a second
/// later with nothing in flight is dropped. Draining closes it gracefully too, at once when a
/// request is in flight, otherwise after its next request begins or [`LAST_CALL`] is over;
/// closing (the grace period is over) drops it at once.
pub async fn drive<C: Future>(
    conn: C,
    close_gracefully: impl Fn(Pin<&mut C>),
    activity: &Activity,
    deadlines: Deadlines,
    shutdown: &Shutdown,
) -> Ended<C::Output> {
    tokio::pin!(conn);
    let mut closing = false;
    // Set once the connection has been told to close because it missed a deadline.
    let mut drop_at: Option<Instant> = None;
    // Set when draining found the connection idle: until then, its next request is served.
    let mut last_call: Option<Instant> = None;
    let timer = tokio::time::sleep_until(next_check(activity, deadlines, Instant::now()));
    tokio::pin!(timer);
    loop {
        tokio::select! {
            output = conn.as_mut() => {
                return if drop_at.is_some() {
                    Ended::TimedOut
                } else {
                    Ended::Finished(output)
                };
            }
            () = shutdown.draining().cancelled(), if !closing && last_call.is_none() => {
                if activity.watch_for_requests() {
                    closing = true;
                    close_gracefully(conn.as_mut());
                } else {
                    let at = Instant::now() + LAST_CALL;
                    last_call = Some(at);
                    if at < timer.deadline() {
                        timer.as_mut().reset(at);
                    }
                }
            }
            () = activity.request_began(), if last_call.is_some() && !closing => {
                closing = true;
                close_gracefully(conn.as_mut());
            }
            () = shutdown.closing().cancelled() => return Ended::ForceClosed,
            () = timer.as_mut() => {
                let now = Instant::now();
                if let Some(at) = drop_at {
                    if activity.in_flight() == 0 {
                        return Ended::TimedOut;
                    }
                    // Dropped once nothing of it is in flight: looked at again a grace later.
                    timer.as_mut().reset(at.max(now) + CLOSE_GRACE);
                    continue;
                }
                match activity.deadline(deadlines) {
                    Some(deadline) if deadline <= now => {
                        if !closing {
                            closing = true;
                            close_gracefully(conn.as_mut());
                        }
                        let at = now + CLOSE_GRACE;
                        drop_at = Some(at);
                        timer.as_mut().reset(at);
                    }
                    _ => {
                        // The last call being over is no missed deadline: the graceful close
                        // suffices.
                        let last_call = last_call.filter(|_| !closing);
                        if last_call.is_some_and(|at| at <= now) {
                            closing = true;
                            close_gracefully(conn.as_mut());
                        }
                        let next = next_check(activity, deadlines, now);
                        let next = match last_call.filter(|_| !closing) {
                            Some(at) => next.min(at),
                            None => next,
                        };
                        timer.as_mut().reset(next);
                    }
                }
            }
        }
    }
}

/// When to look at the connection's account next: its deadline, but no later than one idle
/// timeout from `now`, as no idle period that has not begun yet can end sooner (and so a request
/// that starts and ends before a longer first-request deadline is not given more time).
fn next_check(activity: &Activity, deadlines: Deadlines, now: Instant) -> Instant {
    let soonest_idle_end = now + deadlines.idle;
    activity
        .deadline(deadlines)
        .map_or(soonest_idle_end, |deadline| deadline.min(soonest_idle_end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINES: Deadlines = Deadlines {
        first_request: Duration::from_secs(5),
        idle: Duration::from_secs(60),
    };

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll};

    /// A connection that never finishes on its own; `closed` records being told to close.
    struct Stalled {
        closed: Arc<AtomicBool>,
    }

    impl Future for Stalled {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    fn stalled() -> (Stalled, Arc<AtomicBool>) {
        let closed = Arc::new(AtomicBool::new(false));
        (
            Stalled {
                closed: Arc::clone(&closed),
            },
            closed,
        )
    }

    fn close(conn: Pin<&mut Stalled>) {
        conn.closed.store(true, Ordering::SeqCst);
    }

    /// Drives `conn` in a task of its own, on clones of `activity` and `shutdown`.
    fn spawn_drive(
        conn: Stalled,
        activity: &Activity,
        deadlines: Deadlines,
        shutdown: &Shutdown,
    ) -> tokio::task::JoinHandle<Ended<()>> {
        let (activity, shutdown) = (activity.clone(), shutdown.clone());
        tokio::spawn(async move { drive(conn, close, &activity, deadlines, &shutdown).await })
    }

    #[tokio::test(start_paused = true)]
    async fn no_first_request_is_dropped_after_the_first_request_deadline_and_grace() {
        let activity = Activity::new();
        let started = Instant::now();
        let (conn, closed) = stalled();
        let ended = drive(conn, close, &activity, DEADLINES, &Shutdown::new()).await;
        assert_eq!(ended, Ended::TimedOut);
        assert!(
            closed.load(Ordering::SeqCst),
            "told to close before it was dropped"
        );
        assert_eq!(started.elapsed(), DEADLINES.first_request + CLOSE_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_is_never_cut_and_idleness_counts_from_its_end() {
        let activity = Activity::new();
        let request = activity.begin();
        let ends = spawn_drive(stalled().0, &activity, DEADLINES, &Shutdown::new());
        // Far past both deadlines, the request is still in flight: the connection stays.
        tokio::time::sleep(DEADLINES.idle * 10).await;
        assert!(!ends.is_finished());
        let finished = Instant::now();
        drop(request);
        assert_eq!(ends.await.unwrap(), Ended::TimedOut);
        assert_eq!(finished.elapsed(), DEADLINES.idle + CLOSE_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_timeout_shorter_than_the_first_request_deadline_counts_from_the_request_end() {
        let deadlines = Deadlines {
            first_request: Duration::from_secs(30),
            idle: Duration::from_secs(2),
        };
        let activity = Activity::new();
        let ends = spawn_drive(stalled().0, &activity, deadlines, &Shutdown::new());
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(activity.begin());
        let finished = Instant::now();
        assert_eq!(ends.await.unwrap(), Ended::TimedOut);
        assert_eq!(finished.elapsed(), deadlines.idle + CLOSE_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_one_after_another_keep_the_connection_open() {
        let activity = Activity::new();
        let ends = spawn_drive(stalled().0, &activity, DEADLINES, &Shutdown::new());
        // A request every half idle timeout, for ten idle timeouts: never idle long enough.
        for _ in 0..20 {
            let request = activity.begin();
            tokio::time::sleep(DEADLINES.idle / 4).await;
            drop(request);
            tokio::time::sleep(DEADLINES.idle / 4).await;
            assert!(!ends.is_finished());
        }
        let finished = Instant::now() - DEADLINES.idle / 4;
        assert_eq!(ends.await.unwrap(), Ended::TimedOut);
        assert_eq!(finished.elapsed(), DEADLINES.idle + CLOSE_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn draining_keeps_an_idle_connection_for_its_next_request_then_closes_it() {
        let activity = Activity::new();
        let shutdown = Shutdown::new();
        let (conn, closed) = stalled();
        let ends = spawn_drive(conn, &activity, DEADLINES, &shutdown);
        shutdown.begin();
        tokio::time::sleep(LAST_CALL / 2).await;
        assert!(!closed.load(Ordering::SeqCst), "idle: kept for a last call");
        let request = activity.begin();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            closed.load(Ordering::SeqCst),
            "its request is answered with the close"
        );
        drop(request);
        shutdown.closing().cancel();
        assert_eq!(ends.await.unwrap(), Ended::ForceClosed);
    }

    #[tokio::test(start_paused = true)]
    async fn draining_closes_a_connection_still_idle_after_the_last_call() {
        let activity = Activity::new();
        let shutdown = Shutdown::new();
        let (conn, closed) = stalled();
        let patient = Deadlines {
            first_request: LAST_CALL * 4,
            idle: LAST_CALL * 4,
        };
        let ends = spawn_drive(conn, &activity, patient, &shutdown);
        let started = Instant::now();
        shutdown.begin();
        while !closed.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The paused clock makes these exact: closed by the last call, not by a deadline.
        assert!(started.elapsed() >= LAST_CALL);
        assert!(started.elapsed() < LAST_CALL + Duration::from_millis(20));
        shutdown.closing().cancel();
        assert_eq!(ends.await.unwrap(), Ended::ForceClosed);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_closes_gracefully_and_force_close_drops() {
        let activity = Activity::new();
        let _request = activity.begin();
        let shutdown = Shutdown::new();
        let (conn, closed) = stalled();
        let ends = spawn_drive(conn, &activity, DEADLINES, &shutdown);
        shutdown.begin();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(closed.load(Ordering::SeqCst));
        assert!(
            !ends.is_finished(),
            "a graceful close waits for the request"
        );
        shutdown.closing().cancel();
        assert_eq!(ends.await.unwrap(), Ended::ForceClosed);
    }
}
