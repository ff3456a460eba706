//! The running proxy's side of `--handover-socket`: it answers a new proxy of its own user with
//! copies of its listening sockets, one asker at a time, until one takes over or it stops.

use std::path::Path;
use std::sync::Arc;

use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::place::{Place, PlaceError};
use super::wire::{self, ASK, DRAINING, END_DRAIN, SERVING};
use super::{ANSWER_TIMEOUT, is_our_user};
use crate::base::shutdown::Shutdown;
use crate::server::generation::Generation;
use crate::server::handover::{HandoverSockets, READY_TIMEOUT};

/// Why a handover through `--handover-socket` did not complete. The running proxy goes on
/// serving in every case.
#[derive(Debug, thiserror::Error)]
enum DonorError {
    /// The asker said something else than the question.
    #[error("the asker (pid {pid}) said {said:?}, not the handover question")]
    Protocol {
        /// The asker, as this process sees it (0 from another pid namespace).
        pid: i32,
        /// What it said, lossily.
        said: String,
    },
    /// The asker took the sockets but ended, or closed the line, without serving.
    #[error("the new process (pid {pid}) took the sockets but did not serve: {source}")]
    Exited {
        /// The asker.
        pid: i32,
        /// How the line ended.
        #[source]
        source: std::io::Error,
    },
    /// The asker was silent too long.
    #[error("the new process (pid {pid}) was silent for {waited:?}")]
    Timeout {
        /// The asker.
        pid: i32,
        /// How long it was waited for.
        waited: std::time::Duration,
    },
    /// Reading or writing the line failed.
    #[error("{0}")]
    Io(#[source] std::io::Error),
}

impl DonorError {
    /// The `cause` label of the failed handovers metric.
    fn cause(&self) -> &'static str {
        match self {
            DonorError::Protocol { .. } => "protocol",
            DonorError::Exited { .. } => "exited",
            DonorError::Timeout { .. } => "timeout",
            DonorError::Io(_) => "io",
        }
    }
}

/// Answers `--handover-socket` with this process's listening sockets.
pub struct Donor {
    reclaim: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Donor {
    /// Takes the path over and answers there until a new process takes over, or draining begins;
    /// then lets go of `sockets`, its copies of the listening sockets. Once a new process serves,
    /// `shutdown` learns it has a successor, and is ended when the successor says it drains
    /// sessions of its own.
    pub fn serve(
        path: &Path,
        sockets: HandoverSockets,
        generation: Generation,
        shutdown: Shutdown,
    ) -> Result<Donor, PlaceError> {
        let place = Place::take(path)?;
        let reclaim = Arc::new(Notify::new());
        let task = tokio::spawn(run(
            place,
            sockets,
            generation,
            shutdown,
            Arc::clone(&reclaim),
        ));
        Ok(Donor { reclaim, task })
    }

    /// Takes the path back if it is no longer this process's socket: after a new process started
    /// by `SIGUSR2` took it and then failed.
    pub fn reclaim(&self) {
        self.reclaim.notify_one();
    }

    /// Stops answering.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn run(
    mut place: Place,
    sockets: HandoverSockets,
    generation: Generation,
    shutdown: Shutdown,
    reclaim: Arc<Notify>,
) {
    let draining = shutdown.draining();
    loop {
        let asker = tokio::select! {
            () = draining.cancelled() => return,
            () = reclaim.notified() => {
                take_back(&mut place, &generation);
                continue;
            }
            accepted = place.listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    debug!(error = %e, "--handover-socket: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let answered = tokio::select! {
            // Stopping: the copies must go now, so that the listeners close with the accept loops.
            () = draining.cancelled() => return,
            answered = answer(asker, &sockets, draining, &generation) => answered,
        };
        match answered {
            Ok(Some((pid, line))) => {
                generation.handed_over();
                shutdown.succeeded();
                info!(
                    pid,
                    "handed the listening sockets over through --handover-socket; the new \
                     process serves beside this one until this one is stopped"
                );
                drop(sockets);
                hear_successor(line, pid, &shutdown).await;
                return;
            }
            Ok(None) => {}
            Err(e) => {
                generation.handover_failed(e.cause());
                warn!(error = %e, "--handover-socket: a handover failed; going on serving");
                take_back(&mut place, &generation);
            }
        }
    }
}

/// Takes the path back if another process took it and did not keep it; if that fails, says why
/// and counts the handover socket off: the next proxy on this node binds its addresses itself.
fn take_back(place: &mut Place, generation: &Generation) {
    match place.reclaim() {
        Ok(()) => generation.handover_socket_on(),
        Err(e) => {
            generation.handover_socket_off(e.cause());
            warn!(
                error = %e,
                "--handover-socket: cannot take the path back; the next proxy on this node will \
                 bind its addresses itself"
            );
        }
    }
}

/// Listens on the line to the successor (`pid`) until it closes: when the successor says it
/// drains sessions of its own, this process, if stopped, closes what it still drains.
async fn hear_successor(mut line: UnixStream, pid: i32, shutdown: &Shutdown) {
    loop {
        match wire::read_line(&mut line).await {
            Ok(said) if said == END_DRAIN.strip_suffix(b"\n").unwrap_or(END_DRAIN) => {
                if shutdown.draining().is_cancelled() {
                    info!(
                        pid,
                        "the process this one handed over to drains sessions of its own now: \
                         closing the ones this process still drains (a node keeps at most one \
                         draining proxy)"
                    );
                    shutdown.end_now();
                } else {
                    debug!(
                        pid,
                        "the successor drains, but this process was not stopped"
                    );
                }
            }
            Ok(said) => debug!(
                pid,
                said = %String::from_utf8_lossy(&said).chars().take(80).collect::<String>(),
                "the successor said something this version does not know"
            ),
            Err(_) => return,
        }
    }
}

/// Answers one asker: the sockets if it runs as this user and asks properly; the asker's pid
/// and the line to it once it serves.
async fn answer(
    mut asker: UnixStream,
    sockets: &HandoverSockets,
    draining: &tokio_util::sync::CancellationToken,
    generation: &Generation,
) -> Result<Option<(i32, UnixStream)>, DonorError> {
    let peer = asker.peer_cred().map_err(DonorError::Io)?;
    let pid = peer.pid().unwrap_or_default();
    if !is_our_user(peer.uid()) {
        generation.handover_failed("stranger");
        warn!(
            uid = peer.uid(),
            pid,
            "--handover-socket: a process of another user asked for the listening sockets; \
             refused. Check who can reach the directory"
        );
        return Ok(None);
    }
    let asked = read_line_within(&mut asker, pid, ANSWER_TIMEOUT)
        .await?
        .map_err(DonorError::Io)?;
    if asked != ASK.strip_suffix(b"\n").unwrap_or(ASK) {
        return Err(DonorError::Protocol {
            pid,
            said: String::from_utf8_lossy(&asked).chars().take(80).collect(),
        });
    }
    if draining.is_cancelled() {
        wire::write_line(&mut asker, DRAINING)
            .await
            .map_err(DonorError::Io)?;
        return Ok(None);
    }
    info!(pid, "--handover-socket: handing the listening sockets over");
    wire::send_sockets(&mut asker, &sockets.named())
        .await
        .map_err(DonorError::Io)?;
    let said = read_line_within(&mut asker, pid, READY_TIMEOUT)
        .await?
        .map_err(|source| DonorError::Exited { pid, source })?;
    if said == SERVING.strip_suffix(b"\n").unwrap_or(SERVING) {
        Ok(Some((pid, asker)))
    } else {
        Err(DonorError::Protocol {
            pid,
            said: String::from_utf8_lossy(&said).chars().take(80).collect(),
        })
    }
}

/// The next line the asker (`pid`) says, read for at most `waited`: [`DonorError::Timeout`]
/// past it, and what reading said otherwise.
async fn read_line_within(
    asker: &mut UnixStream,
    pid: i32,
    waited: std::time::Duration,
) -> Result<std::io::Result<Vec<u8>>, DonorError> {
    tokio::time::timeout(waited, wire::read_line(asker))
        .await
        .map_err(|_| DonorError::Timeout { pid, waited })
}
