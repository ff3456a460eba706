//! Graceful shutdown under live traffic, in process (`RunningProxy::shutdown`) and with the real
//! binary (SIGTERM): `/readyz` turns 503 while draining, requests already in flight (held inside
//! the proxy, so they are in flight for certain) finish normally, new connections are refused once
//! the listener is closed, and the proxy stops; streams that outlive the grace period (an exec
//! session, a followed log) keep working during it and are closed at its end. Under systemd the
//! binary reports `READY=1` once serving and `STOPPING=1` when draining begins.

use std::net::SocketAddr;
use std::time::Instant;

use http::StatusCode;
use tokio::net::{TcpStream, UnixDatagram};

use crate::support::apiserver::{ApiServer, Kind};
use crate::support::client::{H2_AND_HTTP1, HTTP1_ONLY, Reply, empty, plain_get, request};
use crate::support::harness::ProxySpec;
use crate::support::process::ProcessSpec;
use crate::support::streams::{EXEC_PROTOCOL, ExecSession, FollowedLog, large_body};
use crate::support::{eventually, within};

/// Waits until the admin listener answers `/readyz` with 503.
async fn wait_until_not_ready(admin: SocketAddr) {
    eventually("/readyz turns 503", || async move {
        let reply = plain_get(admin, "/readyz").await;
        (reply.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
}

/// Waits until connecting to `addr` is refused: the listener is closed.
async fn wait_until_refused(addr: SocketAddr) {
    eventually("new connections are refused", || async move {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish_and_refuses_new_connections() {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 128;
    let api = ApiServer::start_allowing().await;
    let h = ProxySpec::new(&[
        "--authorization-mode=Webhook",
        "--shutdown-grace-period=30s",
        "--apiserver-request-timeout=30s",
    ])
    .apiserver(&api)
    .start()
    .await;
    let (addr, admin) = (h.addr(), h.admin_addr());

    // In flight before shutdown: a followed log, and two long-lived connections already used.
    let mut log = FollowedLog::open(&h.user("follower", &[])).await;
    log.lines(1).await;
    let mut open_connections = Vec::new();
    for (name, alpn) in [("pat-h2", H2_AND_HTTP1), ("pat-h1", HTTP1_ONLY)] {
        let mut conn = h.user_offering(name, alpn).connect().await.unwrap();
        let response = conn
            .send(request("GET", "/healthz").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(Reply::read(response).await.unwrap().status, StatusCode::OK);
        open_connections.push(conn);
    }

    // Requests held inside the proxy (their SubjectAccessReviews wait at the API server): new
    // connections in both protocols, the open connections, and a large upload.
    let gate = api.hold(Kind::SubjectAccessReview);
    let arrived = api.arrivals(Kind::SubjectAccessReview);
    let mut held = Vec::new();
    for (name, alpn) in [("fresh-h2", H2_AND_HTTP1), ("fresh-h1", HTTP1_ONLY)] {
        let client = h.user_offering(name, alpn);
        held.push(tokio::spawn(async move {
            client
                .try_send(request("GET", "/pods").body(empty()).unwrap())
                .await
                .map_err(|e| e.to_string())
        }));
    }
    for mut conn in open_connections {
        held.push(tokio::spawn(async move {
            let response = conn
                .send(request("GET", "/stats/summary").body(empty()).unwrap())
                .await
                .map_err(|e| e.to_string())?;
            Reply::read(response).await.map_err(|e| e.to_string())
        }));
    }
    let uploader = h.user_offering("uploader", H2_AND_HTTP1);
    let (body, feeder) = large_body(CHUNK, CHUNKS);
    let upload = tokio::spawn(async move {
        uploader
            .try_send(
                request("POST", "/run/ns/pod/ctr?cmd=cat")
                    .body(body)
                    .unwrap(),
            )
            .await
            .map_err(|e| e.to_string())
    });
    api.wait_for_arrivals(Kind::SubjectAccessReview, arrived + held.len() + 1)
        .await;

    let draining = async {
        wait_until_not_ready(admin).await;
        wait_until_refused(addr).await;
        // Still streaming while the proxy drains.
        log.lines(5).await;
        gate.release();
        let mut completed = 0;
        for request in held {
            let reply = within("a held request", request)
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("an in-flight request failed: {e}"));
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            completed += 1;
        }
        let echo = within("the upload", upload)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the in-flight upload failed: {e}"))
            .echo();
        within("the body feeder", feeder).await.unwrap();
        assert_eq!(echo.body_bytes(), (CHUNK * CHUNKS) as u64);
        println!(
            "in-process shutdown: {} in-flight requests and a {} byte upload completed, 0 failed",
            completed + 1,
            CHUNK * CHUNKS
        );
        // The caller ends the followed log; nothing else keeps the proxy.
        drop(log);
    };
    tokio::join!(h.shutdown(), draining);
    // Everything is closed once shutdown returns, the admin listener included.
    wait_until_refused(admin).await;
}

#[tokio::test]
async fn streams_work_through_the_grace_period_and_are_closed_at_its_end() {
    let h = ProxySpec::always_allow(&["--shutdown-grace-period=2s"])
        .start()
        .await;
    let (addr, admin) = (h.addr(), h.admin_addr());
    let mut session = ExecSession::open(&h.http1_user("alice"), EXEC_PROTOCOL).await;
    session.echo(b"before shutdown").await;
    let mut log = FollowedLog::open(&h.user("follower", &[])).await;
    log.lines(1).await;

    let draining = async {
        wait_until_not_ready(admin).await;
        session.echo(b"during the grace period").await;
        log.lines(2).await;
        wait_until_refused(addr).await;
    };
    // The stand-in kubelet stays up: only the proxy can end the streams.
    let (_kubelet, ()) = tokio::join!(h.shutdown_proxy_only(), draining);
    // The grace period is over: what was still open is closed.
    session.closed().await;
    log.ended().await;
}

#[tokio::test]
async fn streams_cut_at_the_end_of_the_grace_period_end_in_an_error_not_a_clean_end() {
    let h = ProxySpec::always_allow(&["--shutdown-grace-period=1s"])
        .start()
        .await;
    let _addr = h.addr();
    let mut session = ExecSession::open(&h.http1_user("alice"), EXEC_PROTOCOL).await;
    session.echo(b"before shutdown").await;
    let mut logs = Vec::new();
    for (name, alpn) in [("h1-follower", HTTP1_ONLY), ("h2-follower", H2_AND_HTTP1)] {
        let mut log = FollowedLog::open(&h.user_offering(name, alpn)).await;
        log.lines(1).await;
        logs.push((name, log));
    }
    // The stand-in kubelet stays up: only the proxy ends the streams, at the grace period's end.
    let _kubelet = h.shutdown_proxy_only().await;
    for (name, mut log) in logs {
        assert!(
            log.cut().await,
            "{name}: the cut log ended like a finished one"
        );
    }
    assert!(
        session.cut().await,
        "the cut exec session ended like a closed one"
    );
}

#[tokio::test]
async fn sigterm_drains_the_binary_which_exits_0() {
    let site = ProcessSpec::new("sigterm")
        .config("shutdownGracePeriod: 2s\n")
        .prepare()
        .await;
    let mut proxy = site.start("proxy", &[]).await;
    let (addr, admin) = (proxy.addr(), proxy.admin_addr());
    let alice = site.client(addr, "alice", H2_AND_HTTP1);
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    assert_eq!(plain_get(admin, "/readyz").await.status, StatusCode::OK);
    let mut session =
        ExecSession::open(&site.client(addr, "alice", HTTP1_ONLY), EXEC_PROTOCOL).await;
    session.echo(b"before SIGTERM").await;
    let mut log = FollowedLog::open(&alice).await;
    log.lines(1).await;

    proxy.terminate();
    let terminated = Instant::now();
    wait_until_not_ready(admin).await;
    session.echo(b"during the grace period").await;
    log.lines(2).await;
    wait_until_refused(addr).await;
    session.closed().await;
    log.ended().await;
    let status = proxy.wait().await;
    assert_eq!(status.code(), Some(0), "{}", proxy.stderr());
    println!(
        "SIGTERM with an exec session and a followed log open: exited 0 after {:?} (grace period 2s)",
        terminated.elapsed()
    );
}

/// The next datagram on the notification socket, as text (bounded).
async fn notification(socket: &UnixDatagram) -> String {
    let mut buffer = [0u8; 1024];
    let n = within("a notification to systemd", socket.recv(&mut buffer))
        .await
        .unwrap();
    String::from_utf8(buffer[..n].to_vec()).unwrap()
}

#[tokio::test]
async fn systemd_is_told_ready_once_serving_and_stopping_at_sigterm() {
    let site = ProcessSpec::new("notify").prepare().await;
    let socket_path = site.dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let mut proxy = site
        .start_with_env("proxy", &[], &[("NOTIFY_SOCKET", socket_path.as_os_str())])
        .await;

    let ready = notification(&socket).await;
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    // Ready means serving: a request right away is answered.
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);

    proxy.terminate();
    let stopping = notification(&socket).await;
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(!stopping.lines().any(|l| l == "READY=1"), "{stopping:?}");
    assert_eq!(proxy.wait().await.code(), Some(0), "{}", proxy.stderr());
}
