//! The audit log cannot be used to fill a disk or to erase evidence: every event is at most
//! `--audit-log-truncate-max-event-size` (cut step by step: URI, extra, groups, User-Agent, a
//! minimal form; never dropped); audit bytes are budgeted per identity and overall so that a
//! flood by any identities cannot rotate an earlier exec out of the kept files, what is not
//! written being counted and summarized per identity; and an exec is refused while its event
//! cannot be written.

use std::collections::BTreeMap;
use std::path::Path;

use http::StatusCode;
use serde_json::Value;

use crate::support::TempDir;
use crate::support::client::{Client, Identity, empty, request};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec, Subject, grant};
use crate::support::pki::CertSpec;
use crate::support::streams::{EXEC_PROTOCOL, EXEC_TARGET, ExecSession};

const SUPPRESSED: &str = "kubelet_auth_proxy_audit_events_suppressed_total";
/// Kept bytes in the flood test: --audit-log-maxsize=1 (MiB) × --audit-log-maxbackup=1.
const KEPT: usize = 1024 * 1024;

/// Every event in the audit files of `dir` (the current file and its backups).
pub(crate) fn events(dir: &Path) -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("audit")
        })
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            std::fs::read_to_string(path)
                .unwrap()
                .lines()
                .map(|line| serde_json::from_str::<Value>(line).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How many events in `dir` carry `id`.
fn with_id(dir: &Path, id: &str) -> usize {
    events(dir).iter().filter(|e| e["auditID"] == id).count()
}

/// Opens an exec as `client` and closes it; waits for its two events; returns its audit ID.
async fn exec(client: &Client, dir: &Path) -> String {
    let session = ExecSession::open(client, EXEC_PROTOCOL).await;
    let id = session.headers["audit-id"].to_str().unwrap().to_owned();
    session.close().await;
    let id_ref = id.as_str();
    eventually("the exec's two events in the log", || async move {
        (with_id(dir, id_ref) == 2).then_some(())
    })
    .await;
    id
}

/// Sends `count` requests for `target` on one connection, each answered `status`.
async fn flood(client: Client, target: String, count: usize, status: StatusCode) {
    let mut conn = client.connect().await.unwrap();
    for _ in 0..count {
        let response = conn
            .send(request("GET", &target).body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), status);
    }
}

#[tokio::test]
async fn floods_by_many_identities_of_refused_and_allowed_long_uris_leave_an_earlier_exec_in_the_kept_files()
 {
    let dir = TempDir::new("audit-floods");
    let log = dir.path().join("audit.log");
    // 1 MiB kept; the budget set to keep it an hour, so the flood below (many times 1 MiB) is
    // held to a few hundred KB without the test lasting long.
    let h = ProxySpec::new(&[
        "--authorization-mode=Policy",
        &format!("--audit-log-path={}", log.display()),
        "--audit-log-maxsize=1",
        "--audit-log-maxbackup=1",
        "--audit-log-flood-retention=1h",
    ])
    .policy(&format!(
        "{}---\n{}",
        grant(
            "exec",
            &["nodes/proxy"],
            &["get", "create"],
            &[Subject::User("alice")]
        ),
        grant(
            "health",
            &["nodes/healthz"],
            &["get"],
            &[Subject::Group("probes")]
        ),
    ))
    .start()
    .await;
    let alice = h.http1_user("alice");
    let id = exec(&alice, dir.path()).await;

    // 15 KB of query on every request; per identity 150 requests.
    let long = format!("?q={}", "a".repeat(15_000));
    let per_identity = 150;
    let mut floods = tokio::task::JoinSet::new();
    for i in 0..4 {
        let nobody = h.user(&format!("nobody-{i}"), &[]);
        let target = format!("/pods{long}");
        floods.spawn(flood(nobody, target, per_identity, StatusCode::FORBIDDEN));
        let probe = h.user(&format!("probe-{i}"), &["probes"]);
        let target = format!("/healthz{long}");
        floods.spawn(flood(probe, target, per_identity, StatusCode::OK));
    }
    let target = format!("/pods{long}");
    floods.spawn(flood(
        h.anonymous(),
        target,
        per_identity,
        StatusCode::UNAUTHORIZED,
    ));
    for done in floods.join_all().await {
        let () = done;
    }
    let sent = 9 * per_identity;

    // The exec's events are still in the kept files.
    assert_eq!(with_id(dir.path(), &id), 2);
    let authenticated = h.metric(SUPPRESSED, &[("authenticated", "true")]).await as usize;
    let unauthenticated = h.metric(SUPPRESSED, &[("authenticated", "false")]).await as usize;
    assert!(
        authenticated > 0 && unauthenticated > 0,
        "{authenticated} {unauthenticated}"
    );
    h.shutdown().await;

    let all = events(dir.path());
    assert!(
        all.iter().any(|e| e["auditID"] == id.as_str()),
        "the exec survives shutdown"
    );
    let written = all
        .iter()
        .filter(|e| e["requestURI"].as_str().unwrap_or("").contains("?q=aaa"))
        .count();
    // Summary events: one identity each (at close, none having had one a minute earlier).
    let mut summaries: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for event in all.iter().filter(|e| {
        e["annotations"]
            .get("kubelet-auth-proxy.io/suppressed-events")
            .is_some()
    }) {
        let annotations = &event["annotations"];
        let number = |key: &str| annotations[key].as_str().unwrap().parse::<usize>().unwrap();
        let identity = annotations["kubelet-auth-proxy.io/suppressed-identity"]
            .as_str()
            .unwrap()
            .to_owned();
        let entry = summaries.entry(identity).or_default();
        entry.0 += number("kubelet-auth-proxy.io/suppressed-events");
        entry.1 += number("kubelet-auth-proxy.io/suppressed-bytes");
    }
    let names: Vec<&str> = summaries.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "(unauthenticated)",
            "nobody-0",
            "nobody-1",
            "nobody-2",
            "nobody-3",
            "probe-0",
            "probe-1",
            "probe-2",
            "probe-3"
        ]
    );
    let suppressed: usize = summaries.values().map(|(events, _)| events).sum();
    assert_eq!(suppressed, authenticated + unauthenticated);
    assert_eq!(written + suppressed, sent);
    // Without the budget the flood would have rotated the exec out several times over.
    let suppressed_bytes: usize = summaries.values().map(|(_, bytes)| bytes).sum();
    assert!(
        suppressed_bytes > 4 * KEPT,
        "{suppressed_bytes} bytes suppressed"
    );
}

#[tokio::test]
async fn an_exec_by_a_user_with_451_groups_is_audited_with_its_groups_cut() {
    let dir = TempDir::new("audit-groups");
    let log = dir.path().join("audit.log");
    let h = ProxySpec::always_allow(&[&format!("--audit-log-path={}", log.display())])
        .start()
        .await;
    // 451 groups of 40 bytes: 18 KB of names, more than the default 16384-byte bound.
    let groups: Vec<String> = (0..451)
        .map(|i| format!("team-{i:03}-{}", "x".repeat(31)))
        .collect();
    let spec = groups
        .iter()
        .fold(CertSpec::client("crowded"), |spec, group| spec.org(group));
    let crowded = h.http1_client(Identity::of(&h.ca.issue(&spec)));
    let id = exec(&crowded, dir.path()).await;
    h.shutdown().await;

    let exec: Vec<Value> = events(dir.path())
        .into_iter()
        .filter(|e| e["auditID"] == id.as_str())
        .collect();
    let stages: Vec<&str> = exec.iter().map(|e| e["stage"].as_str().unwrap()).collect();
    assert_eq!(stages, ["ResponseStarted", "ResponseComplete"]);
    for event in &exec {
        assert_eq!(event["user"]["username"], "crowded");
        assert_eq!(event["requestURI"], EXEC_TARGET);
        let kept = event["user"]["groups"].as_array().unwrap();
        assert!(kept.len() > 100 && kept.len() < 451, "{} kept", kept.len());
        assert_eq!(kept[0], groups[0].as_str());
        assert_eq!(
            event["annotations"]["kubelet-auth-proxy.io/groups-truncated"],
            format!("{} of 452 groups kept", kept.len())
        );
        assert!(serde_json::to_string(event).unwrap().len() <= 16384);
    }
}

/// The proxy writing its audit log to /dev/full (every write fails with ENOSPC: a full disk),
/// with `extra` flags, once a failed write has been noticed; and alice, over HTTP/1.1.
async fn unauditable(extra: &[&str]) -> (Harness, Client) {
    let h = ProxySpec::always_allow(&["--audit-log-path=/dev/full"])
        .args(extra)
        .start()
        .await;
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
