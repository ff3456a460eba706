//! The new process's side of `--handover-socket`: ask the running proxy for its listening sockets
//! before binding anything.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use tokio::net::UnixStream;
use tracing::{debug, info};

use super::wire::{self, ASK, Answer, END_DRAIN, SERVING};
use super::{ANSWER_TIMEOUT, is_our_user};

/// Why the sockets could not be fetched although a process answers on the path. The new process
/// then binds its addresses itself (retrying while they are in use).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Connecting failed for another reason than nobody listening.
    #[error("--handover-socket {}: cannot connect: {source}", path.display())]
    Connect {
        /// The path.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The process answering runs as another user: it is not a proxy this one may take sockets
    /// from (and could be one pretending).
    #[error(
        "--handover-socket {}: answered by a process of user {uid}, not this proxy's user {ours}: \
         took nothing from it; check who can write to the directory",
        path.display()
    )]
    Stranger {
        /// The path.
        path: PathBuf,
        /// The peer's user.
        uid: u32,
        /// This process's.
        ours: u32,
    },
    /// The exchange failed or timed out.
    #[error("--handover-socket {}: the handover failed: {source}", path.display())]
    Exchange {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
}

/// Sockets received from the running proxy, and the line back to it.
#[derive(Debug)]
pub struct Fetched {
    sockets: Vec<(String, OwnedFd)>,
    donor: UnixStream,
    /// The running proxy's pid, as this process sees it (0 from another pid namespace).
    pub pid: i32,
}

impl Fetched {
    /// The sockets, named as in `LISTEN_FDNAMES`.
    pub fn take_sockets(&mut self) -> Vec<(String, OwnedFd)> {
        std::mem::take(&mut self.sockets)
    }

    /// Tells the running proxy that this process serves and holds the path: the handover is
    /// done. Dropping it without saying so tells it the handover failed. The line stays open,
    /// as the [`Predecessor`].
    pub async fn serving(mut self) -> Predecessor {
        if let Err(e) = wire::write_line(&mut self.donor, SERVING).await {
            debug!(error = %e, "cannot tell the proxy that handed over that this one serves");
        }
        Predecessor {
            line: self.donor,
            pid: self.pid,
        }
    }
}

/// The line to the proxy this process took the sockets from, which may still be draining
/// sessions of its own after its stop.
#[derive(Debug)]
pub struct Predecessor {
    line: UnixStream,
    /// Its pid, as this process sees it (0 from another pid namespace).
    pub pid: i32,
}

impl Predecessor {
    /// Tells it to close whatever it still drains: this process now drains sessions of its own,
    /// and a node keeps at most one draining proxy. A predecessor that is gone, or of a version
    /// that closed the line, hears nothing, which is fine.
    pub async fn end_its_drain(mut self) {
        match wire::write_line(&mut self.line, END_DRAIN).await {
            Ok(()) => info!(
                pid = self.pid,
                "told the proxy this one took over from to close the sessions it still drains"
            ),
            Err(e) => {
                debug!(pid = self.pid, error = %e, "the proxy this one took over from is gone")
            }
        }
    }
}

/// Asks the proxy answering at `path` for its listening sockets: `None` when nobody answers
/// there (no file, or a socket nobody listens on) or the proxy there is stopping.
pub async fn fetch(path: &Path) -> Result<Option<Fetched>, FetchError> {
    let exchange = |source| FetchError::Exchange {
        path: path.to_owned(),
        source,
    };
    let connected = tokio::time::timeout(ANSWER_TIMEOUT, UnixStream::connect(path)).await;
    let mut donor = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Ok(Err(source)) => {
            return Err(FetchError::Connect {
                path: path.to_owned(),
                source,
            });
        }
        Err(elapsed) => return Err(exchange(elapsed.into())),
    };
    let peer = donor.peer_cred().map_err(exchange)?;
    if !is_our_user(peer.uid()) {
        return Err(FetchError::Stranger {
            path: path.to_owned(),
            uid: peer.uid(),
            ours: rustix::process::geteuid().as_raw(),
        });
    }
    let asked = async {
        wire::write_line(&mut donor, ASK).await?;
        wire::receive_sockets(&mut donor).await
    };
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, asked)
        .await
        .map_err(|elapsed| exchange(elapsed.into()))?
        .map_err(exchange)?;
    match answer {
        Answer::Draining => Ok(None),
        Answer::Sockets(sockets) => Ok(Some(Fetched {
            sockets,
            donor,
            pid: peer.pid().unwrap_or_default(),
        })),
    }
}
