//! The audit log cannot be used to fill a disk or to erase evidence: every event is at most
//! `--audit-log-truncate-max-event-size` (a longer `requestURI` is cut and the event annotated
//! `audit.k8s.io/truncated`, as kube-apiserver's truncating backend does); events of requests
//! refused before authentication are written at most 20 a second after a burst of 200, the rest
//! counted; and an exec is refused while its event cannot be written.

use http::StatusCode;
use serde_json::Value;

use crate::support::TempDir;
use crate::support::client::{Client, empty, request};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::streams::{EXEC_PROTOCOL, EXEC_TARGET, ExecSession};

const SUPPRESSED: &str = "kubelet_auth_proxy_audit_events_suppressed_total";
/// `--audit-log-truncate-max-event-size` here (the default is 16384).
const MAX_EVENT: usize = 4096;

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_flood_of_unauthenticated_requests_with_long_uris_is_bounded_and_an_exec_still_recorded()
{
    let dir = TempDir::new("audit-flood");
    let log = dir.path().join("audit.log");
    let h = ProxySpec::always_allow(&[
        &format!("--audit-log-path={}", log.display()),
        "--audit-log-truncate-max-event-size=4096",
    ])
    .start()
    .await;
    // 8 KB of query on every request (as long as the proxy's header limits allow is longer still),
    // from one client with no credential.
    let long = format!("/pods?q={}", "a".repeat(8_000));
    let nobody = h.anonymous();
    let flood = 600;
    let mut conn = nobody.connect().await.unwrap();
    let started = std::time::Instant::now();
    for _ in 0..flood {
        let response = conn
            .send(request("GET", &long).body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // Then an exec by an authenticated user.
    let alice = h.http1_user("alice");
    let session = ExecSession::open(&alice, EXEC_PROTOCOL).await;
    let id = session.headers["audit-id"].to_str().unwrap().to_owned();
    session.close().await;

    let log_path = log.as_path();
    let id_ref = id.as_str();
    eventually("the exec's events in the log", || async move {
        let found = lines(log_path)
            .iter()
            .filter(|line| line.contains(id_ref))
            .count();
        (found == 2).then_some(())
    })
    .await;
    let written = lines(&log);
    let refusals: Vec<Value> = written
        .iter()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|event| event["responseStatus"]["code"] == 401)
        .collect();
    // The burst of 200 and 20 a second for as long as the flood lasted; the rest suppressed.
    let allowed = 200 + 20 * (started.elapsed().as_secs() as usize + 1);
    assert!(
        refusals.len() <= allowed.min(flood - 1),
        "{} of {flood} written, at most {allowed}",
        refusals.len()
    );
    assert!(refusals.len() >= 200, "{} written", refusals.len());
    let suppressed = h.metric(SUPPRESSED, &[]).await as usize;
    assert_eq!(suppressed + refusals.len(), flood);
    for line in &written {
        assert!(line.len() <= MAX_EVENT, "an event of {} bytes", line.len());
    }
    let first = &refusals[0];
    assert_eq!(first["annotations"]["audit.k8s.io/truncated"], "true");
    let uri = first["requestURI"].as_str().unwrap();
    assert!(
        uri.starts_with("/pods?q=aaaa") && uri.ends_with("...TRUNCATED"),
        "{uri}"
    );
    // The exec's events are whole.
    let exec: Vec<Value> = written
        .iter()
        .filter(|line| line.contains(&id))
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(exec[0]["requestURI"], EXEC_TARGET);
    assert!(
        exec[0]["annotations"]
            .get("audit.k8s.io/truncated")
            .is_none()
    );
    h.shutdown().await;
}

/// The proxy writing its audit log to /dev/full (every write fails with ENOSPC: a full disk),
/// with `extra` flags, once a failed write has been noticed; and alice, over HTTP/1.1.
async fn unauditable(extra: &[&str]) -> (Harness, Client) {
    let mut args = vec![
        "--authorization-mode=AlwaysAllow",
        "--audit-log-path=/dev/full",
    ];
    args.extend_from_slice(extra);
    let h = ProxySpec::new(&args).start().await;
    let alice = h.http1_user("alice");
    // A plain request is served; its event is lost and counted.
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    eventually("the failed write noticed", || async {
        (h.metric("kubelet_auth_proxy_audit_events_dropped_total", &[])
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    (h, alice)
}

#[tokio::test]
async fn an_exec_is_refused_while_its_audit_event_cannot_be_written() {
    let (h, alice) = unauditable(&[]).await;
    let refused = alice
        .send(
            request("GET", EXEC_TARGET)
                .header("connection", "Upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-protocol", EXEC_PROTOCOL)
                .body(empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert!(refused.text().contains("--audit-log-require-for-streams"));
    h.shutdown().await;
}

#[tokio::test]
async fn with_the_requirement_off_an_unauditable_exec_is_served() {
    let (h, alice) = unauditable(&["--audit-log-require-for-streams=false"]).await;
    let session = ExecSession::open(&alice, EXEC_PROTOCOL).await;
    session.close().await;
    h.shutdown().await;
}
