//! HTTP/1.1 upgrades (exec, attach, portForward over WebSocket or SPDY): once the kubelet has
//! answered `101` and the caller has received it, the two connections are spliced byte for byte
//! in a task of their own until either side closes.

use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// How long to wait for both connections to finish switching protocols. The kubelet's side is
/// ready as soon as its `101` is read; the caller's side as soon as our `101` is written, so this
/// only fires when a peer stalls mid-handshake.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Spawns the task that splices the caller's and the kubelet's upgraded connections.
///
/// The task owns both connections and ends when the copy ends (both directions closed, or an
/// I/O error on either side), or when the switch does not complete in time; dropping the
/// connections closes them.
pub(crate) fn splice(caller: OnUpgrade, kubelet: OnUpgrade) -> StreamEnded {
    let (ended, on_end) = tokio::sync::watch::channel(());
    let task = tokio::spawn(async move {
        // Dropped when the task ends, however it ends, which resolves the receiver.
        let _ended = ended;
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
        let mut caller = TokioIo::new(caller);
        let mut kubelet = TokioIo::new(kubelet);
        match tokio::io::copy_bidirectional(&mut caller, &mut kubelet).await {
            Ok((to_kubelet, to_caller)) => {
                tracing::debug!(to_kubelet, to_caller, "upgraded connection closed");
            }
            Err(err) => tracing::debug!(error = %err, "upgraded connection ended with an error"),
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
