//! Sessions outlive a handover, with the real binary over real sockets: an exec session and
//! followed logs (HTTP/1.1 and HTTP/2) opened through a proxy keep working after a surge handover
//! and its stop, past the grace period, and end only when the client ends them; the old process
//! then exits by itself. A stop without a successor cuts them with the grace period, as before; a
//! SIGQUIT during the drain cuts them at once; and a second surge in a row ends the first
//! process's drain, so a node keeps at most one draining proxy. The grace periods are short
//! (2 s) and every wait is bounded; nothing here measures time.

use std::path::PathBuf;
use std::time::Duration;

use crate::joining::handover_directory;
use crate::support::client::{H2_AND_HTTP1, HTTP1_ONLY};
use crate::support::metrics::total;
use crate::support::process::{Deployment, ProcessSpec, ProxyProcess, run};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession, FollowedLog};
use crate::support::{eventually, within};
use crate::upgrading::{Adopted, installed, successor_pid};

/// The grace period of every proxy here: sessions still open after it are either served on (a
/// successor serves) or cut.
const GRACE: Duration = Duration::from_secs(2);

/// The sessions a user holds through one proxy: an exec session and a followed log over each
/// protocol.
struct Sessions {
    exec: ExecSession,
    logs: Vec<(&'static str, FollowedLog)>,
}

impl Sessions {
    /// Opens them through the proxy at `addr`, each proven to work.
    async fn open(site: &Deployment, addr: std::net::SocketAddr, who: &str) -> Sessions {
        let mut exec = ExecSession::open(
            &site.client(addr, &format!("{who}-exec"), HTTP1_ONLY),
            EXEC_PROTOCOL,
        )
        .await;
        exec.echo(b"opened").await;
        let mut logs = Vec::new();
        for (protocol, alpn) in [("HTTP/1.1", HTTP1_ONLY), ("HTTP/2", H2_AND_HTTP1)] {
            let mut log = FollowedLog::open(&site.client(addr, &format!("{who}-log"), alpn)).await;
            log.lines(1).await;
            logs.push((protocol, log));
        }
        Sessions { exec, logs }
    }

    /// Each still delivers: the exec session echoes `message`, each log brings new lines.
    async fn still_work(&mut self, message: &[u8]) {
        self.exec.echo(message).await;
        for (_, log) in &mut self.logs {
            log.lines(2).await;
        }
    }

    /// Each was cut (an error, not a clean end: the stream did not finish, it was dropped).
    async fn cut(mut self) {
        for (protocol, log) in &mut self.logs {
            assert!(
                log.cut().await,
                "the {protocol} log ended like a finished one"
            );
        }
        assert!(
            self.exec.cut().await,
            "the exec session ended like a closed one"
        );
    }

    /// The user ends them: the exec session closes, the logs are no longer read.
    async fn end(self) {
        drop(self.logs);
        self.exec.close().await;
    }
}

/// A deployment whose proxies take `--handover-socket` in one directory, each with its own
/// `--admin-socket`, as the DaemonSet's pods.
struct Node {
    site: Deployment,
    handover: String,
}

impl Node {
    async fn new(label: &str) -> Node {
        let site = ProcessSpec::new(label)
            .config(&format!("shutdownGracePeriod: {}s\n", GRACE.as_secs()))
            .prepare()
            .await;
        let handover = format!(
            "--handover-socket={}",
            handover_directory(&site.dir, 0o700).display()
        );
        Node { site, handover }
    }

    fn admin_socket(&self, pod: &str) -> PathBuf {
        self.site.dir.path().join(format!("{pod}.sock"))
    }

    /// A pod's proxy: it takes the sockets from the one serving, if any.
    async fn pod(&self, pod: &str, extra: &[&str]) -> ProxyProcess {
        let mut args = vec![
            self.handover.clone(),
            format!("--admin-socket={}", self.admin_socket(pod).display()),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        self.site.start(pod, &args).await
    }

    /// Starts `pod` beside `serving` and waits until `serving` has handed its sockets over.
    async fn surge(&self, serving: &ProxyProcess, pod: &str) -> ProxyProcess {
        let new = self.pod(pod, &[]).await;
        eventually("the serving process hands its sockets over", || async {
            serving
                .stderr()
                .contains("handed the listening sockets over through --handover-socket")
                .then_some(())
        })
        .await;
        new
    }

    /// `/metrics` of `pod` on its own admin socket, as `admin-probe` reads it.
    async fn metrics(&self, pod: &str) -> String {
        let finished = run(
            &self.site.dir,
            "admin-probe",
            &[
                "admin-probe".to_owned(),
                format!("--admin-socket={}", self.admin_socket(pod).display()),
                "/metrics".to_owned(),
            ],
        )
        .await;
        assert!(finished.status.success(), "{}", finished.stderr);
        finished.stdout
    }
}

/// Whether the process still runs (it has not exited; the test reaps it only in `wait`).
fn running(process: &ProxyProcess) -> bool {
    let pid = rustix::process::Pid::from_raw(process.pid() as i32).expect("a pid is positive");
    rustix::process::test_kill_process(pid).is_ok()
        && !std::fs::read_to_string(format!("/proc/{}/stat", process.pid()))
            .is_ok_and(|stat| stat.contains(") Z "))
}

/// Waits until `process` says it serves its sessions on past the grace period.
async fn draining_past_the_grace_period(process: &ProxyProcess) {
    eventually("the old process serves its sessions on", || async {
        process
            .stderr()
            .contains("a successor serves on the handed-over sockets")
            .then_some(())
    })
    .await;
}

/// A request through `addr` is answered (by whichever process serves it).
async fn answered(site: &Deployment, addr: std::net::SocketAddr) {
    let reply = site.client(addr, "prober", H2_AND_HTTP1).get("/pods").await;
    assert_eq!(reply.status, http::StatusCode::OK, "{}", reply.text());
}

#[tokio::test]
async fn sessions_opened_before_a_surge_go_on_after_the_old_process_is_stopped_until_the_user_ends_them()
 {
    let node = Node::new("session-drain").await;
    let mut old = node.pod("old", &[]).await;
    let addr = old.addr();
    let mut sessions = Sessions::open(&node.site, addr, "alice").await;

    let new = node.surge(&old, "new").await;
    old.terminate();
    draining_past_the_grace_period(&old).await;
    // Past the grace period, with the old process draining: its sessions still work.
    tokio::time::sleep(GRACE).await;
    sessions.still_work(b"after the grace period").await;
    assert!(running(&old), "the old process ended with sessions open");
    assert_eq!(old.addr(), new.addr());
    answered(&node.site, addr).await;
    // What it still serves is on its own admin socket; the admin address is the new one's.
    let metrics = node.metrics("old").await;
    assert!(
        total(&metrics, "kubelet_auth_proxy_draining_connections", &[]) >= 3.0,
        "{metrics}"
    );
    assert_eq!(
        total(
            &node.metrics("new").await,
            "kubelet_auth_proxy_draining_connections",
            &[]
        ),
        0.0
    );

    // The user ends them: the old process has nothing left and exits by itself.
    sessions.end().await;
    assert_eq!(old.wait().await.code(), Some(0), "{}", old.stderr());
    assert!(
        old.stderr().contains("every session has ended"),
        "{}",
        old.stderr()
    );
    assert!(running(&new));
    answered(&node.site, addr).await;
}

#[tokio::test]
async fn without_a_successor_a_stop_cuts_the_sessions_at_the_end_of_the_grace_period() {
    let node = Node::new("session-drain-alone").await;
    let mut alone = node.pod("alone", &[]).await;
    let sessions = Sessions::open(&node.site, alone.addr(), "alice").await;
    alone.terminate();
    sessions.cut().await;
    assert_eq!(alone.wait().await.code(), Some(0), "{}", alone.stderr());
    assert!(
        alone
            .stderr()
            .contains("still open after the shutdown grace period; closed them"),
        "{}",
        alone.stderr()
    );
}

#[tokio::test]
async fn with_session_drain_off_a_stop_after_a_surge_cuts_the_sessions_as_before() {
    let node = Node::new("session-drain-off").await;
    let mut old = node.pod("old", &["--session-drain-timeout=0s"]).await;
    let sessions = Sessions::open(&node.site, old.addr(), "alice").await;
    let _new = node.surge(&old, "new").await;
    old.terminate();
    sessions.cut().await;
    assert_eq!(old.wait().await.code(), Some(0), "{}", old.stderr());
}

#[tokio::test]
async fn sigquit_or_another_sigterm_during_the_drain_cuts_the_sessions_at_once() {
    for signal in ["QUIT", "TERM"] {
        let node = Node::new("session-drain-quit").await;
        let mut old = node.pod("old", &[]).await;
        let sessions = Sessions::open(&node.site, old.addr(), "alice").await;
        let _new = node.surge(&old, "new").await;
        old.terminate();
        draining_past_the_grace_period(&old).await;
        old.signal(signal);
        // Within the step bound: far less than the hours the drain would last.
        sessions.cut().await;
        assert_eq!(
            within("the old process to exit", old.wait()).await.code(),
            Some(0),
            "SIG{signal}: {}",
            old.stderr()
        );
        assert!(
            old.stderr()
                .contains("closing every request and session still open now"),
            "SIG{signal}: {}",
            old.stderr()
        );
    }
}

#[tokio::test]
async fn a_second_surge_in_a_row_ends_the_first_drain_so_one_proxy_drains_at_a_time() {
    let node = Node::new("session-drain-twice").await;
    let mut first = node.pod("first", &[]).await;
    let addr = first.addr();
    let first_sessions = Sessions::open(&node.site, addr, "alice").await;

    // The first rollout: `first` drains alice's sessions.
    let mut second = node.surge(&first, "second").await;
    first.terminate();
    draining_past_the_grace_period(&first).await;

    // Bob's sessions are the second process's: new connections go to it alone now.
    let mut second_sessions = Sessions::open(&node.site, addr, "bob").await;
    // The second rollout while both have sessions open.
    let third = node.surge(&second, "third").await;
    second.terminate();
    draining_past_the_grace_period(&second).await;

    // The first process was told to close what it still drained, and exited.
    first_sessions.cut().await;
    assert_eq!(first.wait().await.code(), Some(0), "{}", first.stderr());
    assert!(
        first
            .stderr()
            .contains("drains sessions of its own now: closing the ones this process still drains"),
        "{}",
        first.stderr()
    );
    // The second one drains bob's, which still work, until bob ends them.
    second_sessions
        .still_work(b"after the second rollout")
        .await;
    assert!(running(&second));
    second_sessions.end().await;
    assert_eq!(second.wait().await.code(), Some(0), "{}", second.stderr());
    assert!(running(&third));
    answered(&node.site, addr).await;
}

#[tokio::test]
async fn two_upgrades_in_place_in_a_row_leave_one_draining_process() {
    let node = Node::new("session-drain-usr2").await;
    let binary = installed(&node.site.dir);
    let mut first = node.site.start_from(&binary, "first", &[]).await;
    let addr = first.addr();
    let first_sessions = Sessions::open(&node.site, addr, "alice").await;

    // The first reload: `first` hands over to its child and drains alice's sessions.
    first.signal("USR2");
    let second = Adopted::new(
        eventually("the first process reports its successor", || async {
            successor_pid(&first.stderr())
        })
        .await,
    );
    draining_past_the_grace_period(&first).await;
    // Bob's sessions are the second process's (the first one no longer accepts).
    let mut second_sessions = Sessions::open(&node.site, addr, "bob").await;

    // The second reload: the second process hands over to its own child and drains bob's; it
    // tells the first one, by its pidfd, to close alice's. (Both log to the first one's stderr,
    // which the children inherit.)
    rustix::process::kill_process(second.0, rustix::process::Signal::USR2).unwrap();
    first_sessions.cut().await;
    assert_eq!(first.wait().await.code(), Some(0), "{}", first.stderr());
    let log = first.stderr();
    assert!(
        log.contains(
            "told the process this one took over from to close the sessions it still drains"
        ),
        "{log}"
    );
    let third = Adopted::new(
        eventually("the second process reports its successor", || async {
            log.lines()
                .filter_map(successor_pid)
                .find(|&pid| pid != second.0.as_raw_nonzero().get())
        })
        .await,
    );
    second_sessions.still_work(b"after the second reload").await;
    assert!(second.alive() && third.alive());
    answered(&node.site, addr).await;
    second_sessions.end().await;
}
