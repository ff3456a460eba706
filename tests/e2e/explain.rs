//! `kubelet-auth-proxy explain` through the real binary: the configuration loaded from `--config`
//! as the server loads it, a policy with several bindings, the Node restriction, the `nodes/proxy`
//! fallback, an unclean path, the JSON document, exit statuses, warnings for rules that can never
//! match, and the SubjectAccessReview reason from the stand-in API server.

use serde_json::Value;

use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, Fault, Kind, Verdict};
use crate::support::process::{Deployment, Finished, ProcessSpec, run};
use crate::test_data::{MONITORING_POLICY, text};

/// A role whose rules no kubelet request can match, and its binding: appended to the monitoring
/// policy, they are what `explain` warns about.
const NEVER: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: never}
rules:
- {apiGroups: [""], resources: [nodes/stats], verbs: [list]}
- {apiGroups: [apps], resources: [nodes/proxy], verbs: [get]}
- {apiGroups: [""], resources: [nodes/spec], verbs: [get]}
- {apiGroups: [""], resources: [nodes/stats], resourceNames: [node-z], verbs: [get]}
- {nonResourceURLs: [/metrics], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: never}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: never}
subjects: [{kind: User, name: nobody}]
"#;

/// Writes `policy.yaml` into `dir`: the monitoring policy the unit tests judge with (the group
/// `monitoring` has stats through the first binding and metrics through the second; `debugger`
/// has `nodes/proxy`), then [`NEVER`]. Returns its path.
fn write_policy(dir: &TempDir) -> String {
    let text = format!("{}---\n{NEVER}", text(MONITORING_POLICY));
    dir.write("policy.yaml", text).display().to_string()
}

/// The line of `policy.yaml` where [`NEVER`]'s role starts: after the monitoring policy and the
/// `---` between them.
fn never_line() -> usize {
    text(MONITORING_POLICY).lines().count() + 2
}

/// The upstream of a configuration `explain` reads: it never sends a request.
const NOWHERE: &str = "http://127.0.0.1:1";

/// A configuration directory: `proxy.yaml` (serving files, node `node-a`) and `policy.yaml`.
struct Setup {
    site: Deployment,
    policy: String,
}

impl Setup {
    async fn new(label: &str) -> Setup {
        let site = ProcessSpec::new(label).upstream(NOWHERE).prepare().await;
        let policy = write_policy(&site.dir);
        Setup { site, policy }
    }

    /// `explain --config=… --authorization-mode=Node,Policy --authorization-policy-file=… args…`.
    async fn explain(&self, name: &str, args: &[&str]) -> Finished {
        let policy = format!("--authorization-policy-file={}", self.policy);
        explain(
            &self.site,
            name,
            &[&["--authorization-mode=Node,Policy", &policy], args].concat(),
        )
        .await
    }
}

/// `explain --config=… args…` with the configuration of `site`.
async fn explain(site: &Deployment, name: &str, args: &[&str]) -> Finished {
    let mut command = vec!["explain".to_owned()];
    command.extend(site.command_line(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>()));
    run(&site.dir, name, &command).await
}

/// Asserts that `done` exited with `code`, showing what it printed otherwise.
fn assert_exit(done: &Finished, code: i32) {
    assert_eq!(
        done.status.code(),
        Some(code),
        "{}{}",
        done.stdout,
        done.stderr
    );
}

/// Asserts that `done` exited with `code` and printed each of `expected` on stdout, showing
/// what it printed otherwise.
fn assert_printed(done: &Finished, code: i32, expected: &[&str]) {
    assert_exit(done, code);
    for expected in expected {
        assert!(
            done.stdout.contains(expected),
            "{expected:?} not in:\n{}",
            done.stdout
        );
    }
}

fn json(done: &Finished) -> Value {
    serde_json::from_str(&done.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", done.stdout, done.stderr))
}

#[tokio::test]
async fn explain_names_the_binding_that_allowed_and_the_403_when_none_does() {
    let s = Setup::new("explain-policy").await;

    let done = s
        .explain(
            "metrics",
            &["--user=prom", "--group=monitoring", "GET", "/metrics"],
        )
        .await;
    assert_printed(
        &done,
        0,
        &[
            "Policy       Allow      RBAC: allowed by ClusterRoleBinding \"monitoring-metrics\" \
             of ClusterRole \"metrics-reader\" to Group \"monitoring\"",
            "Node         NoOpinion  not a node identity",
            "result:      allowed",
        ],
    );

    let done = s
        .explain(
            "pods",
            &["--user=prom", "--group=monitoring", "GET", "/pods"],
        )
        .await;
    assert_printed(
        &done,
        1,
        &[
            "attributes:  nodes/pods, nodes/proxy (in order)",
            "result:      403 forbidden",
            r#"body: "Forbidden (user=prom, verb=get, resource=nodes, subresource(s)=[pods proxy])\n""#,
        ],
    );

    // The fallback: nodes/pods has no opinion, nodes/proxy is allowed.
    let done = s
        .explain(
            "fallback",
            &["--user=debugger", "--output=json", "GET", "/pods"],
        )
        .await;
    assert_exit(&done, 0);
    let e = json(&done);
    assert_eq!(e["attributes"][0]["subresource"], "pods");
    assert_eq!(e["attributes"][0]["decision"], "NoOpinion");
    assert_eq!(e["attributes"][1]["subresource"], "proxy");
    assert_eq!(e["attributes"][1]["decision"], "Allow");
    assert_eq!(e["attributes"][1]["decidedBy"], "Policy");
    assert!(
        e["attributes"][1]["answers"][1]["reason"]
            .as_str()
            .unwrap()
            .contains("\"debugger-proxy\"")
    );
}

#[tokio::test]
async fn explain_shows_the_node_restriction_and_the_redirect() {
    let s = Setup::new("explain-node").await;
    let done = s
        .explain(
            "other-node",
            &[
                "--user=system:node:node-b",
                "--group=system:nodes",
                "--output=json",
                "GET",
                "/stats/summary",
            ],
        )
        .await;
    assert_exit(&done, 1);
    let e = json(&done);
    let answers = &e["attributes"][0]["answers"];
    assert_eq!(answers[0]["authorizer"], "Node");
    assert_eq!(answers[0]["answer"], "Deny");
    assert_eq!(
        answers[0]["reason"],
        "node identities may only access their own node's kubelet"
    );
    assert_eq!(answers[1]["answer"], "NotAsked");
    assert_eq!(e["result"]["status"], 403);

    let done = s
        .explain("redirect", &["--user=prom", "GET", "/metrics/../pods?x=1"])
        .await;
    assert_printed(
        &done,
        1,
        &[
            "path:        not canonical: redirected to /pods?x=1 before authentication",
            "result:      301 redirected",
            "  location: /pods?x=1",
        ],
    );
    assert!(!done.stdout.contains("attributes:"), "{}", done.stdout);
}

#[tokio::test]
async fn explain_json_document_field_by_field() {
    let s = Setup::new("explain-json").await;
    let done = s
        .explain(
            "json",
            &[
                "--output=json",
                "--user=alice",
                "--uid=42",
                "--group=devs",
                "--extra=scopes=a",
                "--extra=scopes=b",
                "HEAD",
                "/healthz",
            ],
        )
        .await;
    assert_exit(&done, 1);
    // Warnings go into the document, not to stderr.
    assert_eq!(done.stderr, "");
    let e = json(&done);
    assert_eq!(e["apiVersion"], "kubelet-auth-proxy/v1alpha1");
    assert_eq!(e["kind"], "Explanation");
    assert_eq!(e["request"]["method"], "HEAD");
    assert_eq!(e["request"]["path"], "/healthz");
    assert_eq!(e["request"]["user"]["username"], "alice");
    assert_eq!(e["request"]["user"]["uid"], "42");
    assert_eq!(e["request"]["user"]["groups"], serde_json::json!(["devs"]));
    assert_eq!(
        e["request"]["user"]["extra"],
        serde_json::json!({"scopes": ["a", "b"]})
    );
    assert_eq!(e["nodeName"], "node-a");
    assert_eq!(e["authorizers"], serde_json::json!(["Node", "Policy"]));
    assert_eq!(
        e["path"],
        serde_json::json!({"verdict": "canonical", "decoded": "/healthz"})
    );
    assert_eq!(e["verb"], "");
    assert_eq!(e["subresources"], serde_json::json!(["healthz", "proxy"]));
    assert_eq!(e["attributes"].as_array().unwrap().len(), 2);
    assert_eq!(
        e["attributes"][0]["answers"][1],
        serde_json::json!({
            "authorizer": "Policy",
            "answer": "NoOpinion",
            "reason": "no ClusterRoleBinding of the local policy allows the request"
        })
    );
    assert_eq!(
        e["result"],
        serde_json::json!({
            "outcome": "forbidden",
            "allowed": false,
            "status": 403,
            "headers": {"content-type": "text/plain; charset=utf-8"},
            "body": "Forbidden (user=alice, verb=, resource=nodes, subresource(s)=[healthz proxy])\n"
        })
    );
    let warnings = e["warnings"].as_array().unwrap();
    let fields: Vec<(&str, u64, bool)> = warnings
        .iter()
        .map(|w| {
            assert_eq!(w["file"], s.policy.as_str());
            assert_eq!(w["role"], "never");
            assert_eq!(w["line"], never_line());
            (
                w["field"].as_str().unwrap(),
                w["rule"].as_u64().unwrap(),
                w["ruleNeverMatches"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("verbs", 0, true),
            ("apiGroups", 1, true),
            ("resources", 2, true),
            ("resourceNames", 3, true),
            ("nonResourceURLs", 4, true),
        ]
    );
    assert!(
        warnings[3]["message"]
            .as_str()
            .unwrap()
            .contains("\"node-a\"")
    );
}

#[tokio::test]
async fn explain_warns_on_stderr_in_text_mode_and_exits_2_on_bad_input() {
    let s = Setup::new("explain-input").await;
    let done = s.explain("warn", &["--anonymous", "GET", "/pods"]).await;
    assert_printed(&done, 1, &["user:        system:anonymous"]);
    let warnings: Vec<&str> = done.stderr.lines().collect();
    assert_eq!(warnings.len(), 5, "{}", done.stderr);
    assert!(
        warnings[0].starts_with(&format!(
            "kubelet-auth-proxy: warning: {}:{}: ClusterRole \"never\" rules[0]: verb \"list\"",
            s.policy,
            never_line()
        )),
        "{}",
        warnings[0]
    );
    assert!(warnings[4].contains("rules[4]: nonResourceURLs"));

    let missing = s.site.dir.path().join("missing.yaml").display().to_string();
    let cases: [(&str, Vec<String>); 5] = [
        ("extra", vec!["--user=a".into(), "--extra=novalue".into()]),
        (
            "method",
            vec!["--user=a".into(), "get".into(), "/pods".into()],
        ),
        ("no-user", vec!["GET".into(), "/pods".into()]),
        (
            "policy",
            vec![
                format!("--authorization-policy-file={missing}"),
                "--user=a".into(),
            ],
        ),
        ("flag", vec!["--user=a".into(), "--no-such-flag".into()]),
    ];
    for (name, mut args) in cases {
        if !args.iter().any(|a| a == "/pods") {
            args.extend(["GET".to_owned(), "/pods".to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let done = s.explain(name, &args).await;
        assert_eq!(done.status.code(), Some(2), "{name}: {}", done.stderr);
        assert_eq!(done.stdout, "", "{name}");
        assert_eq!(done.stderr.lines().count(), 1, "{name}: {}", done.stderr);
    }

    let config = s.site.dir.path().join("nowhere.yaml").display().to_string();
    let done = run(
        &s.site.dir,
        "config",
        &[
            "explain".into(),
            format!("--config={config}"),
            "--user=a".into(),
            "GET".into(),
            "/pods".into(),
        ],
    )
    .await;
    assert_exit(&done, 2);
    assert!(done.stderr.contains(&config), "{}", done.stderr);
}

#[tokio::test]
async fn explain_with_webhook_shows_the_subject_access_review_reason() {
    let api = ApiServer::start().await;
    api.set_rules(|r| {
        if r.subresource == "metrics" && r.user == "prom" && r.name == "node-a" {
            Verdict::allow()
        } else {
            Verdict::deny()
        }
    });
    let site = ProcessSpec::new("explain-webhook")
        .upstream(NOWHERE)
        .apiserver(&api)
        .prepare()
        .await;
    async fn webhook(site: &Deployment, name: &str, args: &[&str]) -> Finished {
        explain(
            site,
            name,
            &[&["--authorization-mode=Webhook"], args].concat(),
        )
        .await
    }

    let done = webhook(&site, "allowed", &["--user=prom", "GET", "/metrics"]).await;
    assert_printed(
        &done,
        0,
        &["Webhook      Allow      RBAC: allowed by the stand-in's rules"],
    );

    let done = webhook(
        &site,
        "denied",
        &["--user=prom", "--output=json", "GET", "/pods"],
    )
    .await;
    assert_exit(&done, 1);
    let e = json(&done);
    assert_eq!(e["attributes"][0]["answers"][0]["answer"], "Deny");
    assert_eq!(
        e["attributes"][0]["answers"][0]["reason"],
        "denied by the stand-in's rules"
    );
    assert_eq!(e["attributes"][1]["decision"], "Deny");
    assert_eq!(e["result"]["status"], 403);

    // A review that fails (403 from the API server is not retried): the proxy's 500, exit 2.
    api.inject(Kind::SubjectAccessReview, Fault::Forbidden, 1);
    let done = webhook(
        &site,
        "error",
        &["--user=prom", "--output=json", "GET", "/pods"],
    )
    .await;
    assert_exit(&done, 2);
    let e = json(&done);
    assert_eq!(e["attributes"].as_array().unwrap().len(), 1);
    assert_eq!(e["attributes"][0]["decision"], "Error");
    assert_eq!(e["result"]["outcome"], "authorizationError");
    assert_eq!(e["result"]["status"], 500);
    assert_eq!(
        e["result"]["body"],
        "Authorization error (user=prom, verb=get, resource=nodes, subresource=pods)"
    );
    // One real review per attribute set asked: allowed (1), denied (2), failed (1).
    assert_eq!(api.statuses(Kind::SubjectAccessReview).len(), 4);
}

/// `explain` with the authorization flags and the node name alone: no serving pair, upstream or
/// kubeconfig, so a policy can be tested where none of those exist (a CI job).
fn policy_only(policy: &str, args: &[&str]) -> Vec<String> {
    let mut command = vec![
        "explain".to_owned(),
        "--authorization-mode=Node,Policy".to_owned(),
        format!("--authorization-policy-file={policy}"),
        "--node-name=node-a".to_owned(),
    ];
    command.extend(args.iter().map(|a| (*a).to_owned()));
    command
}

#[tokio::test]
async fn explain_needs_only_the_policy_and_the_node_name() {
    let dir = TempDir::new("explain-policy-only");
    let policy = write_policy(&dir);
    let prom = ["--user=prom", "--group=monitoring", "--output=json"];
    let allowed = run(
        &dir,
        "allowed",
        &policy_only(&policy, &[&prom[..], &["GET", "/metrics"]].concat()),
    )
    .await;
    assert_exit(&allowed, 0);
    let e = json(&allowed);
    assert_eq!(e["result"]["outcome"], "forwarded");
    assert_eq!(e["attributes"][0]["decidedBy"], "Policy");
    let denied = run(
        &dir,
        "denied",
        &policy_only(&policy, &[&prom[..], &["GET", "/pods"]].concat()),
    )
    .await;
    assert_exit(&denied, 1);
    assert_eq!(json(&denied)["result"]["status"], 403);
}

#[tokio::test]
async fn explain_check_passes_a_table_and_fails_on_a_mismatch() {
    let dir = TempDir::new("explain-check");
    let policy = write_policy(&dir);
    let good = dir.write(
        "good.yaml",
        "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: PolicyCheck\nrows:\n\
         - {user: prom, groups: [monitoring], method: GET, path: /metrics, expect: allow}\n\
         - {name: no exec, user: prom, groups: [monitoring], method: POST, \
            path: /exec/ns/pod/c, expect: deny}\n\
         - {anonymous: true, method: GET, path: /stats/summary, expect: deny}\n",
    );
    let done = run(
        &dir,
        "good",
        &policy_only(&policy, &[&format!("--check={}", good.display())]),
    )
    .await;
    assert_exit(&done, 0);
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", done.stdout);
    assert!(
        lines[..3].iter().all(|l| l.starts_with("PASS  row ")),
        "{}",
        done.stdout
    );
    assert!(lines[1].contains("row 2 (no exec): prom POST /exec/ns/pod/c: deny (403)"));
    assert_eq!(lines[3], "3 rows: 3 passed, 0 failed");

    // debugger has nodes/proxy: /pods is allowed through the fallback, which the row denies.
    let bad = dir.write(
        "bad.yaml",
        "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: PolicyCheck\nrows:\n\
         - {user: prom, groups: [monitoring], method: GET, path: /metrics, expect: allow}\n\
         - {user: debugger, method: GET, path: /pods, expect: deny}\n",
    );
    let check = format!("--check={}", bad.display());
    let done = run(&dir, "bad", &policy_only(&policy, &[&check])).await;
    assert_printed(
        &done,
        1,
        &["FAIL  row 2: debugger GET /pods: allow, expected deny \
           (allowed on nodes/proxy by Policy)"],
    );
    let done = run(
        &dir,
        "bad-json",
        &policy_only(&policy, &[&check, "--output=json"]),
    )
    .await;
    assert_exit(&done, 1);
    let report = json(&done);
    assert_eq!(
        (report["passed"].as_u64(), report["failed"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(report["rows"][1]["passed"], false);
    assert_eq!(report["rows"][1]["outcome"], "forwarded");
    assert_eq!(report["rows"][1]["expected"], "deny");
}

#[tokio::test]
async fn explain_check_refuses_a_table_it_cannot_ask_naming_file_and_row() {
    let dir = TempDir::new("explain-check-input");
    let policy = write_policy(&dir);
    for (name, table, needle) in [
        (
            "both",
            "- {user: a, method: GET, path: /pods, expect: deny}\n\
             - {user: a, anonymous: true, method: GET, path: /pods, expect: deny}\n",
            "row 2: give either `user` or `anonymous: true`",
        ),
        (
            "method",
            "- {user: a, method: get, path: /pods, expect: deny}\n",
            "row 1: methods are case-sensitive",
        ),
        (
            "field",
            "- {user: a, method: GET, path: /pods, expect: deny, verb: get}\n",
            "verb",
        ),
        (
            "expect",
            "- {user: a, method: GET, path: /pods, expect: maybe}\n",
            "maybe",
        ),
        ("empty", "  []\n", "the table has no rows"),
        (
            "kind",
            "apiVersion: v1\nkind: List\nrows: []\n",
            "expected apiVersion \"kubelet-auth-proxy/v1alpha1\" and kind \"PolicyCheck\"",
        ),
    ] {
        let table = match name {
            "kind" => table.to_owned(),
            _ => format!(
                "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: PolicyCheck\nrows:\n{table}"
            ),
        };
        let file = dir.write(&format!("{name}.yaml"), &table);
        let check = format!("--check={}", file.display());
        let done = run(&dir, name, &policy_only(&policy, &[&check])).await;
        assert_eq!(done.status.code(), Some(2), "{name}: {}", done.stderr);
        assert_eq!(done.stdout, "", "{name}");
        let error = done.stderr.lines().last().unwrap_or_default();
        assert!(
            error.starts_with(&format!("kubelet-auth-proxy: --check {}:", file.display())),
            "{name}: {error}"
        );
        assert!(error.contains(needle), "{name}: {error}");
    }
    let done = run(
        &dir,
        "with-request",
        &policy_only(&policy, &["--check=x.yaml", "--user=a", "GET", "/pods"]),
    )
    .await;
    assert_exit(&done, 2);
}

#[tokio::test]
async fn the_shipped_policy_checks_pass_against_the_shipped_policies() {
    let dir = TempDir::new("explain-check-shipped");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut args = vec![
        "explain".to_owned(),
        "--authorization-mode=Node,Policy".to_owned(),
        "--node-name=node-a".to_owned(),
        format!(
            "--check={}",
            root.join("config/policy-checks.yaml").display()
        ),
    ];
    for policy in [
        "apiserver-kubelet-client.yaml",
        "metrics-scraper.yaml",
        "node-debuggers.yaml",
    ] {
        let path = root.join("config/policy").join(policy);
        args.push(format!("--authorization-policy-file={}", path.display()));
    }
    let done = run(&dir, "shipped", &args).await;
    assert_exit(&done, 0);
    assert!(!done.stdout.contains("FAIL"), "{}", done.stdout);
}

/// With `RBAC` in the chain, explain lists and watches once, then shows how fresh the watched
/// state is and names the watched binding that allowed; JSON carries the same.
#[tokio::test]
async fn explain_shows_the_watched_state_and_the_binding_the_rbac_mode_allowed_by() {
    let api = ApiServer::start().await;
    api.apply_rbac(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "kubelet-metrics"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}],
    }));
    api.apply_rbac(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "prom-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubelet-metrics"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "prom"}],
    }));
    let site = ProcessSpec::new("explain-rbac")
        .upstream(NOWHERE)
        .apiserver(&api)
        .prepare()
        .await;
    let mode = "--authorization-mode=Node,RBAC";
    let done = explain(&site, "allowed", &[mode, "--user=prom", "GET", "/metrics"]).await;
    assert_printed(
        &done,
        0,
        &[
            "rbac:        fresh, policy built ",
            "API server last heard: clusterrolebindings ",
            "RBAC         Allow      RBAC: allowed by ClusterRoleBinding \"prom-metrics\" of ClusterRole \"kubelet-metrics\" to User \"prom\"",
        ],
    );
    // The start jitter is not waited for: one process asking once.
    assert_eq!(
        api.rbac_lists(crate::support::apiserver::RbacKind::ClusterRole),
        1
    );

    let done = explain(
        &site,
        "refused-json",
        &[mode, "--user=eve", "--output=json", "GET", "/metrics"],
    )
    .await;
    assert_exit(&done, 1);
    let document = json(&done);
    assert_eq!(document["rbac"]["state"], "fresh", "{document}");
    assert!(
        document["rbac"]["policyAgeSeconds"].is_number(),
        "{document}"
    );
    assert!(
        document["rbac"]["lastContactSeconds"]["clusterroles"].is_number(),
        "{document}"
    );
}
