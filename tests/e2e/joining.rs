//! Nobody shares the proxy's ports: no process of the proxy's own user can bind beside a listener
//! that serves, however it sets its socket up (the tests run as one user, so a socket of the test
//! process is that intruder); the directory of `--handover-socket` must be the proxy's alone; and
//! the first rollout from a version that cannot hand its sockets over stands by, ready, and takes
//! the addresses once that version lets go of them.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use http::StatusCode;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::assert_contains;
use crate::support::client::H2_AND_HTTP1;
use crate::support::process::{ProcessSpec, run};
use crate::support::{TempDir, eventually};

/// Every way a process can set up a socket to share an address: `SO_REUSEPORT` (the kernel's
/// port sharing, which needs the same user), `SO_REUSEADDR`, both, neither.
const WAYS: [(bool, bool); 4] = [(true, true), (true, false), (false, true), (false, false)];

/// Asserts that no socket of this process can bind `addr`, whatever options it sets: so none can
/// listen there and take a connection.
pub fn assert_unjoinable(addr: SocketAddr) {
    for (reuse_port, reuse_address) in WAYS {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .expect("a TCP socket");
        socket.set_reuse_port(reuse_port).unwrap();
        socket.set_reuse_address(reuse_address).unwrap();
        let bound = socket.bind(&addr.into());
        assert_eq!(
            bound.as_ref().map_err(std::io::Error::kind).err(),
            Some(std::io::ErrorKind::AddrInUse),
            "a socket with SO_REUSEPORT={reuse_port}, SO_REUSEADDR={reuse_address} bound {addr}: \
             {bound:?}"
        );
    }
}

/// A directory for `--handover-socket` in `dir`, with `mode`; the socket's path in it.
pub fn handover_directory(dir: &TempDir, mode: u32) -> PathBuf {
    let directory = dir.path().join("handover");
    std::fs::create_dir_all(&directory).unwrap();
    std::fs::set_permissions(&directory, std::fs::Permissions::from_mode(mode)).unwrap();
    directory.join("handover.sock")
}

#[tokio::test]
async fn no_process_of_the_proxy_s_user_can_join_its_listeners() {
    let site = ProcessSpec::new("join").prepare().await;
    let proxy = site.start("proxy", &[]).await;
    assert_unjoinable(proxy.addr());
    assert_unjoinable(proxy.admin_addr());
    // The proxy still serves, alone.
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
}

#[tokio::test]
async fn check_config_warns_of_a_handover_directory_other_users_can_reach_naming_the_fix() {
    let site = ProcessSpec::new("handover-dir").prepare().await;
    let socket = handover_directory(&site.dir, 0o755);
    let flag = format!("--handover-socket={}", socket.display());
    for (strict, code) in [(false, 0), (true, 2)] {
        let mut args = site.command_line(std::slice::from_ref(&flag));
        args.insert(0, "check-config".to_owned());
        if strict {
            args.push("--strict".to_owned());
        }
        let checked = run(&site.dir, "check-config", &args).await;
        checked.assert_code(code);
        assert!(
            checked.stderr.contains("--handover-socket")
                && checked.stderr.contains("open to other users (mode 0755)")
                && checked.stderr.contains("chmod o-rwx")
                && checked.stderr.contains("without handing its sockets over"),
            "{}",
            checked.stderr
        );
        assert!(
            !socket.exists(),
            "check-config created {}",
            socket.display()
        );
    }

    // Made the proxy's own, it is taken.
    std::fs::set_permissions(
        socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let proxy = site.start("proxy", &[flag]).await;
    eventually("the handover socket is bound", || async {
        socket.exists().then_some(())
    })
    .await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is the proxy user's alone");
    drop(proxy);
}

/// The metrics a proxy from before handovers answers on its admin address, as it writes them.
const PREVIOUS_METRICS: &str = "# TYPE kubelet_auth_proxy_build_info gauge\n\
    kubelet_auth_proxy_build_info{version=\"0.1.0\"} 1\n# EOF\n";

/// Stands in for a proxy from before handovers: the kubelet API address bound with
/// `SO_REUSEPORT` (no process of another user can join it), and the admin address answering
/// `/metrics` as that proxy does.
struct PreviousVersion {
    api: std::net::TcpListener,
    admin: tokio::task::JoinHandle<()>,
    admin_addr: SocketAddr,
}

/// Answers on `admin` as the admin address of a proxy from before handovers, until aborted.
pub fn answer_as_previous_version(admin: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = admin.accept().await {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; \
                 version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: \
                 close\r\n\r\n{PREVIOUS_METRICS}",
                PREVIOUS_METRICS.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    })
}

impl PreviousVersion {
    async fn start() -> PreviousVersion {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.set_reuse_port(true).unwrap();
        socket
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        socket.listen(128).unwrap();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let admin = answer_as_previous_version(admin);
        PreviousVersion {
            api: socket.into(),
            admin,
            admin_addr,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.api.local_addr().unwrap()
    }

    /// Stops, as its pod is deleted: both addresses are let go of.
    fn stop(self) {
        self.admin.abort();
        drop(self.api);
    }
}

#[tokio::test]
async fn the_first_rollout_from_a_version_without_handovers_stands_by_ready_then_takes_over() {
    let site = ProcessSpec::new("standby").prepare().await;
    let previous = PreviousVersion::start().await;
    let (addr, admin) = (previous.addr(), previous.admin_addr);
    let handover = handover_directory(&site.dir, 0o700);
    let probe_socket = site.dir.path().join("new-admin.sock");
    let probe = |target: &'static str| {
        let args = vec![
            "admin-probe".to_owned(),
            format!("--admin-socket={}", probe_socket.display()),
            target.to_owned(),
        ];
        let dir = &site.dir;
        async move { run(dir, "admin-probe", &args).await }
    };
    let args = [
        format!("--listen-address={addr}"),
        format!("--admin-listen-address={admin}"),
        format!("--handover-socket={}", handover.display()),
        format!("--admin-socket={}", probe_socket.display()),
    ];
    let new = site.start("new", &args);
    let rollout = async {
        // Ready while the previous version still holds both addresses: the rollout goes on and
        // deletes the old pod.
        eventually("the new process stands by, ready", || async {
            probe("/readyz").await.status.success().then_some(())
        })
        .await;
        previous.stop();
    };
    let (new, ()) = tokio::join!(new, rollout);
    assert_eq!(new.addr(), addr);
    assert_eq!(new.admin_addr(), admin);
    let alice = site.client(addr, "alice", H2_AND_HTTP1);
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    let log = new.stderr();
    assert!(
        log.contains("a previous version of the proxy, which cannot hand its sockets over"),
        "{log}"
    );
    assert!(
        log.contains("took the address over from the previous version"),
        "{log}"
    );
    // What it now holds, nobody can join.
    assert_unjoinable(addr);
    assert_unjoinable(admin);
}

#[tokio::test]
async fn without_a_previous_version_a_held_address_keeps_the_proxy_unready() {
    // The kubelet still on the port (it does not answer /metrics as the proxy does): waiting,
    // alive and not ready, as before.
    let site = ProcessSpec::new("kubelet-holds").prepare().await;
    let kubelet = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = kubelet.local_addr().unwrap();
    let handover = handover_directory(&site.dir, 0o700);
    let probe_socket = site.dir.path().join("admin.sock");
    let args = [
        format!("--listen-address={addr}"),
        format!("--handover-socket={}", handover.display()),
        format!("--admin-socket={}", probe_socket.display()),
    ];
    let new = site.start("new", &args);
    let wait = async {
        let args = vec![
            "admin-probe".to_owned(),
            format!("--admin-socket={}", probe_socket.display()),
            "/readyz".to_owned(),
        ];
        let said = eventually("the new process answers its probes", || async {
            let finished = run(&site.dir, "admin-probe", &args).await;
            (!finished.stderr.contains("cannot connect")).then_some(finished)
        })
        .await;
        assert!(
            !said.status.success(),
            "ready while the kubelet holds the port"
        );
        assert_contains(&said.stderr, "waiting for --listen-address");
        drop(kubelet);
    };
    let (new, ()) = tokio::join!(new, wait);
    assert_eq!(new.addr(), addr);
}

#[tokio::test]
async fn an_asker_that_does_not_speak_the_handover_protocol_gets_nothing_and_is_counted() {
    let site = ProcessSpec::new("garbled-asker").prepare().await;
    let handover = handover_directory(&site.dir, 0o700);
    let admin_socket = site.dir.path().join("admin.sock");
    let flags = [
        format!("--handover-socket={}", handover.display()),
        format!("--admin-socket={}", admin_socket.display()),
    ];
    let old = site.start("old", &flags).await;
    // Something of the proxy's user that asks for anything but the handover.
    let mut asker = tokio::net::UnixStream::connect(&handover).await.unwrap();
    asker.write_all(b"GET / HTTP/1.1\n").await.unwrap();
    let mut answer = Vec::new();
    asker.read_to_end(&mut answer).await.unwrap();
    assert!(answer.is_empty(), "answered {answer:?}");
    let failures = || async {
        let args = vec![
            "admin-probe".to_owned(),
            format!("--admin-socket={}", admin_socket.display()),
            "/metrics".to_owned(),
        ];
        let metrics = run(&site.dir, "admin-probe", &args).await.stdout;
        crate::support::metrics::total(
            &metrics,
            "kubelet_auth_proxy_handover_failures_total",
            &[("cause", "protocol")],
        )
    };
    eventually("the failure counted", || async {
        (failures().await == 1.0).then_some(())
    })
    .await;

    // A real successor still gets the sockets.
    let new_socket = site.dir.path().join("new.sock");
    let new = site
        .start(
            "new",
            &[
                format!("--handover-socket={}", handover.display()),
                format!("--admin-socket={}", new_socket.display()),
            ],
        )
        .await;
    assert_eq!(new.addr(), old.addr());
    assert_contains(&new.stderr(), "listening sockets handed over");
}
