//! HTTP/1.1 upgrades (exec, attach, portForward over WebSocket or SPDY): once the kubelet has
//! answered `101` and the caller has received it, the two connections are spliced byte for byte
//! in a task of their own until either side closes, or until no data has passed either way for
//! the streaming idle timeout (the kubelet's `streamingConnectionIdleTimeout`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::limits::Lease;

/// How long to wait for both connections to finish switching protocols. The kubelet's side is
/// ready as soon as its `101` is read; the caller's side as soon as our `101` is written, so this
/// only fires when a peer stalls mid-handshake.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Spawns the task that splices the caller's and the kubelet's upgraded connections.
///
/// The task owns both connections and ends when the copy ends (both directions closed, or an
/// I/O error on either side), when the switch does not complete in time, or when no byte has
/// been read from either side for `idle_timeout`; dropping the connections closes them. It holds
/// the session's `lease` until then.
pub(crate) fn splice(
    caller: OnUpgrade,
    kubelet: OnUpgrade,
    idle_timeout: Duration,
    lease: Lease,
) -> StreamEnded {
    let (ended, on_end) = tokio::sync::watch::channel(());
    let task = tokio::spawn(async move {
        // Dropped when the task ends, however it ends, which resolves the receiver and gives the
        // session's places back.
        let _ended = ended;
        let _lease = lease;
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
            copied = tokio::io::copy_bidirectional(&mut caller, &mut kubelet) => match copied {
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
    });
    StreamEnded {
        ended: on_end,
        task: task.abort_handle(),
    }
}

/// Resolves when a spliced upgrade (exec, attach, portForward session) has ended. The forwarder
/// puts it in the extensions of the `101` response, so that the server can record the end.
#[derive(Debug, Clone)]
pub struct StreamEnded {
    ended: tokio::sync::watch::Receiver<()>,
    task: tokio::task::AbortHandle,
}

impl StreamEnded {
    /// Waits for the session to end (the splicing task drops its sender when it ends).
    pub async fn wait(mut self) {
        while self.ended.changed().await.is_ok() {}
    }

    /// Ends the session now, closing both connections (shutdown after the grace period).
    pub fn close(&self) {
        self.task.abort();
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
