//! The audit log (`--audit-log-path`): one `audit.k8s.io/v1` Event per request in
//! kube-apiserver's shape, its `auditID` the response's `Audit-Id`; refusals before
//! authentication without a user; an exec session at its start and at its end; no bearer token
//! ever written; everything flushed at shutdown, to a file and (with the binary) to stdout.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use http::StatusCode;
use serde_json::{Value, json};

use crate::support::apiserver::{ApiServer, TokenUser};
use crate::support::client::{H2_AND_HTTP1, Identity, Reply, bearer, empty, plain_get, request};
use crate::support::harness::{NODE_NAME, ProxySpec, Subject, grant};
use crate::support::pki::{CertSpec, sha256_hex};
use crate::support::process::ProcessSpec;
use crate::support::streams::{EXEC_PROTOCOL, EXEC_TARGET, ExecSession, WEBSOCKET_TOKEN_PREFIX};
use crate::support::{TempDir, eventually};

/// The events in an audit log, one JSON object per line; panics on a line that is not one.
fn events_in(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        })
        .collect()
}

fn events(path: &Path) -> Vec<Value> {
    events_in(&std::fs::read_to_string(path).unwrap_or_default())
}

/// The response's `Audit-Id`, checked to be a UUID version 4 as kube-apiserver's.
fn audit_id(reply: &Reply) -> String {
    let id = reply
        .header("audit-id")
        .unwrap_or_else(|| panic!("no Audit-Id on a {} response", reply.status))
        .to_owned();
    assert_uuid(&id);
    id
}

fn assert_uuid(id: &str) {
    let groups: Vec<&str> = id.split('-').collect();
    assert_eq!(
        groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12],
        "{id}"
    );
    assert!(
        id.chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{id}"
    );
    assert!(groups[2].starts_with('4'), "version 4: {id}");
}

/// `t` as kube-apiserver writes audit timestamps: RFC 3339, UTC, microseconds.
fn micro_time(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap();
    let secs = since.as_secs();
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_micros()
    )
}

/// Checks the two timestamps (format, order, within `[start, end]`) and removes them, so that
/// the rest of the event can be compared whole.
fn take_timestamps(event: &mut Value, start: &str, end: &str) -> (String, String) {
    let object = event.as_object_mut().unwrap();
    let mut take = |name: &str| -> String {
        let value = object
            .remove(name)
            .unwrap_or_else(|| panic!("no {name}"))
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(value.len(), "2006-01-02T15:04:05.000000Z".len(), "{value}");
        assert!(
            value.ends_with('Z') && value.as_bytes()[10] == b'T',
            "{value}"
        );
        value
    };
    let received = take("requestReceivedTimestamp");
    let stage = take("stageTimestamp");
    // Same fixed-width format: text order is time order.
    assert!(
        start <= received.as_str() && received <= stage && stage.as_str() <= end,
        "{start} <= {received} <= {stage} <= {end}"
    );
    (received, stage)
}

/// The event with this ID (and stage), from `events`.
fn event_of<'a>(events: &'a [Value], id: &str, stage: &str) -> Option<&'a Value> {
    events
        .iter()
        .find(|e| e["auditID"] == id && e["stage"] == stage)
}

#[tokio::test]
async fn every_request_is_one_audit_event_named_by_the_audit_id_header() {
    let audit = TempDir::new("audit");
    let log = audit.path().join("audit.log");
    let h = ProxySpec::new(&[
        "--authorization-mode=Policy",
        &format!("--audit-log-path={}", log.display()),
    ])
    .policy(&grant(
        "pods-reader",
        &["nodes/pods"],
        &["get"],
        &[Subject::User("alice")],
    ))
    .start()
    .await;
    let alice_cert = h.ca.issue(&CertSpec::client("alice"));
    let alice = h.client(Identity::of(&alice_cert));
    let alice_http1 = h.http1_client(Identity::of(&alice_cert));
    let start = micro_time(SystemTime::now());

    let allowed = alice
        .send(
            request("GET", "/pods?labelSelector=app%3Dweb")
                .header("user-agent", "audit-e2e/1.0")
                .body(empty())
                .unwrap(),
        )
        .await;
    assert_eq!(allowed.status, StatusCode::OK);
    let allowed_http1 = alice_http1.get("/pods").await;
    assert_eq!(allowed_http1.status, StatusCode::OK);
    let forbidden = alice.get("/logs/messages").await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let unauthenticated = h.anonymous().get("/pods").await;
    assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);
    let redirected = h.anonymous().get("/stats/../pods").await;
    assert_eq!(redirected.status, StatusCode::MOVED_PERMANENTLY);
    let replies = [
        &allowed,
        &allowed_http1,
        &forbidden,
        &unauthenticated,
        &redirected,
    ];
    let ids: Vec<String> = replies.iter().map(|r| audit_id(r)).collect();
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len());

    // Read right after shutdown, without waiting: the events were flushed by then.
    h.shutdown().await;
    let end = micro_time(SystemTime::now());
    let mut events = events(&log);
    assert_eq!(
        events.len(),
        replies.len(),
        "one event per request: {events:#?}"
    );
    for event in &mut events {
        take_timestamps(event, &start, &end);
    }
    let find = |id: &str| event_of(&events, id, "ResponseComplete").unwrap().clone();

    let alice_user = json!({
        "username": "alice",
        "groups": ["system:authenticated"],
        "extra": {
            "authentication.kubernetes.io/credential-id":
                [format!("X509SHA256={}", sha256_hex(alice_cert.leaf()))]
        }
    });
    let node = |subresource: &str| json!({"resource": "nodes", "name": NODE_NAME, "apiVersion": "v1", "subresource": subresource});
    let allow = json!({
        "authorization.k8s.io/decision": "allow",
        "authorization.k8s.io/reason":
            "RBAC: allowed by ClusterRoleBinding \"pods-reader\" of ClusterRole \"pods-reader\" to User \"alice\""
    });
    assert_eq!(
        find(&ids[0]),
        json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "auditID": ids[0],
            "stage": "ResponseComplete",
            "requestURI": "/pods?labelSelector=app%3Dweb",
            "verb": "get",
            "user": alice_user,
            "sourceIPs": ["127.0.0.1"],
            "userAgent": "audit-e2e/1.0",
            "objectRef": node("pods"),
            "responseStatus": {"metadata": {}, "code": 200},
            "annotations": allow,
        })
    );
    // Field order is kube-apiserver's, whatever serde_json's map does with it.
    let line = std::fs::read_to_string(&log).unwrap();
    let first = line.lines().find(|l| l.contains(&ids[0])).unwrap();
    assert!(
        first.starts_with(&format!(
            r#"{{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"{}","stage":"ResponseComplete","requestURI":"#,
            ids[0]
        )),
        "{first}"
    );
    assert_eq!(
        find(&ids[1]),
        json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "auditID": ids[1],
            "stage": "ResponseComplete",
            "requestURI": "/pods",
            "verb": "get",
            "user": alice_user,
            "sourceIPs": ["127.0.0.1"],
            "objectRef": node("pods"),
            "responseStatus": {"metadata": {}, "code": 200},
            "annotations": allow,
        })
    );

    let forbid = find(&ids[2]);
    assert_eq!(forbid["responseStatus"]["code"], 403);
    assert_eq!(forbid["user"], alice_user);
    assert_eq!(
        (&forbid["verb"], &forbid["requestURI"]),
        (&json!("get"), &json!("/logs/messages"))
    );
    assert_eq!(forbid["objectRef"], node("log"));
    assert_eq!(
        forbid["annotations"]["authorization.k8s.io/decision"],
        "forbid"
    );
    assert!(
        !forbid["annotations"]["authorization.k8s.io/reason"]
            .as_str()
            .unwrap()
            .is_empty()
    );

    // Refused before authentication: no user, nothing authorized.
    for (id, code, uri) in [(&ids[3], 401, "/pods"), (&ids[4], 301, "/stats/../pods")] {
        assert_eq!(
            find(id),
            json!({
                "kind": "Event",
                "apiVersion": "audit.k8s.io/v1",
                "level": "Metadata",
                "auditID": id,
                "stage": "ResponseComplete",
                "requestURI": uri,
                "verb": "get",
                "user": {},
                "sourceIPs": ["127.0.0.1"],
                "responseStatus": {"metadata": {}, "code": code},
            })
        );
    }
}

#[tokio::test]
async fn an_exec_session_is_audited_when_it_starts_and_when_it_ends() {
    let audit = TempDir::new("audit-exec");
    let log = audit.path().join("audit.log");
    let h = ProxySpec::always_allow(&[&format!("--audit-log-path={}", log.display())])
        .start()
        .await;
    let alice = h.http1_user("alice");
    let mut session = ExecSession::open(&alice, EXEC_PROTOCOL).await;
    let id = session.headers["audit-id"].to_str().unwrap().to_owned();
    assert_uuid(&id);

    let log_path = log.as_path();
    let id_ref = id.as_str();
    let started = eventually("the ResponseStarted event", || async move {
        event_of(&events(log_path), id_ref, "ResponseStarted").cloned()
    })
    .await;
    // The session is open: it has started, it has not completed.
    session.echo(b"while the session is open").await;
    assert!(event_of(&events(&log), &id, "ResponseComplete").is_none());
    assert_eq!(started["responseStatus"]["code"], 101);
    assert_eq!(started["verb"], "create");
    assert_eq!(started["requestURI"], EXEC_TARGET);
    assert_eq!(started["user"]["username"], "alice");
    assert_eq!(started["objectRef"]["subresource"], "proxy");
    assert_eq!(
        started["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );

    session.close().await;
    let completed = eventually("the ResponseComplete event", || async move {
        event_of(&events(log_path), id_ref, "ResponseComplete").cloned()
    })
    .await;
    assert_eq!(
        completed["requestReceivedTimestamp"],
        started["requestReceivedTimestamp"]
    );
    assert!(completed["stageTimestamp"].as_str() >= started["stageTimestamp"].as_str());
    // Apart from stage and time, the two events say the same.
    let strip = |event: &Value| {
        let mut event = event.clone();
        let object = event.as_object_mut().unwrap();
        object.remove("stage");
        object.remove("stageTimestamp");
        event
    };
    assert_eq!(strip(&completed), strip(&started));
    h.shutdown().await;
    assert_eq!(events(&log).len(), 2, "two events for the one session");
}

#[tokio::test]
async fn bearer_tokens_never_reach_the_audit_log() {
    const TOKEN: &str = "tok-audit-secret-5f2b9c";
    const UNKNOWN: &str = "tok-nobody-issued-8d1e";
    let api = ApiServer::start().await;
    api.add_token(TOKEN, TokenUser::new("bob").groups(&["ops"]));
    let audit = TempDir::new("audit-tokens");
    let log = audit.path().join("audit.log");
    let h = ProxySpec::new(&[
        "--authentication-token-webhook",
        "--authorization-mode=AlwaysAllow",
        &format!("--audit-log-path={}", log.display()),
    ])
    .apiserver(&api)
    .start()
    .await;
    let with_token = h.anonymous().send(bearer("/pods", TOKEN)).await;
    assert_eq!(with_token.status, StatusCode::OK);
    let rejected = h.anonymous().send(bearer("/pods", UNKNOWN)).await;
    assert_eq!(rejected.status, StatusCode::UNAUTHORIZED);
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(TOKEN);
    let websocket = h.http1_client(Identity::None);
    let mut session = ExecSession::open(
        &websocket,
        &format!("{EXEC_PROTOCOL}, {WEBSOCKET_TOKEN_PREFIX}{encoded}"),
    )
    .await;
    session.echo(b"as bob").await;
    session.close().await;
    let ids = [audit_id(&with_token), audit_id(&rejected)];
    h.shutdown().await;

    let text = std::fs::read_to_string(&log).unwrap();
    for secret in [
        TOKEN,
        UNKNOWN,
        encoded.as_str(),
        "Bearer",
        "base64url.bearer",
    ] {
        assert!(
            !text.contains(secret),
            "{secret:?} is in the audit log:\n{text}"
        );
    }
    let events = events_in(&text);
    assert_eq!(events.len(), 4, "{events:#?}");
    let bob = json!({"username": "bob", "groups": ["ops", "system:authenticated"]});
    assert_eq!(
        event_of(&events, &ids[0], "ResponseComplete").unwrap()["user"],
        bob
    );
    assert_eq!(
        event_of(&events, &ids[1], "ResponseComplete").unwrap()["user"],
        json!({})
    );
    let session_events: Vec<&Value> = events
        .iter()
        .filter(|e| e["requestURI"] == EXEC_TARGET)
        .collect();
    assert_eq!(session_events.len(), 2);
    assert!(session_events.iter().all(|e| e["user"] == bob));
}

#[tokio::test]
async fn the_binary_writes_audit_events_to_stdout_and_flushes_them_at_sigterm() {
    let site = ProcessSpec::new("audit-stdout")
        .config("auditLogPath: \"-\"\n")
        .prepare()
        .await;
    let mut proxy = site.start("proxy", &[]).await;
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
    let anonymous = site.anonymous(proxy.addr());
    let replies = [
        alice.get("/pods").await,
        anonymous.get("/pods").await,
        anonymous.get("/stats/../pods").await,
    ];
    let codes: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(codes, [200, 401, 301]);
    let ids: BTreeSet<String> = replies.iter().map(audit_id).collect();
    assert_eq!(
        plain_get(proxy.admin_addr(), "/readyz").await.status,
        StatusCode::OK
    );

    proxy.terminate();
    let status = proxy.wait().await;
    assert_eq!(status.code(), Some(0), "{}", proxy.stderr());
    // Nothing but audit events on stdout, all of them there once the process has exited.
    let events = events_in(&proxy.stdout());
    let logged: BTreeSet<String> = events
        .iter()
        .map(|e| e["auditID"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(logged, ids);
    assert!(
        events
            .iter()
            .all(|e| e["kind"] == "Event" && e["apiVersion"] == "audit.k8s.io/v1")
    );
}
