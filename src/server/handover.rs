//! Upgrade in place: on `SIGUSR2` the proxy starts a new process from the executable at the path
//! it was started from (so a replaced file is the new version), hands it the listening sockets,
//! and waits until it serves; only then does it stop accepting and drain. A new process that
//! cannot start, exits, or is not serving within [`READY_TIMEOUT`] is killed if need be and the
//! old one goes on serving: a bad upgrade never takes the port away.
//!
//! The sockets travel as systemd passes them ([`crate::server::listen_fds`]): descriptors from 3,
//! counted by `LISTEN_FDS` and named by `LISTEN_FDNAMES`. Both processes then hold the same
//! listening sockets, with one accept queue each: nothing queued is lost when the old one stops
//! accepting. One more descriptor after them (named by [`READY_FD`], not counted in `LISTEN_FDS`)
//! is one end of a socket pair: the new process writes `READY=1` to it once it serves, and its end
//! closing without that means it failed. Under systemd the old process then names the new one the
//! service's main process (`MAINPID=`), so `systemctl` follows it and the reload is over.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tracing::{debug, info};

use crate::server::listen_fds::{
    FIRST_FD, HANDOVER_FROM, LISTEN_FDNAMES, LISTEN_FDS, LISTEN_PID, Role,
};

/// Names the descriptor a new process reports its readiness on.
pub const READY_FD: &str = "KUBELET_AUTH_PROXY_READY_FD";
/// How long a new process has to start serving: configuration is read from files, the sockets
/// are inherited, so this is generous; past it the new process is killed.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// What the new process writes when it serves.
const READY: &[u8] = b"READY=1\n";

/// Copies of the proxy's listening sockets, for a successor. Close-on-exec until handed over.
#[derive(Debug, Default)]
pub struct HandoverSockets {
    sockets: Vec<(Role, OwnedFd)>,
}

impl HandoverSockets {
    /// Keeps a copy of `listener`, serving `role`.
    pub fn add(&mut self, role: Role, listener: &impl AsFd) -> std::io::Result<()> {
        self.sockets
            .push((role, listener.as_fd().try_clone_to_owned()?));
        Ok(())
    }

    /// Other copies of the same sockets, for `--handover-socket`
    /// ([`crate::server::handover_socket`]).
    pub fn try_clone(&self) -> std::io::Result<HandoverSockets> {
        let sockets = self
            .sockets
            .iter()
            .map(|(role, fd)| Ok((*role, fd.try_clone()?)))
            .collect::<std::io::Result<_>>()?;
        Ok(HandoverSockets { sockets })
    }

    /// Each socket with its `LISTEN_FDNAMES` name.
    pub fn named(&self) -> Vec<(&'static str, BorrowedFd<'_>)> {
        self.sockets
            .iter()
            .map(|(role, fd)| (role.name(), fd.as_fd()))
            .collect()
    }
}

/// Why a new process did not take over. The old one goes on serving in every case.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The executable could not be started (missing, not executable, not a binary for this
    /// machine).
    #[error(
        "cannot start {}: {source}; the old process goes on serving: check the file installed there",
        exe.display()
    )]
    Spawn {
        /// The path the proxy was started from.
        exe: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The new process ended before it was serving (a configuration it refuses, a crash).
    #[error(
        "the new process {pid} ended before serving ({status}); the old process goes on serving: its reason is in the log above (status 2: a configuration error, check-config names it)"
    )]
    Exited {
        /// The new process.
        pid: u32,
        /// How it ended (`status unknown` if it could not be reaped).
        status: String,
    },
    /// The new process was not serving within [`READY_TIMEOUT`] and was killed.
    #[error(
        "the new process {pid} was not serving within {READY_TIMEOUT:?}, killed it; the old process goes on serving"
    )]
    Timeout {
        /// The new process.
        pid: u32,
    },
    /// A socket pair or a descriptor copy for the handover could not be made.
    #[error("cannot prepare the handover: {0}; the old process goes on serving")]
    Io(#[source] std::io::Error),
}

impl HandoverError {
    /// The `cause` label of the failed handovers metric.
    pub fn cause(&self) -> &'static str {
        match self {
            HandoverError::Spawn { .. } => "spawn",
            HandoverError::Exited { .. } => "exited",
            HandoverError::Timeout { .. } => "timeout",
            HandoverError::Io(_) => "io",
        }
    }
}

/// How to start the proxy again: the path and arguments this process was started with.
#[derive(Debug, Clone)]
pub struct Successor {
    exe: PathBuf,
    args: Vec<OsString>,
}

impl Successor {
    /// This process's command line, taken at start. The executable is the path it was started
    /// as (`argv[0]`, made absolute; a symbolic link is followed again at the handover, so
    /// swapping a link upgrades too), or, when `argv[0]` names no path, what `/proc/self/exe`
    /// says now: later that names the old file even after it was replaced.
    pub fn of_this_process() -> std::io::Result<Successor> {
        let mut argv = std::env::args_os();
        let argv0 = argv.next().map(PathBuf::from);
        let exe = match argv0 {
            Some(path) if path.components().count() > 1 || path.is_absolute() => {
                std::path::absolute(path)?
            }
            _ => std::env::current_exe()?,
        };
        Ok(Successor {
            exe,
            args: argv.collect(),
        })
    }

    /// Starts the new process with `sockets` and waits until it serves; returns its pid.
    pub async fn start(&self, sockets: &HandoverSockets) -> Result<u32, HandoverError> {
        let (ours, theirs) = UnixStream::pair().map_err(HandoverError::Io)?;
        let count = sockets.sockets.len();
        // Above every target descriptor, so that placing one never overwrites another's source.
        let above = FIRST_FD
            + RawFd::try_from(count + 1)
                .map_err(|e| HandoverError::Io(std::io::Error::other(e)))?;
        let mut sources = Vec::with_capacity(count + 1);
        for (_, fd) in &sockets.sockets {
            sources.push(
                rustix::io::fcntl_dupfd_cloexec(fd, above)
                    .map_err(|e| HandoverError::Io(e.into()))?,
            );
        }
        sources.push(
            rustix::io::fcntl_dupfd_cloexec(&theirs, above)
                .map_err(|e| HandoverError::Io(e.into()))?,
        );
        drop(theirs);
        let names: Vec<&str> = sockets
            .sockets
            .iter()
            .map(|(role, _)| role.name())
            .collect();
        let raw: Vec<RawFd> = sources.iter().map(AsRawFd::as_raw_fd).collect();
        let mut command = Command::new(&self.exe);
        command
            .args(&self.args)
            .env_remove(LISTEN_PID)
            .env(LISTEN_FDS, count.to_string())
            .env(LISTEN_FDNAMES, names.join(":"))
            .env(HANDOVER_FROM, std::process::id().to_string())
            .env(
                READY_FD,
                (FIRST_FD + RawFd::try_from(count).unwrap_or(RawFd::MAX)).to_string(),
            );
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: it calls dup2 (a system call, no allocation, no
        // lock) on descriptors that stay open in the parent until spawn returns. Targets are
        // below every source (`above`), so no placement overwrites a descriptor still to be
        // placed; dup2 leaves the copy without close-on-exec, which is what passes it on.
        unsafe {
            command.pre_exec(move || {
                for (target, &source) in (FIRST_FD..).zip(&raw) {
                    let source = BorrowedFd::borrow_raw(source);
                    // An owner for the target number only so that rustix's dup2 can name it;
                    // forgotten right after, so it never closes what it does not own.
                    let mut target = OwnedFd::from_raw_fd(target);
                    let placed = rustix::io::dup2(source, &mut target);
                    std::mem::forget(target);
                    placed?;
                }
                Ok(())
            });
        }
        let mut child = Starting {
            child: command.spawn().map_err(|source| HandoverError::Spawn {
                exe: self.exe.clone(),
                source,
            })?,
            armed: true,
        };
        drop(sources);
        let pid = child.child.id();
        info!(pid, exe = %self.exe.display(), "started a new process; handing over once it serves");
        ours.set_nonblocking(true).map_err(HandoverError::Io)?;
        let ready = async {
            let mut ours = tokio::net::UnixStream::from_std(ours)?;
            let mut said = Vec::new();
            (&mut ours).take(64).read_to_end(&mut said).await?;
            Ok::<bool, std::io::Error>(said.starts_with(READY))
        };
        let outcome = tokio::time::timeout(READY_TIMEOUT, ready).await;
        // Serving, or ended (reaped below): nothing to kill any more.
        child.armed = false;
        match outcome {
            // It serves: it lives on, reparented once this process exits.
            Ok(Ok(true)) => Ok(pid),
            Ok(Ok(false) | Err(_)) => {
                let status = reap(&mut child.child)
                    .await
                    .map_or_else(|| "status unknown".to_owned(), |status| status.to_string());
                Err(HandoverError::Exited { pid, status })
            }
            Err(_) => {
                let _ = child.child.kill();
                reap(&mut child.child).await;
                Err(HandoverError::Timeout { pid })
            }
        }
    }
}

/// A new process not yet serving: killed if the handover is abandoned (a stop meanwhile).
struct Starting {
    child: Child,
    /// Whether dropping it kills the process.
    armed: bool,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits (5 s at most, then kills it and waits as long again) for a child that failed to end,
/// and returns its status.
async fn reap(child: &mut Child) -> Option<ExitStatus> {
    for attempt in 0..500 {
        if attempt == 250 {
            let _ = child.kill();
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Set once readiness has been reported, so the descriptor is owned once.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Tells the process handing over, if there is one, that this process serves. Returns it, if
/// there was one (then it, not this process, tells systemd).
pub fn report_ready() -> Option<Parent> {
    let parent = rustix::process::getppid();
    let from_parent = std::env::var(HANDOVER_FROM)
        .ok()
        .and_then(|pid| pid.parse::<i32>().ok())
        .is_some_and(|from| Some(from) == parent.map(|pid| pid.as_raw_nonzero().get()));
    let fd = std::env::var(READY_FD)
        .ok()
        .and_then(|fd| fd.parse::<RawFd>().ok());
    let (true, Some(fd), Some(parent)) = (from_parent, fd, parent) else {
        return None;
    };
    if fd < FIRST_FD || REPORTED.swap(true, Ordering::SeqCst) {
        return None;
    }
    // Before saying READY: until then the parent waits, so the pid is still its own.
    let pidfd = rustix::process::pidfd_open(parent, rustix::process::PidfdFlags::empty())
        .map_err(|e| debug!(error = %e, "cannot hold on to the process that handed over"))
        .ok();
    // SAFETY: the parent, checked above, passed this descriptor for this process alone (see
    // the module documentation), and REPORTED makes this the only place that owns it.
    let mut stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if let Err(e) = stream.write_all(READY) {
        debug!(error = %e, "cannot tell the process handing over that this one serves");
    }
    Some(Parent { pidfd })
}

/// The process that handed its sockets over to this one by `SIGUSR2`, held by a pidfd, so that a
/// signal never reaches another process that got its pid after it ended.
#[derive(Debug)]
pub struct Parent {
    pidfd: Option<OwnedFd>,
}

impl Parent {
    /// Tells it to close whatever it still drains (this process now drains sessions of its own,
    /// and a node keeps at most one draining proxy): a stop signal, which a draining proxy takes
    /// as its second. Nothing happens if it has ended.
    pub fn end_its_drain(self) {
        let Some(pidfd) = self.pidfd else {
            return;
        };
        match rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::TERM) {
            Ok(()) => info!(
                "told the process this one took over from to close the sessions it still drains"
            ),
            Err(e) => debug!(error = %e, "the process this one took over from is gone"),
        }
    }
}
