//! Keep-alive connections to the kubelet, driven by the request that uses them.
//!
//! A pooled client usually runs each connection in a task of its own and talks to it through
//! channels: every request then wakes two extra tasks and spawns a third to return the
//! connection. Here a request takes an idle connection out of the pool and polls it itself, while
//! it waits for the answer and while the caller reads the body ([`UpstreamBody`]); when the body
//! has been read to its end the connection goes back to the pool. Idle connections are polled by
//! nobody, so a sweep every few seconds closes those the kubelet has closed or that idled too long.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;

use super::ForwardError;
use super::connector::{UpstreamConnector, UpstreamStream};

type Connection = http1::Connection<TokioIo<UpstreamStream>, Incoming>;

/// How often idle connections are checked for having been closed or having idled too long.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// One HTTP/1.1 connection to the kubelet: the handle requests are sent on, and the connection
/// state machine that must be polled for anything to move.
struct Leased {
    sender: http1::SendRequest<Incoming>,
    connection: Connection,
    /// Whether this connection served a request before: a request it fails to send may then be
    /// retried on a fresh connection (the kubelet may have closed it just as we took it).
    reused: bool,
}

impl Leased {
    /// Polls the connection once without waiting: `false` when it has ended (closed by the
    /// kubelet, or failed) or cannot take a request now. `waker` is woken when the connection
    /// next has something to do (for an idle one: the kubelet closed it).
    fn usable(&mut self, waker: &Waker) -> bool {
        let mut cx = Context::from_waker(waker);
        if Pin::new(&mut self.connection).poll(&mut cx).is_ready() {
            return false;
        }
        !self.sender.is_closed() && self.sender.is_ready()
    }
}

struct Idle {
    leased: Leased,
    since: Instant,
}

struct Shared {
    idle: Mutex<Vec<Idle>>,
    /// Set once the sweeper runs: it starts with the first idle connection.
    sweeping: AtomicBool,
    /// Idle connections are polled with this waker, so that the sweeper runs as soon as one of
    /// them is closed by the kubelet rather than at its next round.
    wake_sweeper: Waker,
    sweep_now: Arc<Notify>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Shared {
    /// The most recently returned connection that still works; the others checked on the way are
    /// closed. The lock is held only to pop and push, never while polling or awaiting.
    fn take(&self) -> Option<Leased> {
        loop {
            let idle = self.lock().pop()?;
            let mut leased = idle.leased;
            if idle.since.elapsed() < self.idle_timeout && leased.usable(Waker::noop()) {
                leased.reused = true;
                return Some(leased);
            }
        }
    }

    /// Returns a connection whose last response was read to its end.
    fn put(self: &Arc<Self>, mut leased: Leased) {
        if !leased.usable(&self.wake_sweeper) {
            return;
        }
        if !self.sweeping.load(Ordering::Relaxed)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
            && !self.sweeping.swap(true, Ordering::Relaxed)
        {
            runtime.spawn(sweeper(Arc::downgrade(self)));
        }
        let mut idle = self.lock();
        if idle.len() < self.max_idle {
            idle.push(Idle {
                leased,
                since: Instant::now(),
            });
        }
    }

    /// Closes idle connections that ended or idled too long.
    fn sweep(&self) {
        let mut expired = Vec::new();
        {
            let mut idle = self.lock();
            let mut i = 0;
            while i < idle.len() {
                let keep = idle[i].since.elapsed() < self.idle_timeout
                    && idle[i].leased.usable(&self.wake_sweeper);
                if keep {
                    i += 1;
                } else {
                    expired.push(idle.swap_remove(i));
                }
            }
        }
        // Dropped (and so closed) outside the lock.
        drop(expired);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The lock guards plain pushes and pops that cannot panic half-way: a poisoned pool is
        // still consistent.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The connections to one kubelet. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub(crate) struct Pool {
    shared: Arc<Shared>,
    connector: UpstreamConnector,
}

impl Pool {
    /// An empty pool keeping at most `max_idle` idle connections, each for at most
    /// `idle_timeout`. Its sweeper starts with the first idle connection and stops when the last
    /// clone of the pool is dropped.
    pub(crate) fn new(
        connector: UpstreamConnector,
        max_idle: usize,
        idle_timeout: Duration,
    ) -> Pool {
        let sweep_now = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            idle: Mutex::new(Vec::new()),
            sweeping: AtomicBool::new(false),
            wake_sweeper: Waker::from(Arc::new(SweepSignal(Arc::clone(&sweep_now)))),
            sweep_now,
            max_idle,
            idle_timeout,
        });
        Pool { shared, connector }
    }

    async fn connect(&self) -> Result<Leased, ForwardError> {
        let io = self
            .connector
            .connect()
            .await
            .map_err(ForwardError::connect)?;
        let (sender, connection) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(ForwardError::from_hyper)?;
        Ok(Leased {
            sender,
            connection,
            reused: false,
        })
    }

    /// Sends a request that is not an upgrade and returns the answer, whose body keeps the
    /// connection until it has been read.
    pub(crate) async fn send(
        &self,
        mut req: Request<Incoming>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        loop {
            let mut leased = match self.shared.take() {
                Some(leased) => leased,
                None => self.connect().await?,
            };
            let sent = {
                let mut response = pin!(leased.sender.try_send_request(req));
                let connection = &mut leased.connection;
                let mut ended = false;
                poll_fn(|cx| {
                    // Drive the connection (write the request, read the answer), then see
                    // whether the answer's head is there.
                    if !ended && Pin::new(&mut *connection).poll(cx).is_ready() {
                        ended = true;
                    }
                    response.as_mut().poll(cx)
                })
                .await
            };
            match sent {
                Ok(response) => {
                    let finished = response.body().is_end_stream();
                    return Ok(response.map(|body| UpstreamBody {
                        body,
                        leased: Some(leased),
                        finished,
                        pool: Arc::downgrade(&self.shared),
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Never written: a kept-alive connection the kubelet closed just now.
                    Some(unsent) if leased.reused => req = unsent,
                    _ => return Err(ForwardError::from_hyper(e.into_error())),
                },
            }
        }
    }

    /// Sends an upgrade request (exec, attach, portForward) on a connection of its own that runs
    /// in its own task, as the upgraded stream outlives the request; it never returns to the pool.
    pub(crate) async fn send_upgrade(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<Incoming>, ForwardError> {
        let Leased {
            mut sender,
            connection,
            ..
        } = self.connect().await?;
        tokio::spawn(async move {
            // The error, if any, also reaches the response future or the upgraded stream.
            let _ = connection.with_upgrades().await;
        });
        sender
            .send_request(req)
            .await
            .map_err(ForwardError::from_hyper)
    }
}

/// Wakes the sweeper when an idle connection has something to do.
struct SweepSignal(Arc<Notify>);

impl Wake for SweepSignal {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// Sweeps the pool every [`SWEEP_EVERY`] and whenever an idle connection stirs; holds only a weak
/// reference, so it ends with the pool.
async fn sweeper(shared: Weak<Shared>) {
    let Some(sweep_now) = shared.upgrade().map(|shared| Arc::clone(&shared.sweep_now)) else {
        return;
    };
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = sweep_now.notified() => {}
        }
        match shared.upgrade() {
            Some(shared) => shared.sweep(),
            None => return,
        }
    }
}

/// The kubelet's response body. Reading it drives its connection; once it has been read to the
/// end the connection returns to the pool, and if it is dropped earlier the connection closes
/// (what remains unread would otherwise be taken for the next answer).
pub struct UpstreamBody {
    body: Incoming,
    leased: Option<Leased>,
    finished: bool,
    pool: Weak<Shared>,
}

impl UpstreamBody {
    /// A body whose connection is driven elsewhere (an upgrade request's own task).
    pub(crate) fn detached(body: Incoming) -> UpstreamBody {
        UpstreamBody {
            body,
            leased: None,
            finished: false,
            pool: Weak::new(),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(leased) = &mut this.leased
            && Pin::new(&mut leased.connection).poll(cx).is_ready()
        {
            // The connection ended: the body gets its end or error through its channel.
            this.leased = None;
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.finished = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.finished || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let (true, Some(leased), Some(pool)) = (
            self.is_end_stream(),
            self.leased.take(),
            self.pool.upgrade(),
        ) {
            pool.put(leased);
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("finished", &self.is_end_stream())
            .finish_non_exhaustive()
    }
}
