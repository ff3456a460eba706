//! `--audit-policy-file`: an audit.k8s.io/v1 Policy drops a scraper's reads of nodes/metrics and
//! nodes/stats from the audit log, over real TLS, while other callers' reads and every exec are
//! still recorded; `check-config` reads the policy, refuses the levels that record bodies and
//! warns about rules that would omit acts.

use std::path::{Path, PathBuf};

use http::StatusCode;
use serde_json::Value;

use crate::support::assert_contains;
use crate::support::harness::ProxySpec;
use crate::support::pki::{Authority, CertSpec};
use crate::support::process::run;
use crate::support::streams::{EXEC_PROTOCOL, ExecSession};
use crate::support::{TempDir, eventually};

const SCRAPER: &str = "system:serviceaccount:monitoring:prometheus";

/// Silences the scraper's metrics and stats reads, then (wrongly, for acts) everything else it
/// does; everyone else at Metadata.
const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    users: ["system:serviceaccount:monitoring:prometheus"]
    verbs: [get]
    resources:
      - group: ""
        resources: [nodes/metrics, nodes/stats]
  - level: None
    users: ["system:serviceaccount:monitoring:prometheus"]
  - level: Metadata
"#;

fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// `(user, requestURI, stage)` of each event.
fn summary(events: &[Value]) -> Vec<(String, String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e["user"]["username"].as_str().unwrap_or("").to_owned(),
                e["requestURI"].as_str().unwrap_or("").to_owned(),
                e["stage"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_policy_file_drops_a_scrapers_events_but_not_others_nor_an_exec() {
    let dir = TempDir::new("audit-policy");
    let log = dir.path().join("audit.log");
    let policy = dir.write("audit-policy.yaml", POLICY);
    let h = ProxySpec::always_allow(&[
        &format!("--audit-log-path={}", log.display()),
        &format!("--audit-policy-file={}", policy.display()),
    ])
    .start()
    .await;
    let scraper = h.user(SCRAPER, &["system:serviceaccounts"]);
    let alice = h.user("alice", &[]);

    for path in ["/metrics/cadvisor", "/stats/summary", "/pods"] {
        let reply = scraper.get(path).await;
        assert_ne!(reply.status, StatusCode::FORBIDDEN, "{path}");
        // Omitted from the log, the request still has its audit ID.
        assert!(reply.header("audit-id").is_some(), "{path}");
    }
    alice.get("/metrics/cadvisor").await;
    let refused = h.anonymous().get("/healthz").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    // The scraper's exec matches a rule with level None: recorded anyway, at both stages.
    let mut session = ExecSession::open(&h.http1_user(SCRAPER), EXEC_PROTOCOL).await;
    let exec_id = session.headers["audit-id"].to_str().unwrap().to_owned();
    session.echo(b"evidence").await;
    session.close().await;
    let (log_path, id) = (log.as_path(), exec_id.as_str());
    eventually("the exec's ResponseComplete event", || async move {
        events(log_path)
            .into_iter()
            .find(|e| e["auditID"] == id && e["stage"] == "ResponseComplete")
    })
    .await;

    assert_eq!(
        h.metric(
            "kubelet_auth_proxy_audit_events_omitted_total",
            &[("reason", "level_none")]
        )
        .await,
        3.0
    );
    h.shutdown().await;
    let events = events(&log);
    let seen = summary(&events);
    let exec_stages: Vec<&str> = events
        .iter()
        .filter(|e| e["auditID"] == exec_id.as_str())
        .map(|e| e["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        exec_stages,
        ["ResponseStarted", "ResponseComplete"],
        "{seen:#?}"
    );
    assert!(
        events
            .iter()
            .all(|e| e["user"]["username"] != SCRAPER || e["auditID"] == exec_id.as_str()),
        "only the scraper's exec: {seen:#?}"
    );
    assert!(
        seen.contains(&(
            "alice".to_owned(),
            "/metrics/cadvisor".to_owned(),
            "ResponseComplete".to_owned()
        )),
        "{seen:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["requestURI"] == "/healthz" && e["responseStatus"]["code"] == 401),
        "{seen:#?}"
    );
    assert_eq!(events.len(), 4, "{seen:#?}");
}

/// What `check-config` needs besides the audit flags: a serving pair and a client CA.
fn command_line(dir: &TempDir, audit: &[String]) -> Vec<String> {
    let ca = Authority::root("audit-policy CA");
    let serving = ca.issue(&CertSpec::server());
    let mut args = vec![
        "check-config".to_owned(),
        "--upstream=http://127.0.0.1:1".to_owned(),
        dir.flag("--tls-cert-file", "serving.crt", serving.chain_pem()),
        dir.flag("--tls-private-key-file", "serving.key", serving.key_pem()),
        dir.flag("--client-ca-file", "ca.crt", ca.pem()),
        "--authorization-mode=AlwaysAllow".to_owned(),
        "--node-name=node-a".to_owned(),
        format!(
            "--audit-log-path={}",
            dir.path().join("audit.log").display()
        ),
    ];
    args.extend(audit.iter().cloned());
    args
}

fn policy_flag(path: &Path) -> String {
    format!("--audit-policy-file={}", path.display())
}

fn shipped_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/audit-policy.yaml")
}

#[tokio::test]
async fn check_config_reads_the_policy_refuses_body_levels_and_warns_about_acts() {
    let dir = TempDir::new("audit-policy-check");

    // The shipped example loads, with nothing to warn about.
    let args = command_line(&dir, &[policy_flag(&shipped_policy())]);
    let done = run(&dir, "shipped", &args).await;
    done.assert_code(0);
    assert!(
        !done.stderr.contains("--audit-policy-file"),
        "{}",
        done.stderr
    );

    // A level that records bodies: refused, naming the flag, the file, the rule and the level.
    let body = dir.write(
        "body.yaml",
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  users: [a]\n- level: RequestResponse\n",
    );
    let done = run(&dir, "body", &command_line(&dir, &[policy_flag(&body)])).await;
    done.assert_code(2);
    let expected = format!(
        "--audit-policy-file {}: rules[1].level: RequestResponse records request bodies",
        body.display()
    );
    assert_contains(&done.stderr, &expected);
    assert_contains(&done.stderr, "use Metadata");

    // A rule that would silence acts: loads, and is warned about.
    let acts = dir.write("acts.yaml", POLICY);
    let done = run(&dir, "acts", &command_line(&dir, &[policy_flag(&acts)])).await;
    done.assert_code(0);
    assert_contains(
        &done.stderr,
        "--audit-policy-file: rules[1] (level None) matches acts such as create nodes/proxy",
    );
    // --strict refuses what is warned about.
    let mut strict = command_line(&dir, &[policy_flag(&acts)]);
    strict.insert(1, "--strict".to_owned());
    let done = run(&dir, "strict", &strict).await;
    assert_ne!(done.status.code(), Some(0), "{}", done.stderr);
}
