//! `kubelet-auth-proxy explain` through the real binary: the configuration loaded from `--config`
//! as the server loads it, a policy with several bindings, the Node restriction, the `nodes/proxy`
//! fallback, an unclean path, the JSON document, exit statuses, warnings for rules that can never
//! match, and the SubjectAccessReview reason from the stand-in API server.

use serde_json::Value;

use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, Flavour, Kind, Verdict};
use crate::support::pki::Authority;
use crate::support::process::{Finished, proxy_config, run};

/// Three roles, four bindings: the group `monitoring` has stats through the first binding and
/// metrics through the second; `debugger` has `nodes/proxy`; the last role has rules no kubelet
/// request can match.
const POLICY: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: stats-reader}
rules: [{apiGroups: [""], resources: [nodes/stats], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-reader}
rules: [{apiGroups: [""], resources: [nodes/metrics], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: proxy-reader}
rules: [{apiGroups: [""], resources: [nodes/proxy], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
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
metadata: {name: monitoring-stats}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: stats-reader}
subjects: [{kind: Group, name: monitoring}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: monitoring-metrics}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}
subjects: [{kind: Group, name: monitoring}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: debugger-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: proxy-reader}
subjects: [{kind: User, name: debugger}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: never}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: never}
subjects: [{kind: User, name: nobody}]
"#;

/// A configuration directory: `proxy.yaml` (serving files, node `node-a`) and `policy.yaml`.
struct Setup {
    dir: TempDir,
    config: String,
    policy: String,
}

impl Setup {
    fn new(label: &str) -> Setup {
        let dir = TempDir::new(label);
        let ca = Authority::root("explain CA");
        let config = proxy_config(&dir, &ca, "http://127.0.0.1:1", "");
        let policy = dir.write("policy.yaml", POLICY).display().to_string();
        Setup {
            dir,
            config,
            policy,
        }
    }

    /// `explain --config=… --authorization-mode=Node,Policy --authorization-policy-file=… args…`.
    async fn explain(&self, name: &str, args: &[&str]) -> Finished {
        let mut command = vec![
            "explain".to_owned(),
            format!("--config={}", self.config),
            "--authorization-mode=Node,Policy".to_owned(),
            format!("--authorization-policy-file={}", self.policy),
        ];
        command.extend(args.iter().map(|a| (*a).to_owned()));
        run(&self.dir, name, &command).await
    }
}

fn json(done: &Finished) -> Value {
    serde_json::from_str(&done.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", done.stdout, done.stderr))
}

#[tokio::test]
async fn explain_names_the_binding_that_allowed_and_the_403_when_none_does() {
    let s = Setup::new("explain-policy");

    let done = s
        .explain(
            "metrics",
            &["--user=prom", "--group=monitoring", "GET", "/metrics"],
        )
        .await;
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}{}",
        done.stdout,
        done.stderr
    );
    assert!(
        done.stdout.contains(
            "Policy       Allow      RBAC: allowed by ClusterRoleBinding \"monitoring-metrics\" \
             of ClusterRole \"metrics-reader\" to Group \"monitoring\""
        ),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout
            .contains("Node         NoOpinion  not a node identity")
    );
    assert!(
        done.stdout.contains("result:      allowed"),
        "{}",
        done.stdout
    );

    let done = s
        .explain(
            "pods",
            &["--user=prom", "--group=monitoring", "GET", "/pods"],
        )
        .await;
    assert_eq!(
        done.status.code(),
        Some(1),
        "{}{}",
        done.stdout,
        done.stderr
    );
    assert!(
        done.stdout
            .contains("attributes:  nodes/pods, nodes/proxy (in order)")
    );
    assert!(
        done.stdout.contains("result:      403 forbidden"),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout.contains(
            r#"body: "Forbidden (user=prom, verb=get, resource=nodes, subresource(s)=[pods proxy])\n""#
        ),
        "{}",
        done.stdout
    );

    // The fallback: nodes/pods has no opinion, nodes/proxy is allowed.
    let done = s
        .explain(
            "fallback",
            &["--user=debugger", "--output=json", "GET", "/pods"],
        )
        .await;
    assert_eq!(done.status.code(), Some(0), "{}", done.stderr);
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
    let s = Setup::new("explain-node");
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
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
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
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
    assert!(
        done.stdout
            .contains("path:        not canonical: redirected to /pods?x=1 before authentication"),
        "{}",
        done.stdout
    );
    assert!(done.stdout.contains("result:      301 redirected"));
    assert!(done.stdout.contains("  location: /pods?x=1"));
    assert!(!done.stdout.contains("attributes:"), "{}", done.stdout);
}

#[tokio::test]
async fn explain_json_document_field_by_field() {
    let s = Setup::new("explain-json");
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
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
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
            assert_eq!(w["line"], 16);
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
    let s = Setup::new("explain-input");
    let done = s.explain("warn", &["--anonymous", "GET", "/pods"]).await;
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
    assert!(done.stdout.contains("user:        system:anonymous"));
    let warnings: Vec<&str> = done.stderr.lines().collect();
    assert_eq!(warnings.len(), 5, "{}", done.stderr);
    assert!(
        warnings[0].starts_with(&format!(
            "kubelet-auth-proxy: warning: {}:16: ClusterRole \"never\" rules[0]: verb \"list\"",
            s.policy
        )),
        "{}",
        warnings[0]
    );
    assert!(warnings[4].contains("rules[4]: nonResourceURLs"));

    let missing = s.dir.path().join("missing.yaml").display().to_string();
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

    let config = s.dir.path().join("nowhere.yaml").display().to_string();
    let done = run(
        &s.dir,
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
    assert_eq!(done.status.code(), Some(2), "{}", done.stderr);
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
    let dir = TempDir::new("explain-webhook");
    let ca = Authority::root("explain CA");
    let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);
    let config = proxy_config(
        &dir,
        &ca,
        "http://127.0.0.1:1",
        &format!("kubeconfig: {}\n", kubeconfig.display()),
    );
    let explain = |name: &'static str, args: &[&str]| {
        let mut command = vec![
            "explain".to_owned(),
            format!("--config={config}"),
            "--authorization-mode=Webhook".to_owned(),
        ];
        command.extend(args.iter().map(|a| (*a).to_owned()));
        let dir = &dir;
        async move { run(dir, name, &command).await }
    };

    let done = explain("allowed", &["--user=prom", "GET", "/metrics"]).await;
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}{}",
        done.stdout,
        done.stderr
    );
    assert!(
        done.stdout
            .contains("Webhook      Allow      RBAC: allowed by the stand-in's rules"),
        "{}",
        done.stdout
    );

    let done = explain("denied", &["--user=prom", "--output=json", "GET", "/pods"]).await;
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
    let e = json(&done);
    assert_eq!(e["attributes"][0]["answers"][0]["answer"], "Deny");
    assert_eq!(
        e["attributes"][0]["answers"][0]["reason"],
        "denied by the stand-in's rules"
    );
    assert_eq!(e["attributes"][1]["decision"], "Deny");
    assert_eq!(e["result"]["status"], 403);

    // A review that fails (403 from the API server is not retried): the proxy's 500, exit 2.
    api.inject(
        Kind::SubjectAccessReview,
        crate::support::apiserver::Fault::Forbidden,
        1,
    );
    let done = explain("error", &["--user=prom", "--output=json", "GET", "/pods"]).await;
    assert_eq!(done.status.code(), Some(2), "{}", done.stderr);
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
