//! Replacing the proxy without refusing a connection or cutting a session, with the real binary
//! over real sockets: a second proxy starting beside a running one on the same addresses (a
//! surge rollout), an upgrade in place by SIGUSR2 under a live exec session and a keep-alive
//! client, and a failing new binary that leaves the old one serving. Clients keep count of what
//! they get; nothing here depends on timing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::StatusCode;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::joining::{assert_unjoinable, handover_directory};
use crate::support::assert_contains;
use crate::support::client::{Client, Connection, H2_AND_HTTP1, HTTP1_ONLY, Reply, empty, request};
use crate::support::metrics::total;
use crate::support::process::{BINARY, Deployment, ProcessSpec, ProxyProcess, run};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession};
use crate::support::{TempDir, eventually, within};

/// What one client got: answers with 200, and every failure with its cause.
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failures: std::sync::Mutex<Vec<String>>,
}

/// A client sending `GET /pods` in a loop until stopped, counting what it gets: on a new
/// connection each time (`fresh`), or on one keep-alive connection that it leaves, as HTTP/1.1
/// requires, when an answer says `Connection: close`, and replaces when it was closed before a
/// request went out on it.
struct Caller {
    counts: Arc<Counts>,
    task: JoinHandle<()>,
}

impl Caller {
    fn start(client: Client, fresh: bool, stop: watch::Receiver<bool>) -> Caller {
        let counts = Arc::new(Counts::default());
        let tally = Arc::clone(&counts);
        let task = tokio::spawn(async move {
            let mut open: Option<Connection> = None;
            while !*stop.borrow() {
                let mut reusable = open.take().filter(|_| !fresh);
                if let Some(conn) = &mut reusable
                    && !conn.ready().await
                {
                    reusable = None;
                }
                let outcome = async {
                    let mut conn = match reusable {
                        Some(conn) => conn,
                        None => client.connect().await?,
                    };
                    let response = conn
                        .send(request("GET", "/pods").body(empty()).unwrap())
                        .await?;
                    let reply = Reply::read(response).await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>((conn, reply))
                }
                .await;
                match outcome {
                    Ok((conn, reply)) if reply.status == StatusCode::OK => {
                        tally.ok.fetch_add(1, Ordering::SeqCst);
                        if reply.header("connection") != Some("close") {
                            open = Some(conn);
                        }
                    }
                    Ok((_, reply)) => tally.failures.lock().unwrap().push(format!(
                        "{}: {}",
                        reply.status,
                        reply.text()
                    )),
                    Err(e) => tally.failures.lock().unwrap().push(e.to_string()),
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        Caller { counts, task }
    }

    fn ok(&self) -> u64 {
        self.counts.ok.load(Ordering::SeqCst)
    }

    /// Waits until `n` more requests than `since` were answered.
    async fn answered(&self, since: u64, n: u64) {
        eventually("requests answered", || async move {
            (self.ok() >= since + n).then_some(())
        })
        .await;
    }

    /// The failures, once stopped.
    async fn failures(self) -> Vec<String> {
        within("the caller to stop", self.task).await.unwrap();
        self.counts.failures.lock().unwrap().clone()
    }
}

/// The two clients of every replacement, stopped together: `fresh` (a new connection for each
/// request, h2 or HTTP/1.1) and `kept` (one keep-alive HTTP/1.1 connection).
struct Traffic {
    stop: watch::Sender<bool>,
    fresh: Caller,
    kept: Caller,
}

impl Traffic {
    fn start(site: &Deployment, addr: SocketAddr) -> Traffic {
        let (stop, stopped) = watch::channel(false);
        let fresh = Caller::start(
            site.client(addr, "fresh", H2_AND_HTTP1),
            true,
            stopped.clone(),
        );
        let kept = Caller::start(site.client(addr, "kept", HTTP1_ONLY), false, stopped);
        Traffic { stop, fresh, kept }
    }

    /// Another caller of `client`, stopped with these.
    fn also(&self, client: Client, fresh: bool) -> Caller {
        Caller::start(client, fresh, self.stop.subscribe())
    }

    /// Waits until `fresh` more requests on new connections, and `kept` more on the kept one,
    /// were answered.
    async fn goes_on(&self, fresh: u64, kept: u64) {
        let (fresh_before, kept_before) = (self.fresh.ok(), self.kept.ok());
        self.fresh.answered(fresh_before, fresh).await;
        self.kept.answered(kept_before, kept).await;
    }

    /// Stops every caller; hands back `fresh` and `kept`, for their counts and failures.
    fn stop(self) -> [Caller; 2] {
        self.stop.send_replace(true);
        [self.fresh, self.kept]
    }
}

/// Waits for stopped `callers` to end, asserts that none of their requests failed, and returns
/// how many were answered.
async fn none_failed(callers: impl IntoIterator<Item = Caller>) -> u64 {
    let mut served = 0;
    let mut failures = Vec::new();
    for caller in callers {
        served += caller.ok();
        failures.extend(caller.failures().await);
    }
    assert!(
        failures.is_empty(),
        "{served} answered, failed: {failures:?}"
    );
    served
}

/// A link to the binary under test in `dir`, the path the proxy is started from: pointing it
/// elsewhere stands for an upgraded (or broken) file.
pub(crate) fn installed(dir: &TempDir) -> PathBuf {
    let link = dir.path().join("kubelet-auth-proxy");
    std::os::unix::fs::symlink(BINARY, &link).unwrap();
    link
}

/// Points the link at `target`, as an upgrade replaces the file.
fn replace(link: &Path, target: &Path) {
    let next = link.with_extension("next");
    std::os::unix::fs::symlink(target, &next).unwrap();
    std::fs::rename(&next, link).unwrap();
}

/// `GET target` through the proxy's own `--admin-socket`, with the `admin-probe` subcommand as a
/// Kubernetes exec probe runs it: whether it succeeded, and what it printed.
async fn admin_probe(dir: &TempDir, socket: &Path, target: &str) -> (bool, String) {
    let finished = run(
        dir,
        "admin-probe",
        &[
            "admin-probe".to_owned(),
            format!("--admin-socket={}", socket.display()),
            target.to_owned(),
        ],
    )
    .await;
    (
        finished.status.success(),
        finished.stdout + &finished.stderr,
    )
}

/// The pid in the old process's "the new process serves" line, once it is there.
pub(crate) fn successor_pid(log: &str) -> Option<i32> {
    log.lines().find_map(|line| {
        let entry: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = &entry["fields"];
        (fields["message"] == "the new process serves; draining this one")
            .then(|| fields["pid"].as_i64())
            .flatten()
            .and_then(|pid| i32::try_from(pid).ok())
    })
}

/// A process the test did not start itself (the successor, a child of the proxy): stopped with
/// SIGTERM when the scenario ends, killed if it is still there when dropped.
pub(crate) struct Adopted(pub(crate) rustix::process::Pid);

impl Adopted {
    pub(crate) fn new(pid: i32) -> Adopted {
        Adopted(rustix::process::Pid::from_raw(pid).expect("a pid is positive"))
    }

    pub(crate) fn alive(&self) -> bool {
        rustix::process::test_kill_process(self.0).is_ok()
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::KILL);
    }
}

#[tokio::test]
async fn a_surge_takes_the_sockets_over_the_handover_socket_and_refuses_nothing() {
    let site = ProcessSpec::new("surge")
        .config("shutdownGracePeriod: 5s\n")
        .prepare()
        .await;
    let dir = &site.dir;
    let handover = format!(
        "--handover-socket={}",
        handover_directory(dir, 0o700).display()
    );
    let sockets: Vec<PathBuf> = ["old", "new", "newer"]
        .iter()
        .map(|name| dir.path().join(format!("{name}.sock")))
        .collect();
    let pod = |socket: &Path| {
        vec![
            format!("--admin-socket={}", socket.display()),
            handover.clone(),
        ]
    };
    let mut old = site.start("old", &pod(&sockets[0])).await;
    let (addr, admin) = (old.addr(), old.admin_addr());
    let traffic = Traffic::start(&site, addr);
    traffic.goes_on(5, 0).await;

    // The new pod's process, with the same flags: it asks the old one for its sockets.
    let mut new = site.start("new", &pod(&sockets[1])).await;
    assert_eq!((new.addr(), new.admin_addr()), (addr, admin));
    assert_contains(&new.stderr(), "listening sockets handed over");
    eventually("the old process counts the handover", || async {
        old.stderr()
            .contains("handed the listening sockets over through --handover-socket")
            .then_some(())
    })
    .await;
    // Its readiness is its own, through its socket; and the port is still nobody else's.
    let (ready, said) = admin_probe(dir, &sockets[1], "/readyz").await;
    assert!(ready, "{said}");
    assert_unjoinable(addr);
    assert_unjoinable(admin);
    traffic.goes_on(20, 5).await;

    // The rollout stops the old pod once the new one is ready.
    old.terminate();
    assert_eq!(old.wait().await.code(), Some(0), "{}", old.stderr());
    traffic.goes_on(20, 5).await;

    // The next rollout: the path is the new process's now.
    let newer = site.start("newer", &pod(&sockets[2])).await;
    assert_eq!(newer.addr(), addr);
    new.terminate();
    assert_eq!(new.wait().await.code(), Some(0), "{}", new.stderr());
    traffic.goes_on(20, 5).await;
    let served = none_failed(traffic.stop()).await;
    assert_unjoinable(addr);

    // Everything since the new one left was the newer one's, which counts it.
    let (_, metrics) = admin_probe(dir, &sockets[2], "/metrics").await;
    assert!(
        total(
            &metrics,
            "kubelet_auth_proxy_requests_total",
            &[("code", "200")]
        ) >= 25.0,
        "{metrics}"
    );
    println!("surge: {served} requests answered across two handovers, 0 failed");
}

#[tokio::test]
async fn sigusr2_hands_over_to_a_new_process_while_sessions_finish_on_the_old() {
    let site = ProcessSpec::new("handover")
        .config("shutdownGracePeriod: 30s\n")
        .prepare()
        .await;
    let binary = installed(&site.dir);
    let mut old = site.start_from(&binary, "proxy", &[]).await;
    let addr = old.addr();
    let mut session =
        ExecSession::open(&site.client(addr, "alice", HTTP1_ONLY), EXEC_PROTOCOL).await;
    session.echo(b"before the upgrade").await;
    let traffic = Traffic::start(&site, addr);
    let kept_h2 = traffic.also(site.client(addr, "kept-h2", H2_AND_HTTP1), false);
    traffic.goes_on(5, 5).await;
    kept_h2.answered(0, 5).await;

    old.signal("USR2");
    let successor = Adopted::new(
        eventually("the old process reports the new one serving", || async {
            successor_pid(&old.stderr())
        })
        .await,
    );
    assert_ne!(successor.0.as_raw_nonzero().get() as u32, old.pid());
    // The inherited sockets are no more joinable than the ones bound.
    assert_unjoinable(addr);
    assert_unjoinable(old.admin_addr());
    // The session stays on the old process, which drains around it; new requests go on.
    traffic.goes_on(20, 5).await;
    session.echo(b"during the handover").await;
    // The session ends on its own, and the old process with it.
    session.close().await;
    assert_eq!(old.wait().await.code(), Some(0), "{}", old.stderr());
    assert!(successor.alive());
    traffic.goes_on(20, 5).await;
    kept_h2.answered(kept_h2.ok(), 5).await;
    let [fresh, kept] = traffic.stop();
    let served = none_failed([fresh, kept, kept_h2]).await;
    println!(
        "SIGUSR2: {served} requests answered across the handover, 0 failed, the session ran to its end"
    );
}

#[tokio::test]
async fn a_new_binary_that_fails_leaves_the_old_one_serving_and_is_counted() {
    let site = ProcessSpec::new("bad-upgrade").prepare().await;
    let dir = &site.dir;
    let socket = dir.path().join("admin.sock");
    let binary = installed(dir);
    let mut proxy = site
        .start_from(
            &binary,
            "proxy",
            &[format!("--admin-socket={}", socket.display())],
        )
        .await;
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
    let failures = |cause: &'static str| {
        let socket = &socket;
        async move {
            let (_, metrics) = admin_probe(dir, socket, "/metrics").await;
            total(
                &metrics,
                "kubelet_auth_proxy_handover_failures_total",
                &[("cause", cause)],
            )
        }
    };

    // A new version that refuses to start (a configuration it rejects: status 2).
    let refusing = dir.write(
        "refusing",
        "#!/bin/sh\necho 'refusing to start' >&2\nexit 2\n",
    );
    std::fs::set_permissions(
        &refusing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    replace(&binary, &refusing);
    proxy.signal("USR2");
    eventually("the failed handover counted", || async {
        (failures("exited").await == 1.0).then_some(())
    })
    .await;
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);

    // A file that is no program at all.
    let garbage = dir.write("garbage", "not a program");
    replace(&binary, &garbage);
    proxy.signal("USR2");
    eventually("the failed start counted", || async {
        (failures("spawn").await == 1.0).then_some(())
    })
    .await;
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    let (ready, said) = admin_probe(dir, &socket, "/readyz").await;
    assert!(ready, "{said}");

    // The real binary again, with a configuration that fails only once it has taken the admin
    // socket's path over (an address not on this host): the old process takes the path back.
    replace(&binary, Path::new(BINARY));
    let config_text = std::fs::read_to_string(&site.config).unwrap();
    std::fs::write(
        &site.config,
        config_text.replace(
            "listenAddress: 127.0.0.1:0",
            "listenAddress: [\"127.0.0.1:0\", \"192.0.2.1:10250\"]",
        ),
    )
    .unwrap();
    proxy.signal("USR2");
    eventually("the failed handover counted", || async {
        (failures("exited").await == 2.0).then_some(())
    })
    .await;
    let (ready, said) = admin_probe(dir, &socket, "/readyz").await;
    assert!(ready, "the old process answers on its socket again: {said}");
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);

    let log = proxy.stderr();
    assert!(log.contains("refusing to start"), "{log}");
    assert!(log.contains("upgrade in place failed"), "{log}");
    assert!(log.contains("the old process goes on serving"), "{log}");
    assert!(log.contains("192.0.2.1:10250: cannot listen"), "{log}");
    proxy.terminate();
    assert_eq!(proxy.wait().await.code(), Some(0), "{}", proxy.stderr());
}

/// How the operator replaces the proxy, in [`restart_table`].
#[derive(Clone, Copy, Debug)]
enum Replacement {
    /// SIGTERM, wait for the exit, start again (`systemctl restart`, a rollout without surge).
    Restart,
    /// Start the new process beside the old, then SIGTERM the old (a surge rollout).
    Surge,
    /// SIGUSR2 (`systemctl reload`).
    Handover,
}

/// Sorts a client's failures: refused connections, resets, and anything else.
fn classify(failures: &[String]) -> (usize, usize, usize) {
    let refused = failures
        .iter()
        .filter(|f| f.contains("Connection refused"))
        .count();
    let reset = failures
        .iter()
        .filter(|f| f.contains("reset") || f.contains("Broken pipe"))
        .count();
    (refused, reset, failures.len() - refused - reset)
}

/// One row of the table: the three clients through one replacement.
async fn restart_row(how: Replacement) -> String {
    let site = ProcessSpec::new("restart-table")
        .config("shutdownGracePeriod: 30s\n")
        .prepare()
        .await;
    let binary = installed(&site.dir);
    let handover = format!(
        "--handover-socket={}",
        handover_directory(&site.dir, 0o700).display()
    );
    let mut old = site
        .start_from(&binary, "old", std::slice::from_ref(&handover))
        .await;
    let (addr, admin) = (old.addr(), old.admin_addr());
    let again = [
        format!("--listen-address={addr}"),
        format!("--admin-listen-address={admin}"),
        handover,
    ];
    let traffic = Traffic::start(&site, addr);
    let mut session =
        ExecSession::open(&site.client(addr, "alice", HTTP1_ONLY), EXEC_PROTOCOL).await;
    traffic.goes_on(10, 0).await;
    let began = std::time::Instant::now();
    // The exec session echoes a line every 200 ms and is closed by its client 6 s in.
    let exec = tokio::spawn(async move {
        let mut lines = 0;
        while began.elapsed() < std::time::Duration::from_secs(6) {
            session.echo(b"a line\n").await;
            lines += 1;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        session.close().await;
        lines
    });
    let mut successor = None;
    let mut new = None;
    match how {
        Replacement::Restart => {
            old.terminate();
            old.wait().await;
            new = Some(site.start("new", &again).await);
        }
        Replacement::Surge => {
            new = Some(site.start("new", &again).await);
            old.terminate();
        }
        Replacement::Handover => {
            old.signal("USR2");
            successor = Some(Adopted::new(
                eventually("the handover", || async { successor_pid(&old.stderr()) }).await,
            ));
        }
    }
    let session = match exec.await {
        Ok(lines) => format!("ran to its end ({lines} lines)"),
        Err(_) => format!("cut at +{:.1} s", began.elapsed().as_secs_f64()),
    };
    old.wait().await;
    traffic.goes_on(25, 25).await;
    let [fresh, kept] = traffic.stop();
    let (fresh_ok, kept_ok) = (fresh.ok(), kept.ok());
    let (fresh_refused, fresh_reset, fresh_failed) = classify(&fresh.failures().await);
    let (kept_refused, kept_reset, kept_failed) = classify(&kept.failures().await);
    drop((new, successor));
    format!(
        "| {how:?} | {fresh_ok} ok, {fresh_refused} refused, {fresh_reset} reset, {fresh_failed} failed | {kept_ok} ok, {kept_refused} refused, {kept_reset} reset, {kept_failed} failed | {session} |"
    )
}

/// The measurement, rerun: three clients (a new TLS connection with one GET every 20 ms,
/// a keep-alive client every 20 ms, an exec session echoing every 200 ms that its client closes
/// 6 s after the replacement began) through a restart, a surge and a handover. A measurement,
/// not a check (it takes time and prints a table):
/// `cargo test --test e2e -- --ignored --nocapture restart_table`.
#[tokio::test]
#[ignore = "a measurement: run by hand, see its documentation"]
async fn restart_table() {
    let mut rows = Vec::new();
    for how in [
        Replacement::Restart,
        Replacement::Surge,
        Replacement::Handover,
    ] {
        rows.push(restart_row(how).await);
    }
    println!("| replacement | new connection per GET | keep-alive | exec session |");
    println!("|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}

/// The first rollout from a version that binds with `SO_REUSEPORT` and cannot hand its sockets
/// over: the new process stands by, and takes the addresses once the old one lets go of them.
/// A measurement of that one window, not a check: it needs the previous version's binary, named
/// by `KAP_PREVIOUS_BINARY` (built from the release before `--handover-socket`), and prints what
/// 20 clients opening a new connection every 20 ms each got:
/// `KAP_PREVIOUS_BINARY=/path/to/0.1/kubelet-auth-proxy cargo test --test e2e -- --ignored
/// --nocapture first_rollout_window`.
#[tokio::test]
#[ignore = "a measurement: run by hand, see its documentation"]
async fn first_rollout_window() {
    let previous = PathBuf::from(
        std::env::var_os("KAP_PREVIOUS_BINARY").expect("KAP_PREVIOUS_BINARY: the 0.1 binary"),
    );
    let site = ProcessSpec::new("first-rollout")
        .config("shutdownGracePeriod: 5s\n")
        .prepare()
        .await;
    let mut old = site.start_from(&previous, "old", &[]).await;
    let (addr, admin) = (old.addr(), old.admin_addr());
    let traffic = Traffic::start(&site, addr);
    let callers: Vec<Caller> = (0..20)
        .map(|n| traffic.also(site.client(addr, &format!("fresh-{n}"), HTTP1_ONLY), true))
        .collect();
    traffic.goes_on(5, 5).await;
    let probe = site.dir.path().join("new.sock");
    let args = [
        format!("--listen-address={addr}"),
        format!("--admin-listen-address={admin}"),
        format!(
            "--handover-socket={}",
            handover_directory(&site.dir, 0o700).display()
        ),
        format!("--admin-socket={}", probe.display()),
    ];
    let new = site.start("new", &args);
    let rollout = async {
        eventually("the new process stands by", || async {
            admin_probe(&site.dir, &probe, "/readyz")
                .await
                .0
                .then_some(())
        })
        .await;
        old.terminate();
    };
    let (new, ()) = tokio::join!(new, rollout);
    old.wait().await;
    traffic.goes_on(25, 25).await;
    let [fresh, kept] = traffic.stop();
    let mut answered = fresh.ok() + kept.ok();
    let mut failures = fresh.failures().await;
    failures.extend(kept.failures().await);
    for caller in callers {
        answered += caller.ok();
        failures.extend(caller.failures().await);
    }
    let (refused, reset, other) = classify(&failures);
    let waited = new
        .stderr()
        .lines()
        .find(|line| line.contains("took the address over"))
        .unwrap_or_default()
        .to_owned();
    println!(
        "first rollout from {}: {answered} answered, {refused} refused, {reset} reset, {other} other failures; {waited}",
        previous.display()
    );
}

/// systemd's own tool for socket activation, when installed (it comes with systemd).
const SOCKET_ACTIVATE: &str = "/usr/bin/systemd-socket-activate";

#[tokio::test]
async fn a_socket_passed_by_systemd_is_taken_and_served() {
    if !Path::new(SOCKET_ACTIVATE).exists() {
        println!("{SOCKET_ACTIVATE} is not installed (apt-get install systemd): not run");
        return;
    }
    let site = ProcessSpec::new("socket-activation").prepare().await;
    // A free port for the tool to bind, as a socket unit's ListenStream= would.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // The tool holds the socket and starts the proxy at the first connection, with LISTEN_PID,
    // LISTEN_FDS and LISTEN_FDNAMES set as systemd sets them. That first connection waits in
    // the socket while the proxy starts, and is served.
    let args = [
        format!("--listen={addr}"),
        "--fdname=kubelet-api".to_owned(),
        BINARY.to_owned(),
    ]
    .into_iter()
    .chain(site.command_line(&[format!("--listen-address={addr}")]))
    .collect::<Vec<_>>();
    let alice = site.client(addr, "alice", H2_AND_HTTP1);
    let first_request = async {
        // Once the tool listens: this connection starts the proxy.
        let _first = eventually("the tool listens", || async {
            tokio::net::TcpStream::connect(addr).await.ok()
        })
        .await;
        alice.get("/pods").await
    };
    let (proxy, reply) = tokio::join!(
        ProxyProcess::start_from(Path::new(SOCKET_ACTIVATE), &site.dir, "activated", &args),
        first_request
    );
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(proxy.addr(), addr);
    assert_contains(&proxy.stderr(), "listening sockets inherited");
}
