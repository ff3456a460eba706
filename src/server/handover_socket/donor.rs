//! The running proxy's side of `--handover-socket`: it answers a new proxy of its own user with
//! copies of its listening sockets, one asker at a time, until one takes over or it stops.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::wire::{self, ASK, DRAINING, SERVING};
use super::{ANSWER_TIMEOUT, is_our_user};
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

/// The path, held by a socket of this process as long as no other process took it over.
struct Place {
    path: PathBuf,
    listener: UnixListener,
    /// The socket file's inode, which tells whether the path still names it.
    inode: u64,
}

impl Place {
    /// Binds a socket beside `path`, readable and writable by this user alone, and renames it
    /// over `path`: the path never names nothing, and a socket another process left there is
    /// replaced, never reused.
    fn take(path: &Path) -> std::io::Result<Place> {
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
        let mut beside = std::ffi::OsString::from(".");
        beside.push(name);
        beside.push(format!(".{}", std::process::id()));
        let beside = path.with_file_name(beside);
        match std::fs::remove_file(&beside) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&beside)?;
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&beside, path)?;
        let inode = std::fs::symlink_metadata(path)?.ino();
        Ok(Place {
            path: path.to_owned(),
            listener,
            inode,
        })
    }

    /// Takes the path back if another process took it over and did not keep it (a new process
    /// that failed after binding).
    fn reclaim(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            return;
        }
        match Place::take(&self.path) {
            Ok(place) => *self = place,
            Err(e) => warn!(
                path = %self.path.display(),
                error = %e,
                "cannot bind --handover-socket again; the next proxy on this node will bind its \
                 addresses itself"
            ),
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
    /// then lets go of `sockets`, its copies of the listening sockets.
    pub fn serve(
        path: &Path,
        sockets: HandoverSockets,
        generation: Generation,
        draining: CancellationToken,
    ) -> std::io::Result<Donor> {
        let place = Place::take(path)?;
        let reclaim = Arc::new(Notify::new());
        let task = tokio::spawn(run(
            place,
            sockets,
            generation,
            draining,
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
    draining: CancellationToken,
    reclaim: Arc<Notify>,
) {
    loop {
        let asker = tokio::select! {
            () = draining.cancelled() => return,
            () = reclaim.notified() => {
                place.reclaim();
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
            answered = answer(asker, &sockets, &draining, &generation) => answered,
        };
        match answered {
            Ok(Some(pid)) => {
                generation.handed_over();
                info!(
                    pid,
                    "handed the listening sockets over through --handover-socket; the new \
                     process serves beside this one until this one is stopped"
                );
                return;
            }
            Ok(None) => {}
            Err(e) => {
                generation.handover_failed(e.cause());
                warn!(error = %e, "--handover-socket: a handover failed; going on serving");
                place.reclaim();
            }
        }
    }
}

/// Answers one asker: the sockets if it runs as this user and asks properly; the asker's pid
/// once it serves.
async fn answer(
    mut asker: UnixStream,
    sockets: &HandoverSockets,
    draining: &CancellationToken,
    generation: &Generation,
) -> Result<Option<i32>, DonorError> {
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
        Ok(Some(pid))
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
