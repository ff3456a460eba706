//! The audit log's unit tests: the JSON of an event byte for byte, truncation, the writer's
//! batching and losses, and rotation.

use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;
use uuid::Uuid;

use super::json::*;
use super::rotate::*;
use super::writer::*;
use super::*;
use crate::authn::User;
use crate::authz::Reason;
use crate::test_fixtures::certificate_user;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::sync::mpsc as std_mpsc;

use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

/// Options rotating at 1 MiB and keeping `max_backups` backups (0: every one).
fn rotating(max_backups: u32) -> AuditOptions {
    AuditOptions {
        rotation: Rotation {
            max_size_mb: 1,
            max_backups,
        },
        max_event_size: None,
        flood_retention: None,
    }
}

/// Closes `log`, which must have written everything within [`WAIT`].
async fn close(log: AuditLog) {
    tokio::time::timeout(WAIT, log.close()).await.unwrap();
}

/// One test's audit log file: `audit.log` in a fresh, empty directory of the test's own, removed
/// when the test ends, and the counter of the events its logs drop.
struct LogFile {
    dir: PathBuf,
    path: PathBuf,
    dropped: Counter,
}

impl LogFile {
    fn new(test: &str) -> LogFile {
        let dir = std::env::temp_dir().join(format!(
            "kubelet-auth-proxy-audit-{}-{test}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        LogFile {
            path: dir.join("audit.log"),
            dir,
            dropped: Counter::default(),
        }
    }

    /// The audit log writing to the file with `options`, which must open.
    fn open(&self, options: AuditOptions) -> AuditLog {
        let target = AuditTarget::File(self.path.clone());
        AuditLog::open(target, options, self.dropped.clone()).unwrap()
    }

    /// The `requestURI` of every line of the file, in order.
    fn uris(&self) -> Vec<String> {
        uris(&fs::read(&self.path).unwrap())
    }

    /// The permission bits of the file.
    fn mode(&self) -> u32 {
        fs::metadata(&self.path).unwrap().permissions().mode() & 0o777
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn at(secs: i64, nanos: u32) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nanos.into())
    }
}

fn node_user() -> User {
    let groups = ["system:nodes", "system:authenticated"];
    certificate_user("system:node:node-1", "9f6e1c2a", &groups, "X509SHA256=4f2a")
}

fn sample(uri: &str) -> AuditEvent {
    AuditEvent {
        id: AuditId(Uuid::from_bytes([
            0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x46, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ])),
        stage: Stage::ResponseComplete,
        request_uri: uri.parse().unwrap(),
        verb: "get",
        user: Some(Arc::new(node_user())),
        source_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)),
        user_agent: Some(HeaderValue::from_static("kubectl/v1.34.0 (linux/amd64)")),
        object_ref: Some(ObjectRef {
            resource: "nodes",
            namespace: None,
            subresource: "proxy",
            name: Arc::from("node-1"),
        }),
        response_code: 200,
        request_received: at(1_795_324_560, 123_456_789),
        stage_timestamp: at(1_795_324_560, 130_000_000),
        authorization: Some(Authorization::Allow(Reason::Static(
            "RBAC: allowed by ClusterRoleBinding \"node-proxier\"",
        ))),
        summary: None,
    }
}

fn line(event: &AuditEvent) -> String {
    let mut out = Vec::new();
    encode_line(event, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn parse(event: &AuditEvent) -> Value {
    let line = line(event);
    assert!(
        line.ends_with('\n') && line.matches('\n').count() == 1,
        "{line}"
    );
    serde_json::from_str(&line).unwrap()
}

/// The JSON of an event of [`sample`]: its kind, API version, level, ID and stage, then `fields`.
fn sample_json(fields: Value) -> Value {
    let mut event = json!({
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": "00112233-4455-4677-8899-aabbccddeeff",
        "stage": "ResponseComplete",
    });
    let Value::Object(fields) = fields else {
        panic!("event fields are an object: {fields}");
    };
    event.as_object_mut().unwrap().extend(fields);
    event
}

/// The `requestURI` of every line of a log, in order.
fn uris(log: &[u8]) -> Vec<String> {
    std::str::from_utf8(log)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["requestURI"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn event_serializes_as_a_kube_apiserver_metadata_event() {
    let event = sample("https://node-1:10250/logs/kubelet.log?tail=10");
    assert_eq!(
        parse(&event),
        sample_json(json!({
            "requestURI": "/logs/kubelet.log?tail=10",
            "verb": "get",
            "user": {
                "username": "system:node:node-1",
                "uid": "9f6e1c2a",
                "groups": ["system:nodes", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=4f2a"]}
            },
            "sourceIPs": ["10.0.0.7"],
            "userAgent": "kubectl/v1.34.0 (linux/amd64)",
            "objectRef": {
                "resource": "nodes",
                "name": "node-1",
                "apiVersion": "v1",
                "subresource": "proxy"
            },
            "responseStatus": {"metadata": {}, "code": 200},
            "requestReceivedTimestamp": "2026-11-22T05:16:00.123456Z",
            "stageTimestamp": "2026-11-22T05:16:00.130000Z",
            "annotations": {
                "authorization.k8s.io/decision": "allow",
                "authorization.k8s.io/reason": "RBAC: allowed by ClusterRoleBinding \"node-proxier\""
            }
        }))
    );
    // Go's field order, byte for byte.
    let keys = [
        "kind",
        "apiVersion",
        "level",
        "auditID",
        "stage",
        "requestURI",
        "verb",
        "user",
        "sourceIPs",
        "userAgent",
        "objectRef",
        "responseStatus",
        "requestReceivedTimestamp",
        "stageTimestamp",
        "annotations",
    ];
    let text = line(&event);
    let positions: Vec<usize> = keys
        .iter()
        .map(|k| text.find(&format!("\"{k}\":")).unwrap())
        .collect();
    assert!(positions.is_sorted(), "{text}");
    assert!(text.starts_with(
        r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"#
    ));
    assert!(text.contains(
        r#""objectRef":{"resource":"nodes","name":"node-1","apiVersion":"v1","subresource":"proxy"}"#
    ));
}

#[test]
fn event_before_authentication_has_an_empty_user_and_omits_empty_fields() {
    let event = AuditEvent {
        verb: "",
        user: None,
        user_agent: None,
        object_ref: None,
        response_code: 401,
        authorization: None,
        ..sample("/pods")
    };
    assert_eq!(
        parse(&event),
        sample_json(json!({
            "requestURI": "/pods",
            "verb": "",
            "user": {},
            "sourceIPs": ["10.0.0.7"],
            "responseStatus": {"metadata": {}, "code": 401},
            "requestReceivedTimestamp": "2026-11-22T05:16:00.123456Z",
            "stageTimestamp": "2026-11-22T05:16:00.130000Z"
        }))
    );
    // An empty User-Agent header is omitted too, as Go's omitempty does.
    let empty_agent = AuditEvent {
        user_agent: Some(HeaderValue::from_static("")),
        ..sample("/pods")
    };
    assert!(parse(&empty_agent).get("userAgent").is_none());
}

#[test]
fn user_fields_are_omitted_when_empty() {
    let no_uid_no_extra = User {
        uid: String::new(),
        extra: BTreeMap::new(),
        ..node_user()
    };
    let event = AuditEvent {
        user: Some(Arc::new(no_uid_no_extra)),
        ..sample("/pods")
    };
    assert_eq!(
        parse(&event)["user"],
        json!({"username": "system:node:node-1", "groups": ["system:nodes", "system:authenticated"]})
    );

    let anonymous = AuditEvent {
        user: Some(Arc::new(User::anonymous())),
        ..sample("/pods")
    };
    assert_eq!(
        parse(&anonymous)["user"],
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
    );
}

#[test]
fn authorization_annotations_match_kube_apiserver() {
    let cases = [
        (
            Authorization::Forbid(Reason::Static("no RBAC policy matched")),
            json!({
                "authorization.k8s.io/decision": "forbid",
                "authorization.k8s.io/reason": "no RBAC policy matched"
            }),
        ),
        (
            Authorization::Allow(Reason::Shared(Arc::from(""))),
            json!({"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": ""}),
        ),
        (
            Authorization::Error,
            json!({"authorization.k8s.io/reason": "internal error"}),
        ),
    ];
    for (authorization, expected) in cases {
        let event = AuditEvent {
            authorization: Some(authorization),
            ..sample("/pods")
        };
        assert_eq!(parse(&event)["annotations"], expected);
    }
}

#[test]
fn started_stream_events_have_their_stage_and_code() {
    let event = AuditEvent {
        stage: Stage::ResponseStarted,
        verb: "create",
        response_code: 101,
        ..sample("/exec/default/web/app?command=sh&stdin=true")
    };
    let v = parse(&event);
    assert_eq!(v["stage"], "ResponseStarted");
    assert_eq!(v["verb"], "create");
    assert_eq!(v["responseStatus"], json!({"metadata": {}, "code": 101}));
}

#[test]
fn strings_are_escaped_as_go_encoding_json_does() {
    let user = User {
        name: "<script>&\u{2028}\u{2029}\"\n\u{1}é".to_owned(),
        ..User::default()
    };
    let event = AuditEvent {
        user: Some(Arc::new(user)),
        ..sample("/run/ns/pod/c?cmd=ls&x=1")
    };
    let text = line(&event);
    assert!(
        text.contains(r#""username":"\u003cscript\u003e\u0026\u2028\u2029\"\n\u0001é""#),
        "{text}"
    );
    assert!(
        text.contains(r#""requestURI":"/run/ns/pod/c?cmd=ls\u0026x=1""#),
        "{text}"
    );
    let v = parse(&event);
    assert_eq!(v["user"]["username"], "<script>&\u{2028}\u{2029}\"\n\u{1}é");
}

#[test]
fn a_long_request_uri_is_cut_to_the_event_bound_and_annotated() {
    let short = sample("/pods?x=1");
    let mut out = Vec::new();
    encode_bounded(&short, 4096, &mut out).unwrap();
    assert_eq!(out, line(&short).into_bytes(), "short events are untouched");

    let mut long = sample(&format!("/pods?q={}é", "a".repeat(9000)));
    long.authorization = Some(Authorization::Allow(Reason::Static("allowed")));
    encode_bounded(&long, 4096, &mut out).unwrap();
    assert!(out.len() <= 4096, "{} bytes", out.len());
    let event: Value = serde_json::from_slice(&out).unwrap();
    let uri = event["requestURI"].as_str().unwrap();
    assert!(
        uri.starts_with("/pods?q=aaa") && uri.ends_with("...TRUNCATED"),
        "{uri}"
    );
    let annotations: Vec<&String> = event["annotations"].as_object().unwrap().keys().collect();
    assert_eq!(
        annotations,
        [
            "audit.k8s.io/truncated",
            "authorization.k8s.io/decision",
            "authorization.k8s.io/reason"
        ]
    );
    assert_eq!(event["annotations"]["audit.k8s.io/truncated"], "true");

    let huge_user = AuditEvent {
        user: Some(Arc::new(User {
            name: "u".repeat(8192),
            ..User::default()
        })),
        ..sample("/pods")
    };
    encode_bounded(&huge_user, 4096, &mut out).unwrap();
    let event: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        event["annotations"]["kubelet-auth-proxy.io/minimal"],
        "true"
    );
    assert!(out.len() <= 4096, "{} bytes", out.len());
}

/// A user with 451 groups of 40 bytes (18 KB) and long extra values.
fn crowded_user() -> User {
    User {
        name: "crowded".to_owned(),
        uid: "1".to_owned(),
        groups: (0..451)
            .map(|i| format!("group-{i:03}-{}", "g".repeat(30)))
            .collect(),
        extra: BTreeMap::from([(
            "scopes".to_owned(),
            vec!["s".repeat(3000), "t".repeat(3000)],
        )]),
    }
}

#[test]
fn an_event_too_large_is_cut_uri_then_extra_then_groups_never_dropped() {
    let mut out = Vec::new();
    let event = AuditEvent {
        user: Some(Arc::new(crowded_user())),
        ..sample(&format!(
            "/exec/ns/pod/ctr?command=sh&x={}",
            "a".repeat(5000)
        ))
    };
    encode_bounded(&event, 16384, &mut out).unwrap();
    assert!(out.len() <= 16384, "{} bytes", out.len());
    let v: Value = serde_json::from_slice(&out).unwrap();
    let annotations = &v["annotations"];
    assert_eq!(annotations["audit.k8s.io/truncated"], "true");
    assert_eq!(
        annotations["kubelet-auth-proxy.io/extra-truncated"],
        "2 values omitted"
    );
    let kept = v["user"]["groups"].as_array().unwrap().len();
    assert!(kept > 100 && kept < 451, "{kept} groups kept");
    assert_eq!(
        annotations["kubelet-auth-proxy.io/groups-truncated"],
        format!("{kept} of 451 groups kept")
    );
    assert_eq!(
        v["user"]["groups"][0],
        "group-000-gggggggggggggggggggggggggggggg"
    );
    assert!(v["user"].get("extra").is_none());
    assert_eq!(v["user"]["username"], "crowded");
    assert_eq!(v["userAgent"], "kubectl/v1.34.0 (linux/amd64)");
    assert!(annotations.get("kubelet-auth-proxy.io/minimal").is_none());
    // The annotations in Go's sorted order.
    let keys: Vec<&String> = annotations.as_object().unwrap().keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

#[test]
fn the_minimal_form_of_the_worst_event_fits_the_smallest_bound() {
    // Every string as long as allowed and made of the character Go's encoder escapes to six bytes.
    let worst = "<".repeat(20_000);
    let event = AuditEvent {
        user: Some(Arc::new(User {
            name: worst.clone(),
            uid: worst.clone(),
            ..crowded_user()
        })),
        user_agent: Some(HeaderValue::from_str(&worst).unwrap()),
        object_ref: Some(ObjectRef {
            resource: "pods",
            namespace: Some(Arc::from(worst.as_str())),
            subresource: "exec",
            name: Arc::from(worst.as_str()),
        }),
        authorization: Some(Authorization::Allow(Reason::Static("r"))),
        ..sample(&format!("/exec/{}", "%3C".repeat(3000)))
    };
    let mut out = Vec::new();
    encode_bounded(&event, MIN_EVENT_BOUND, &mut out).unwrap();
    assert!(out.len() <= MIN_EVENT_BOUND, "{} bytes", out.len());
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["annotations"]["kubelet-auth-proxy.io/minimal"], "true");
    assert_eq!(v["annotations"]["authorization.k8s.io/decision"], "allow");
    assert_eq!(v["auditID"], "00112233-4455-4677-8899-aabbccddeeff");
    assert_eq!(v["verb"], "get");
    assert_eq!(v["responseStatus"]["code"], 200);
    assert!(v["user"]["username"].as_str().unwrap().starts_with("<<<"));
    assert!(v["user"].get("groups").is_none());
    assert!(v.get("userAgent").is_none());
}

#[test]
fn user_agent_is_truncated_and_made_valid_utf8_like_kube_apiserver() {
    let with_agent = |agent: HeaderValue| {
        let event = AuditEvent {
            user_agent: Some(agent),
            ..sample("/pods")
        };
        parse(&event)["userAgent"].as_str().unwrap().to_owned()
    };
    let exact = "a".repeat(MAX_USER_AGENT);
    assert_eq!(with_agent(HeaderValue::from_str(&exact).unwrap()), exact);
    let long = "b".repeat(MAX_USER_AGENT + 1);
    assert_eq!(
        with_agent(HeaderValue::from_str(&long).unwrap()),
        format!("{}...TRUNCATED", "b".repeat(MAX_USER_AGENT))
    );
    assert_eq!(
        with_agent(HeaderValue::from_bytes(b"curl/\xff8").unwrap()),
        "curl/\u{fffd}8"
    );
}

#[test]
fn source_ip_is_written_as_go_prints_it() {
    let cases = [
        (
            IpAddr::V6(Ipv4Addr::new(192, 0, 2, 9).to_ipv6_mapped()),
            "192.0.2.9",
        ),
        (
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            "2001:db8::1",
        ),
        (IpAddr::V4(Ipv4Addr::LOCALHOST), "127.0.0.1"),
    ];
    for (ip, expected) in cases {
        let event = AuditEvent {
            source_ip: ip,
            ..sample("/pods")
        };
        assert_eq!(parse(&event)["sourceIPs"], json!([expected]), "{ip}");
    }
}

#[test]
fn timestamps_are_rfc3339_microseconds_in_utc() {
    let cases = [
        (at(0, 0), "1970-01-01T00:00:00.000000Z"),
        (
            at(1_709_210_096, 123_456_000),
            "2024-02-29T12:34:56.123456Z",
        ),
        (at(951_782_400, 0), "2000-02-29T00:00:00.000000Z"),
        (at(4_107_456_000, 0), "2100-02-28T00:00:00.000000Z"),
        (at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z"),
        (
            at(1_795_324_560, 123_456_789),
            "2026-11-22T05:16:00.123456Z",
        ),
        // Truncated as Go formats, never rounded up into the next second (or year).
        (at(946_684_799, 999_999_999), "1999-12-31T23:59:59.999999Z"),
        (at(0, 999), "1970-01-01T00:00:00.000000Z"),
        // Before the epoch.
        (at(-1, 500_000_000), "1969-12-31T23:59:59.500000Z"),
        (at(-11_670_912_000, 0), "1600-03-01T00:00:00.000000Z"),
    ];
    for (time, expected) in cases {
        assert_eq!(MicroTime(time).to_string(), expected);
    }
}

#[test]
fn audit_ids_are_random_uuid_v4() {
    let ids: Vec<String> = (0..64)
        .map(|_| AuditId::random().unwrap().to_string())
        .collect();
    for id in &ids {
        assert_eq!(id.len(), 36, "{id}");
        for (i, c) in id.chars().enumerate() {
            match i {
                8 | 13 | 18 | 23 => assert_eq!(c, '-', "{id}"),
                14 => assert_eq!(c, '4', "version of {id}"),
                19 => assert!(matches!(c, '8' | '9' | 'a' | 'b'), "variant of {id}"),
                _ => assert!(matches!(c, '0'..='9' | 'a'..='f'), "{id}"),
            }
        }
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len());
}

#[test]
fn backup_names_follow_lumberjack() {
    let time = at(1_795_324_560, 123_999_999);
    let cases = [
        (
            "/var/log/audit.log",
            "/var/log/audit-2026-11-22T05-16-00.123.log",
        ),
        ("/var/log/audit", "/var/log/audit-2026-11-22T05-16-00.123"),
        ("kube.audit.json", "kube.audit-2026-11-22T05-16-00.123.json"),
    ];
    for (path, expected) in cases {
        assert_eq!(backup_path(Path::new(path), time), Path::new(expected));
    }

    let (stem, ext) = split_extension(b"audit.log");
    assert_eq!(
        backup_timestamp(b"audit-2026-11-22T05-16-00.123.log", stem, ext),
        Some(&b"2026-11-22T05-16-00.123"[..])
    );
    for other in [
        &b"audit.log"[..],
        b"audit-notes.log",
        b"audit-2026-11-22T05-16-00.123.log.gz",
        b"audit-2026-11-22T05:16:00.123.log",
        b"other-2026-11-22T05-16-00.123.log",
        b"audit-2026-11-22T05-16-00.123.txt",
    ] {
        assert_eq!(
            backup_timestamp(other, stem, ext),
            None,
            "{}",
            String::from_utf8_lossy(other)
        );
    }
}

#[test]
fn target_flag_dash_is_stdout() {
    assert_eq!(AuditTarget::from_flag("-".into()), AuditTarget::Stdout);
    assert_eq!(
        AuditTarget::from_flag("/var/log/kap/audit.log".into()),
        AuditTarget::File("/var/log/kap/audit.log".into())
    );
}

#[tokio::test]
async fn a_new_file_is_owner_only_and_an_existing_one_is_appended_to() {
    let file = LogFile::new("create");
    let log = file.open(AuditOptions::default());
    assert_eq!(file.mode(), 0o600);
    log.record(sample("/first"));
    close(log).await;

    let log = file.open(AuditOptions::default());
    log.record(sample("/second"));
    close(log).await;
    assert_eq!(file.uris(), ["/first", "/second"]);

    let missing_dir = AuditLog::open(
        AuditTarget::File(file.dir.join("no-such-dir/audit.log")),
        AuditOptions::default(),
        Counter::default(),
    );
    assert!(missing_dir.is_err());
}

#[tokio::test]
async fn rotation_renames_full_files_and_keeps_the_newest_backups() {
    let file = LogFile::new("rotate");
    let log = file.open(rotating(2));
    // A mode no umask narrows: the new file after a rotation must carry the old file's mode.
    fs::set_permissions(&file.path, fs::Permissions::from_mode(0o400)).unwrap();

    let padding = "p".repeat(4000);
    let events = 1100; // about 4.8 MiB: four rotations
    for n in 0..events {
        log.record(sample(&format!("/stats/summary?n={n:05}&pad={padding}")));
    }
    close(log).await;
    assert_eq!(file.dropped.get(), 0);

    let mut backups = Vec::new();
    for entry in fs::read_dir(&file.dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name != "audit.log" {
            assert!(
                backup_timestamp(name.as_bytes(), b"audit", b".log").is_some(),
                "unexpected file {name}"
            );
            backups.push(name);
        }
    }
    assert_eq!(backups.len(), 2, "{backups:?}");
    backups.sort();

    let line_len = line(&sample(&format!("/stats/summary?n=00000&pad={padding}"))).len() as u64;
    let mut seen = Vec::new();
    for name in &backups {
        let content = fs::read(file.dir.join(name)).unwrap();
        let size = content.len() as u64;
        assert!(
            size <= MEGABYTE && size > MEGABYTE - line_len,
            "{name}: {size}"
        );
        seen.extend(uris(&content));
    }
    let current = fs::read(&file.path).unwrap();
    assert!(current.len() as u64 <= MEGABYTE);
    seen.extend(uris(&current));
    assert_eq!(file.mode(), 0o400);

    // The kept files hold the newest events, contiguous and in order, up to the last one.
    let numbers: Vec<usize> = seen
        .iter()
        .map(|uri| uri["/stats/summary?n=".len()..][..5].parse().unwrap())
        .collect();
    let first = events - numbers.len();
    assert!(first > 0, "older backups were removed");
    assert_eq!(numbers, (first..events).collect::<Vec<_>>());
}

#[tokio::test]
async fn opening_removes_excess_backups_and_nothing_else() {
    let file = LogFile::new("cleanup");
    let backups: Vec<String> = (1..=5)
        .map(|day| format!("audit-2026-01-0{day}T00-00-00.000.log"))
        .collect();
    let others = [
        "audit-notes.log",
        "audit.log.1",
        "other-2026-01-01T00-00-00.000.log",
        "audit-2026-01-01T00-00-00.000.log.gz",
    ];
    for name in backups.iter().map(String::as_str).chain(others) {
        fs::write(file.dir.join(name), "old\n").unwrap();
    }
    let present = |name: &str| file.dir.join(name).exists();

    // Keeping every backup removes none; keeping two removes the three oldest.
    close(file.open(rotating(0))).await;
    assert!(backups.iter().all(|b| present(b)));

    close(file.open(rotating(2))).await;
    let kept: Vec<&String> = backups.iter().filter(|b| present(b)).collect();
    assert_eq!(kept, [&backups[3], &backups[4]]);
    assert!(others.iter().all(|o| present(o)));
    assert!(present("audit.log"));
}

#[tokio::test]
async fn an_event_larger_than_the_file_size_is_dropped_and_counted() {
    let file = LogFile::new("oversized");
    let log = file.open(rotating(0));
    let huge = User {
        name: "u".repeat(MEGABYTE as usize + 1),
        ..User::default()
    };
    log.record(sample("/before"));
    log.record(AuditEvent {
        user: Some(Arc::new(huge)),
        ..sample("/huge")
    });
    log.record(sample("/after"));
    close(log).await;
    assert_eq!(file.dropped.get(), 1);
    assert_eq!(file.uris(), ["/before", "/after"]);
    assert_eq!(fs::read_dir(&file.dir).unwrap().count(), 1, "no rotation");
}

/// Bytes written to a stream sink, readable by the test.
#[derive(Clone, Default)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    fn contents(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A slow target: each write announces itself, then waits until the gate opens.
struct GatedWriter {
    out: SharedBuffer,
    entered: std_mpsc::Sender<()>,
    gate: std_mpsc::Receiver<()>,
}

impl Write for GatedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = self.entered.send(());
        // Returns at once when the test dropped its sender: the gate is open for good.
        let _ = self.gate.recv();
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_blocking() {
    let (entered_tx, entered) = std_mpsc::channel();
    let (open_gate, gate) = std_mpsc::channel();
    let out = SharedBuffer::default();
    let writer = GatedWriter {
        out: out.clone(),
        entered: entered_tx,
        gate,
    };
    let dropped = Counter::default();
    let log = AuditLog::start(Sink::Stream(Box::new(writer)), 1, None, dropped.clone()).unwrap();

    log.record(sample("/0"));
    // The writer now holds event 0 in a blocked write, and the queue is empty.
    entered.recv_timeout(WAIT).unwrap();
    log.record(sample("/1")); // fills the queue of one
    log.record(sample("/2"));
    log.record(sample("/3"));
    assert_eq!(dropped.get(), 2);

    drop(open_gate);
    close(log).await;
    assert_eq!(uris(&out.contents()), ["/0", "/1"]);
    assert_eq!(dropped.get(), 2);
}

struct FailingWriter;

impl Write for FailingWriter {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("disk on fire"))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn failed_writes_are_counted_and_never_reach_the_caller() {
    let dropped = Counter::default();
    let log = AuditLog::start(
        Sink::Stream(Box::new(FailingWriter)),
        16,
        None,
        dropped.clone(),
    )
    .unwrap();
    for n in 0..5 {
        log.record(sample(&format!("/{n}")));
    }
    close(log).await;
    assert_eq!(dropped.get(), 5);
}

#[tokio::test]
async fn close_writes_everything_queued_then_refuses_new_events() {
    let file = LogFile::new("close");
    let log = file.open(AuditOptions::default());
    let survivor = log.clone();
    let expected: Vec<String> = (0..3000).map(|n| format!("/pods?n={n}")).collect();
    for uri in &expected {
        log.record(sample(uri));
    }
    // Returns although a clone is still alive.
    close(log).await;
    assert_eq!(file.uris(), expected);
    assert_eq!(file.dropped.get(), 0);

    survivor.record(sample("/late"));
    assert_eq!(file.dropped.get(), 1);
    assert_eq!(file.uris().len(), expected.len());
}

#[tokio::test]
async fn dropping_every_clone_stops_the_writer_after_writing() {
    let out = SharedBuffer::default();
    let log = AuditLog::start(
        Sink::Stream(Box::new(out.clone())),
        QUEUE_CAPACITY,
        None,
        Counter::default(),
    )
    .unwrap();
    let mut writer_done = log.writer_done.clone();
    let other = log.clone();
    log.record(sample("/a"));
    other.record(sample("/b"));
    drop(log);
    drop(other);
    let stopped = tokio::time::timeout(WAIT, writer_done.changed()).await;
    assert!(matches!(stopped, Ok(Err(_))), "the writer thread ended");
    assert_eq!(uris(&out.contents()), ["/a", "/b"]);
}

/// A whole line, byte for byte, as kube-apiserver's `audit.k8s.io/v1` Event at level Metadata
/// marshals it with Go's `encoding/json`: the Event struct's field order (TypeMeta, level,
/// auditID, stage, requestURI, verb, user, sourceIPs, userAgent, objectRef, responseStatus,
/// the two timestamps, annotations), `omitempty` fields absent, map keys sorted, `<`, `>` and `&`
/// escaped as `\u003c`, `\u003e`, `\u0026`, and MicroTime cut to six digits.
#[test]
fn a_whole_event_line_is_byte_for_byte_what_kube_apiserver_writes() {
    let mut event = sample("/stats/summary?only_cpu_and_memory=true&x=1");
    event.authorization = Some(Authorization::Forbid(Reason::Static(
        "no <rule> & no binding",
    )));
    let expected = concat!(
        r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","#,
        r#""auditID":"00112233-4455-4677-8899-aabbccddeeff","stage":"ResponseComplete","#,
        r#""requestURI":"/stats/summary?only_cpu_and_memory=true\u0026x=1","#,
        r#""verb":"get","user":{"username":"system:node:node-1","uid":"9f6e1c2a","#,
        r#""groups":["system:nodes","system:authenticated"],"#,
        r#""extra":{"authentication.kubernetes.io/credential-id":["X509SHA256=4f2a"]}},"#,
        r#""sourceIPs":["10.0.0.7"],"userAgent":"kubectl/v1.34.0 (linux/amd64)","#,
        r#""objectRef":{"resource":"nodes","name":"node-1","apiVersion":"v1","#,
        r#""subresource":"proxy"},"responseStatus":{"metadata":{},"code":200},"#,
        r#""requestReceivedTimestamp":"2026-11-22T05:16:00.123456Z","#,
        r#""stageTimestamp":"2026-11-22T05:16:00.130000Z","#,
        r#""annotations":{"authorization.k8s.io/decision":"forbid","#,
        r#""authorization.k8s.io/reason":"no \u003crule\u003e \u0026 no binding"}}"#,
        "\n"
    );
    assert_eq!(line(&event), expected);
}
