//! HTTP/1.1 upgrades (exec, attach, portForward over WebSocket or SPDY): once the kubelet has
//! answered `101` and the caller has received it, the two connections are spliced byte for byte
//! in a task of their own until either side closes, or until no data has passed either way for
//! the streaming idle timeout (the kubelet's `streamingConnectionIdleTimeout`), or the shutdown
//! grace period is over. One task owns each session from start to end.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use tokio::sync::oneshot;

use super::limits::Lease;
use crate::base::shutdown::Shutdown;

mod pump;

/// How long to wait for both connections to finish switching protocols. The kubelet's side is
/// ready as soon as its `101` is read; the caller's side as soon as our `101` is written, so this
/// only fires when a peer stalls mid-handshake.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(30);

/// What runs when a session ends: given by its owner through [`UpgradedStream::own`].
type OnEnd = Box<dyn FnOnce() + Send>;

/// Spawns the task that splices the caller's and the kubelet's upgraded connections, as one of
/// the tasks `shutdown` drains.
///
/// The task owns the whole life of the session: both connections, the session's `lease`, and
/// whatever its owner attaches with [`UpgradedStream::own`] (the server's count, connection
/// place and audit completion). It ends when the copy ends (both directions closed, or an I/O
/// error on either side), when the switch does not complete in time, when no byte has been read
/// from either side for `idle_timeout`, or when the shutdown grace period is over; dropping the
/// connections closes them, and the owner's hook runs last.
pub(crate) fn splice(
    caller: OnUpgrade,
    kubelet: OnUpgrade,
    idle_timeout: Duration,
    lease: Lease,
    shutdown: &Shutdown,
) -> UpgradedStream {
    let (owner, mut attached) = oneshot::channel::<OnEnd>();
    let closing = shutdown.closing().clone();
    shutdown.spawn(async move {
        tokio::select! {
            () = session(caller, kubelet, idle_timeout) => {}
            () = closing.cancelled() => {
                tracing::debug!("upgraded connection closed: the shutdown grace period is over");
            }
        }
        drop(lease);
        // Closed first, so an owner attaching from now on runs its hook itself.
        attached.close();
        if let Ok(on_end) = attached.try_recv() {
            on_end();
        }
    });
    UpgradedStream {
        owner: Arc::new(Mutex::new(Some(owner))),
    }
}

/// Switches both connections, then copies between them until either closes or the session idles.
async fn session(caller: OnUpgrade, kubelet: OnUpgrade, idle_timeout: Duration) {
    let both = async { tokio::try_join!(caller, kubelet) };
    let (caller, kubelet) = match tokio::time::timeout(SWITCH_TIMEOUT, both).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "upgrade did not complete");
            return;
        }
        Err(_elapsed) => {
            tracing::debug!("upgrade did not complete in time");
            return;
        }
    };
    let activity = LastRead::new();
    let mut caller = Watched::new(TokioIo::new(caller), &activity);
    let mut kubelet = Watched::new(TokioIo::new(kubelet), &activity);
    tokio::select! {
        copied = pump::both_ways(&mut caller, &mut kubelet) => match copied {
            Ok((to_kubelet, to_caller)) => {
                tracing::debug!(to_kubelet, to_caller, "upgraded connection closed");
            }
            Err(err) => {
                tracing::debug!(error = %err, "upgraded connection ended with an error");
            }
        },
        () = activity.idle_for(idle_timeout) => {
            tracing::debug!(?idle_timeout, "upgraded connection closed: idle");
        }
    }
}

/// A spliced upgrade (exec, attach, portForward session) in progress. The forwarder puts it in
/// the extensions of the `101` response (which needs `Clone`); the server attaches what must
/// happen when the session ends.
#[derive(Clone)]
pub struct UpgradedStream {
    owner: Arc<Mutex<Option<oneshot::Sender<OnEnd>>>>,
}

impl UpgradedStream {
    /// Runs `on_end` when the session ends, or at once if it already has. A session has one
    /// owner: a second call (through a clone) also runs its `on_end` at once. Whatever `on_end`
    /// captures lives as long as the session.
    pub fn own(&self, on_end: impl FnOnce() + Send + 'static) {
        let owner = self.owner.lock().ok().and_then(|mut owner| owner.take());
        let on_end: OnEnd = Box::new(on_end);
        match owner {
            Some(owner) => {
                if let Err(on_end) = owner.send(on_end) {
                    on_end();
                }
            }
            None => on_end(),
        }
    }
}

impl std::fmt::Debug for UpgradedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpgradedStream")
    }
}

/// When data was last read from either side of a session, in milliseconds since it started.
#[derive(Debug, Clone)]
struct LastRead {
    start: Instant,
    millis: Arc<AtomicU64>,
}

impl LastRead {
    fn new() -> LastRead {
        LastRead {
            start: Instant::now(),
            millis: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.millis.store(now, Ordering::Relaxed);
    }

    /// Resolves once nothing has been read for `timeout`; checks again at each would-be expiry.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.millis.load(Ordering::Relaxed));
            let expiry = last + timeout;
            if Instant::now() >= expiry {
                return;
            }
            tokio::time::sleep_until(expiry).await;
        }
    }
}

/// One side of a session, recording in [`LastRead`] every read that brings data.
struct Watched<T> {
    io: T,
    activity: LastRead,
}

impl<T> Watched<T> {
    fn new(io: T, activity: &LastRead) -> Watched<T> {
        Watched {
            io,
            activity: activity.clone(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
