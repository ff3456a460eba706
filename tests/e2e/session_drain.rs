//! Sessions outlive a handover, with the real binary over real sockets: an exec session and
//! followed logs (HTTP/1.1 and HTTP/2) opened through a proxy keep working after a surge handover
//! and its stop, past the grace period, and end only when the client ends them; the old process
//! then exits by itself. A stop without a successor cuts them with the grace period, as before; a
//! SIGQUIT during the drain cuts them at once; and a second surge in a row ends the first
//! process's drain, so a node keeps at most one draining proxy. The grace periods are short
//! (2 s) and every wait is bounded; nothing here measures time. Besides: what still runs during
//! the drain behaves as it always does (a silent exec session closes after the streaming idle
//! timeout; nothing outlives `--session-drain-timeout`), new requests are answered by the new
//! process throughout, and the draining process says on its own admin socket what it still serves
//! while the shared admin address answers for the new one alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::joining::handover_directory;
use crate::support::client::{H2_AND_HTTP1, HTTP1_ONLY, empty, plain_get, request};
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

/// Waits for `process` to exit 0 by itself, saying that it stops because every session ended.
async fn exits_once_every_session_ended(process: &mut ProxyProcess) {
    assert_eq!(process.wait().await.code(), Some(0), "{}", process.stderr());
    assert!(
        process.stderr().contains("every session has ended"),
        "{}",
        process.stderr()
    );
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

/// Users starting new work while the processes change: `GET /pods` on a new connection each time
/// (HTTP/2 and HTTP/1.1 in turn), as `kubectl get` makes them, until stopped. Every answer that is
/// not a 200, and every transport error, is kept for the report.
struct Requests {
    stop: watch::Sender<bool>,
    ok: Arc<AtomicU64>,
    task: JoinHandle<Vec<String>>,
}

impl Requests {
    fn start(site: &Deployment, addr: std::net::SocketAddr) -> Requests {
        let clients = [
            site.client(addr, "carol", H2_AND_HTTP1),
            site.client(addr, "carol", HTTP1_ONLY),
        ];
        let (stop, stopped) = watch::channel(false);
        let ok = Arc::new(AtomicU64::new(0));
        let tally = Arc::clone(&ok);
        let task = tokio::spawn(async move {
            let mut failures = Vec::new();
            for n in 0usize.. {
                if *stopped.borrow() {
                    break;
                }
                let client = &clients[n % clients.len()];
                match client
                    .try_send(request("GET", "/pods").body(empty()).unwrap())
                    .await
                {
                    Ok(reply) if reply.status == StatusCode::OK => {
                        tally.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(reply) => failures.push(format!("{}: {}", reply.status, reply.text())),
                    Err(e) => failures.push(e.to_string()),
                }
                // A pause keeps the loop from starving the processes on a shared machine.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            failures
        });
        Requests { stop, ok, task }
    }

    /// Waits until `n` more requests were answered with 200.
    async fn go_on(&self, n: u64) {
        let since = self.ok.load(Ordering::SeqCst);
        eventually("new requests answered", || async {
            (self.ok.load(Ordering::SeqCst) >= since + n).then_some(())
        })
        .await;
    }

    /// Stops them and asserts that none failed.
    async fn none_failed(self) {
        self.stop.send_replace(true);
        let failures = within("the requests to stop", self.task).await.unwrap();
        assert!(
            failures.is_empty(),
            "{} answered, failed: {failures:?}",
            self.ok.load(Ordering::SeqCst)
        );
    }
}

#[tokio::test]
async fn sessions_opened_before_a_surge_go_on_after_the_old_process_is_stopped_until_the_user_ends_them()
 {
    let node = Node::new("session-drain").await;
    let mut old = node.pod("old", &[]).await;
    let addr = old.addr();
    let mut sessions = Sessions::open(&node.site, addr, "alice").await;
    // Other users start new work throughout; none of it may fail.
    let requests = Requests::start(&node.site, addr);
    requests.go_on(5).await;

    let new = node.surge(&old, "new").await;
    assert_eq!(old.addr(), new.addr());
    old.terminate();
    draining_past_the_grace_period(&old).await;
    // Well past the grace period, with the old process draining: the sessions opened through it
    // still work, and it still runs for them.
    tokio::time::sleep(GRACE).await;
    sessions.still_work(b"after the grace period").await;
    assert!(running(&old), "the old process ended with sessions open");
    // The old process accepts nothing since its stop: these are the new one's.
    requests.go_on(10).await;

    // The user ends them: the old process has nothing left and exits by itself.
    sessions.end().await;
    exits_once_every_session_ended(&mut old).await;
    assert!(running(&new));
    requests.go_on(5).await;
    requests.none_failed().await;
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
    let mut first_sessions = Sessions::open(&node.site, addr, "alice").await;

    // The first rollout: `first` drains alice's sessions.
    let mut second = node.surge(&first, "second").await;
    first.terminate();
    draining_past_the_grace_period(&first).await;

    // Bob's sessions are the second process's: new connections go to it alone now.
    let mut second_sessions = Sessions::open(&node.site, addr, "bob").await;
    // The second rollout while both have sessions open.
    let third = node.surge(&second, "third").await;
    // A successor starting is no stop: the first drain goes on until the second process drains.
    first_sessions.still_work(b"after the second surge").await;
    assert!(running(&first));
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

#[tokio::test]
async fn nothing_outlives_the_session_drain_timeout() {
    let node = Node::new("session-drain-timeout").await;
    // Far past the grace period (10 s after it, for one check that takes a fraction of a second),
    // and short enough for a test to wait for.
    let mut old = node.pod("old", &["--session-drain-timeout=12s"]).await;
    let mut sessions = Sessions::open(&node.site, old.addr(), "alice").await;
    let _new = node.surge(&old, "new").await;
    old.terminate();
    draining_past_the_grace_period(&old).await;
    sessions.still_work(b"during the drain").await;
    // Nobody ends them: the bound does, cutting them as the grace period would have.
    sessions.cut().await;
    assert_eq!(old.wait().await.code(), Some(0), "{}", old.stderr());
    assert!(
        old.stderr()
            .contains("--session-drain-timeout is over: closing the sessions still open"),
        "{}",
        old.stderr()
    );
}

#[tokio::test]
async fn a_session_that_falls_silent_during_the_drain_is_closed_after_the_streaming_idle_timeout() {
    let node = Node::new("session-drain-idle").await;
    let mut old = node
        .pod("old", &["--streaming-connection-idle-timeout=4s"])
        .await;
    let mut exec = ExecSession::open(
        &node.site.client(old.addr(), "alice-exec", HTTP1_ONLY),
        EXEC_PROTOCOL,
    )
    .await;
    // The user types (every 250 ms, far within the idle timeout) while the rollout hands over and
    // stops the old process, so the session reaches the drain alive.
    let rollout = async {
        let new = node.surge(&old, "new").await;
        old.terminate();
        draining_past_the_grace_period(&old).await;
        new
    };
    let typing = async {
        loop {
            exec.echo(b"ls\n").await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let new = tokio::select! {
        new = rollout => new,
        _ = typing => unreachable!("typing goes on until the rollout is done"),
    };
    exec.echo(b"during the drain").await;

    // Then the user stops typing: the session is closed as it would be on a serving process, and
    // the old process, with nothing left, exits.
    exec.closed().await;
    exits_once_every_session_ended(&mut old).await;
    assert!(running(&new));
}

#[tokio::test]
async fn a_draining_process_counts_what_it_still_serves_on_its_own_admin_socket_and_leaves_the_admin_address_to_the_new_one()
 {
    let node = Node::new("session-drain-metrics").await;
    let mut old = node.pod("old", &[]).await;
    let admin = old.admin_addr();
    let sessions = Sessions::open(&node.site, old.addr(), "alice").await;
    let new = node.surge(&old, "new").await;
    assert_eq!(new.admin_addr(), admin);
    old.terminate();
    draining_past_the_grace_period(&old).await;

    let draining = |metrics: &str| total(metrics, "kubelet_auth_proxy_draining_connections", &[]);
    // The exec session and the two logs are three connections to the old process.
    let before = draining(&node.metrics("old").await);
    assert!(before >= 3.0, "{}", node.metrics("old").await);
    assert_eq!(draining(&node.metrics("new").await), 0.0);
    // The shared admin address answers for the new process alone: ready (the stopped one says
    // 503) and draining nothing, every time.
    for _ in 0..10 {
        let ready = plain_get(admin, "/readyz").await;
        assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
        let metrics = plain_get(admin, "/metrics").await.text();
        assert_eq!(draining(&metrics), 0.0, "{metrics}");
    }

    // The user closes the exec session: the count follows while the logs stay open (the
    // process goes on draining them).
    let Sessions { exec, logs } = sessions;
    exec.close().await;
    let after = eventually("the draining count to go down", || async {
        let now = draining(&node.metrics("old").await);
        (now < before).then_some(now)
    })
    .await;
    assert!(after >= 2.0, "the logs are still open: {after}");
    assert!(running(&old));
    drop(logs);
    assert_eq!(old.wait().await.code(), Some(0), "{}", old.stderr());
}
