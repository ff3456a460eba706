//! explain's unit tests: traces, the JSON and text renderings, a webhook's match conditions, and
//! policy lint warnings.

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::*;
use crate::apiserver::{ApiServerClient, ApiServerMetrics, ApiServerSettings};
use crate::authz::Authorizer;
use crate::authz::attributes::AttributeMapping;
use crate::authz::match_conditions::MatchConditions;
use crate::authz::metrics::AuthzMetrics;
use crate::authz::policy::PolicyAuthorizer;
use crate::authz::webhook::SubjectAccessReviewAuthorizer;
use crate::config::authorization::{FailurePolicy, WebhookSpec};
use crate::test_fixtures::{
    NODE, block_on, decider, monitoring_policy, node_authorizer, pod_decider, user,
};

/// The Node authorizer, then the monitoring policy: the group `monitoring` has stats through
/// the first binding and metrics through the second, `debugger` has nodes/proxy.
fn chain() -> Vec<Authorizer> {
    vec![node_authorizer(), monitoring_policy()]
}

/// What `explain` makes of prom, of the group `monitoring`, asking `GET target` of [`chain`].
fn prom_gets(target: &str) -> Explanation {
    run(chain(), &user("prom", &["monitoring"]), Method::GET, target)
}

/// What `explain` makes of `method target` asked by `user` of `authorizers`.
fn run(authorizers: Vec<Authorizer>, user: &User, method: Method, target: &str) -> Explanation {
    block_on(explain(&decider(authorizers), &method, target, user))
}

#[test]
fn allowed_by_the_second_binding_names_it_and_its_role() {
    let e = prom_gets("/metrics");
    assert_eq!(e.exit_status(), EXIT_ALLOWED);
    assert_eq!(e.result.outcome, Outcome::Allowed);
    assert_eq!(e.result.status, None);
    assert_eq!(e.attributes.len(), 1);
    let trial = &e.attributes[0];
    assert_eq!(trial.subresource, "metrics");
    assert_eq!(trial.decision, Answer::Allow);
    assert_eq!(trial.decided_by, Some("Policy"));
    assert_eq!(trial.answers[0].answer, Answer::NoOpinion);
    assert_eq!(trial.answers[0].reason, "not a node identity");
    assert_eq!(
        trial.answers[1].reason,
        "RBAC: allowed by ClusterRoleBinding \"monitoring-metrics\" of ClusterRole \
         \"metrics-reader\" to Group \"monitoring\""
    );
}

#[test]
fn denied_with_no_match_gives_the_kubelets_403() {
    let e = prom_gets("/pods");
    assert_eq!(e.exit_status(), EXIT_NOT_ALLOWED);
    assert_eq!(e.subresources, ["pods", "proxy"]);
    let tried: Vec<_> = e.attributes.iter().map(|t| t.subresource).collect();
    assert_eq!(tried, ["pods", "proxy"]);
    assert!(e.attributes.iter().all(|t| t.decision == Answer::NoOpinion));
    assert_eq!(e.result.status, Some(403));
    assert_eq!(
        e.result.body.as_deref(),
        Some("Forbidden (user=prom, verb=get, resource=nodes, subresource(s)=[pods proxy])\n")
    );
    assert_eq!(
        e.result.headers.get("content-type").map(String::as_str),
        Some("text/plain; charset=utf-8")
    );
}

#[test]
fn falls_back_to_proxy_after_pods() {
    let e = run(chain(), &user("debugger", &[]), Method::GET, "/pods");
    assert_eq!(e.exit_status(), EXIT_ALLOWED);
    assert_eq!(e.attributes[0].decision, Answer::NoOpinion);
    assert_eq!(e.attributes[1].subresource, "proxy");
    assert_eq!(e.attributes[1].decision, Answer::Allow);
    assert!(
        e.attributes[1].answers[1]
            .reason
            .contains("\"debugger-proxy\"")
    );
}

#[test]
fn node_deny_stops_the_chain_and_later_authorizers_are_not_asked() {
    let chain = vec![node_authorizer(), Authorizer::AlwaysAllow];
    let other = user("system:node:node-b", &["system:nodes"]);
    let e = run(chain, &other, Method::GET, "/healthz");
    assert_eq!(e.exit_status(), EXIT_NOT_ALLOWED);
    for trial in &e.attributes {
        assert_eq!(trial.decision, Answer::Deny);
        assert_eq!(trial.decided_by, Some("Node"));
        assert_eq!(
            trial.answers[0].reason,
            "node identities may only access their own node's kubelet"
        );
        assert_eq!(trial.answers[1].answer, Answer::NotAsked);
    }
    assert_eq!(e.result.status, Some(403));
}

#[test]
fn unclean_path_stops_at_the_redirect_with_the_query_kept() {
    let e = prom_gets("//metrics/?x=1");
    assert_eq!(e.exit_status(), EXIT_NOT_ALLOWED);
    assert_eq!(
        e.path,
        PathVerdict::Redirect {
            location: "/metrics/?x=1".into()
        }
    );
    assert!(e.attributes.is_empty());
    assert_eq!(e.verb, None);
    assert_eq!(e.result.status, Some(301));
    assert_eq!(
        e.result.headers.get("location").map(String::as_str),
        Some("/metrics/?x=1")
    );
    assert_eq!(
        e.result.body.as_deref(),
        Some("<a href=\"/metrics/?x=1\">Moved Permanently</a>.\n\n")
    );

    let e = run(
        chain(),
        &user("prom", &[]),
        Method::GET,
        "/stats%2F..%2Fexec",
    );
    assert_eq!(e.result.outcome, Outcome::BadRequest);
    assert_eq!(e.result.status, Some(400));
    assert_eq!(
        e.result.body.as_deref(),
        Some("Bad Request: percent-encoded '/' in path\n")
    );
}

#[test]
fn json_document_has_the_documented_shape() {
    let e = prom_gets("/pods");
    let json: serde_json::Value = serde_json::from_str(&render_json(&e)).unwrap();
    assert_eq!(json["apiVersion"], API_VERSION);
    assert_eq!(json["kind"], "Explanation");
    assert_eq!(json["request"]["method"], "GET");
    assert_eq!(json["request"]["user"]["username"], "prom");
    assert_eq!(json["request"]["user"]["groups"][0], "monitoring");
    assert_eq!(json["nodeName"], NODE);
    assert_eq!(json["authorizers"], serde_json::json!(["Node", "Policy"]));
    assert_eq!(json["path"]["verdict"], "canonical");
    assert_eq!(json["path"]["decoded"], "/pods");
    assert_eq!(json["verb"], "get");
    assert_eq!(json["attributes"][1]["subresource"], "proxy");
    assert_eq!(json["attributes"][1]["decision"], "NoOpinion");
    assert_eq!(json["attributes"][1]["decidedBy"], serde_json::Value::Null);
    assert_eq!(json["attributes"][0]["answers"][1]["authorizer"], "Policy");
    assert_eq!(json["result"]["outcome"], "forbidden");
    assert_eq!(json["result"]["allowed"], false);
    assert_eq!(json["result"]["status"], 403);
    assert_eq!(json["warnings"], serde_json::json!([]));
}

#[test]
fn text_shows_each_answer_and_the_exact_body() {
    let e = prom_gets("/stats/summary");
    let text = render_text(&e);
    assert!(
        text.contains("path:        canonical (/stats/summary)"),
        "{text}"
    );
    assert!(
        text.contains("  get nodes/stats: allowed by Policy"),
        "{text}"
    );
    assert!(text.contains("monitoring-stats"), "{text}");
    assert!(text.contains("result:      allowed"), "{text}");

    let e = run(chain(), &user("x\u{1b}[2J", &[]), Method::HEAD, "/healthz");
    let text = render_text(&e);
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(
        text.contains("verb:        \"\" (HEAD maps to no verb"),
        "{text}"
    );
    assert!(text.contains("result:      403 forbidden"), "{text}");
    assert!(
        text.contains(r#"body: "Forbidden (user=x\u{1b}[2J, verb=, resource=nodes, subresource(s)=[healthz proxy])\n""#),
        "{text}"
    );
}

fn warnings_for(rules: &str, node: &str) -> Vec<PolicyWarning> {
    warnings_under(&AttributeMapping::default(), rules, node)
}

fn warnings_under(mapping: &AttributeMapping, rules: &str, node: &str) -> Vec<PolicyWarning> {
    let text = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n{rules}"
    );
    let p = PolicyAuthorizer::from_sources(&[("w.yaml".into(), text)]).unwrap();
    p.roles()
        .flat_map(|role| role_lint(&role, mapping, node).0)
        .collect()
}

/// Without fine-grained checks the kubelet never asks about nodes/pods: a rule for it is
/// dead there, and live with them.
#[test]
fn the_subresources_asked_follow_the_configured_mapping() {
    let rule = "- {apiGroups: [\"\"], resources: [nodes/pods], verbs: [get]}\n";
    assert!(warnings_for(rule, "n").is_empty());
    let coarse = AttributeMapping {
        fine_grained: false,
        ..AttributeMapping::default()
    };
    let w = warnings_under(&coarse, rule, "n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].rule_never_matches);
    assert!(
        w[0].message.contains("\"pods\" is never asked"),
        "{}",
        w[0].message
    );
}

#[test]
fn rules_that_cannot_match_are_named_with_file_role_and_index() {
    let w = warnings_for(
        "- {apiGroups: [\"\"], resources: [nodes/proxy], verbs: [get]}\n\
         - {apiGroups: [\"\"], resources: [nodes/stats], verbs: [list, watch]}\n\
         - {apiGroups: [apps], resources: [nodes/stats], verbs: [get]}\n\
         - {apiGroups: [\"\"], resources: [nodes/spec, nodes/metrics], verbs: [get, list]}\n\
         - {apiGroups: [\"\"], resources: [nodes], verbs: [get]}\n\
         - {apiGroups: [\"\"], resources: [nodes/stats], resourceNames: [node-b], verbs: [get]}\n\
         - {nonResourceURLs: [/metrics], verbs: [get]}\n\
         - {apiGroups: [\"*\"], resources: [\"*/stats\", \"nodes/*\", pods], resourceNames: [node-a], verbs: [\"*\"]}\n",
        "node-a",
    );
    let got: Vec<_> = w
        .iter()
        .map(|w| (w.rule, w.field, w.rule_never_matches))
        .collect();
    assert_eq!(
        got,
        [
            (1, "verbs", true),
            (1, "verbs", true),
            (2, "apiGroups", true),
            (3, "resources", false),
            (4, "resources", true),
            (5, "resourceNames", true),
            (6, "nonResourceURLs", true),
            (7, "resources", false),
        ]
    );
    assert_eq!(
        w[0].to_string(),
        "w.yaml:1: ClusterRole \"r\" rules[1]: verb \"list\" is never asked: the kubelet \
         asks only get, create, update, patch, delete (and \"\" for other methods); this \
         rule can never match a kubelet request"
    );
    assert!(w[3].message.contains("\"spec\""), "{}", w[3].message);
    assert!(w[7].message.contains("not a wildcard"), "{}", w[7].message);
    // The same policy on node-b: the resourceNames rule matches there.
    assert!(
        warnings_for(
            "- {apiGroups: [\"\"], resources: [nodes/stats], resourceNames: [node-b], verbs: [get]}\n",
            "node-b"
        )
        .is_empty()
    );
}

#[test]
fn identity_flags_build_the_user() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ExplainArgs,
    }
    let cli = Cli::try_parse_from([
        "x",
        "--user=alice",
        "--group=g1",
        "--group=g2",
        "--uid=42",
        "--extra=scopes=a",
        "--extra=scopes=b=c",
        "GET",
        "/pods",
    ])
    .unwrap();
    let u = cli.args.user();
    assert_eq!(u.name, "alice");
    assert_eq!(u.uid, "42");
    assert_eq!(u.groups, ["g1", "g2"]);
    assert_eq!(u.extra["scopes"], ["a", "b=c"]);

    let anon = Cli::try_parse_from(["x", "--anonymous", "GET", "/pods"]).unwrap();
    assert_eq!(anon.args.user().name, "system:anonymous");
    assert_eq!(anon.args.user().groups, ["system:unauthenticated"]);

    for bad in [
        vec!["x", "--user=a", "--extra=novalue", "GET", "/"],
        vec!["x", "--user=a", "--extra==v", "GET", "/"],
        vec!["x", "--user=a", "get", "/"],
        vec!["x", "GET", "/"],
        vec!["x", "--anonymous", "--user=a", "GET", "/"],
    ] {
        assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
    }
}

/// A dump of a cluster's RBAC: rules about other resources, and Kubernetes' own roles, are
/// counted, never listed; a rule meant for the kubelet is still named.
#[test]
fn rules_about_other_resources_and_default_roles_are_counted_not_listed() {
    let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata:
    name: system:node
    labels: {kubernetes.io/bootstrapping: rbac-defaults}
  rules:
  - {apiGroups: [""], resources: [nodes], verbs: [create, get, list, watch]}
  - {apiGroups: [""], resources: [nodes/status], verbs: [patch, update]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: prometheus}
  rules:
  - {apiGroups: [""], resources: [nodes/metrics, services, endpoints, pods], verbs: [get, list, watch]}
  - {apiGroups: [""], resources: [configmaps], verbs: [get]}
  - {nonResourceURLs: [/federate], verbs: [get]}
  - {nonResourceURLs: [/metrics], verbs: [get]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: typo}
  rules:
  - {apiGroups: [""], resources: [nodes/proxy, nodes/*, pods], verbs: [get, list]}
"#;
    let p = PolicyAuthorizer::from_sources(&[("dump.yaml".into(), text.into())]).unwrap();
    let lint = lint_policies([&p], &AttributeMapping::default(), "n");
    let named: Vec<_> = lint
        .warnings
        .iter()
        .map(|w| (w.role.as_str(), w.rule, w.field))
        .collect();
    assert_eq!(
        named,
        [
            ("prometheus", 3, "nonResourceURLs"),
            ("typo", 0, "resources")
        ]
    );
    assert!(lint.warnings[1].message.contains("not a wildcard"));
    // system:node's two rules, prometheus' configmaps and /federate rules.
    assert_eq!(lint.unlisted, UnlistedRules { rules: 4, roles: 2 });
    assert!(
        lint.unlisted
            .to_string()
            .starts_with("4 more rule(s) in 2 role(s) can never match"),
        "{}",
        lint.unlisted
    );
}

/// [`POD_POLICY`](crate::test_fixtures::POD_POLICY): alice's Role for pod team-a/web-0 also
/// holds a nodes/proxy rule, which no request can match.
#[test]
fn the_pod_level_set_is_shown_after_the_kubelets_own() {
    let alice = user("alice", &[]);
    let e = block_on(explain(
        &pod_decider(true),
        &Method::GET,
        "/exec/team-a/web-0/app?command=sh",
        &alice,
    ));
    assert!(e.result.allowed);
    let tried: Vec<_> = e.attributes.iter().map(|t| t.subresource).collect();
    assert_eq!(tried, ["proxy", "pods/exec"]);
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(
        json["podAttributes"],
        serde_json::json!({
            "resource": "pods/exec", "verb": "create", "namespace": "team-a", "name": "web-0"
        })
    );
    let text = render_text(&e);
    assert!(
        text.contains(
            "attributes:  nodes/proxy, create pods/exec on pod team-a/web-0 (--pod-scoped-authz)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "  create nodes/proxy: no authorizer allowed; the next attribute set is tried"
        ),
        "{text}"
    );
    assert!(
        text.contains("  create pods/exec team-a/web-0: allowed by Policy"),
        "{text}"
    );
    // The Role's nodes/proxy rule can never match: a Role is only asked about pods.
    assert_eq!(e.warnings.len(), 1, "{:?}", e.warnings);
    assert_eq!(
        e.warnings[0].to_string(),
        "pods.yaml:2: Role \"team-a/web-0-debugger\" rules[2]: resource \"nodes/proxy\" never \
         matches: the kubelet asks only about pods/log, pods/exec, pods/attach, \
         pods/portforward; this rule can never match a kubelet request"
    );

    // Without the flag, no pod-level set, and the Role is named as never applying.
    let e = block_on(explain(
        &pod_decider(false),
        &Method::GET,
        "/exec/team-a/web-0/app",
        &alice,
    ));
    assert!(!e.result.allowed);
    assert!(e.pod_attributes.is_none());
    assert!(
        serde_json::to_value(&e)
            .unwrap()
            .get("podAttributes")
            .is_none()
    );
    assert_eq!(e.warnings.len(), 1, "{:?}", e.warnings);
    assert!(
        e.warnings[0]
            .to_string()
            .contains("Role \"team-a/web-0-debugger\" rules[0]: a Role is asked about only by the pod-level attributes of --pod-scoped-authz, which is off"),
        "{}",
        e.warnings[0]
    );
}

/// With the flag, `pods/<subresource>` rules of a ClusterRole are live; without it, they are
/// about another resource and only counted.
#[test]
fn pod_rules_are_live_only_with_pod_scoped_authz() {
    let rule = "- {apiGroups: [\"\"], resources: [pods/exec, pods/log, pods/status], verbs: [create, get], resourceNames: [web-0]}\n";
    let on = AttributeMapping {
        pod_scoped: true,
        ..AttributeMapping::default()
    };
    let warnings = warnings_under(&on, rule, "n");
    assert!(warnings.is_empty(), "{warnings:?}");
    let node_rule = "- {apiGroups: [\"\"], resources: [nodes/proxy, pods/exec], verbs: [get], resourceNames: [web-0]}\n";
    let warnings = warnings_under(&on, node_rule, "n");
    assert!(
        warnings.is_empty(),
        "resourceNames may name pods: {warnings:?}"
    );
    let warnings = warnings_for(rule, "n");
    assert!(
        warnings.is_empty(),
        "not meant for the kubelet: {warnings:?}"
    );
    let wildcard = "- {apiGroups: [\"\"], resources: [pods], verbs: [get]}\n";
    let warnings = warnings_under(&on, wildcard, "n");
    assert!(
        warnings.is_empty(),
        "about pods themselves, not the kubelet: {warnings:?}"
    );
}

/// A Webhook authorizer with these match conditions and failure policy, reviewing with an API
/// server that is not there (127.0.0.1:1): only its conditions can decide. Its client is built in
/// a runtime of its own, as kube needs one, and never connects.
fn webhook(conditions: &[&str], failure_policy: FailurePolicy) -> Authorizer {
    static BUILT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kap-explain-webhook-{}-{}",
        std::process::id(),
        BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
         users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\n",
    )
    .unwrap();
    let spec = WebhookSpec {
        name: "authz-webhook".into(),
        kubeconfig: Some(kubeconfig.clone()),
        timeout: Duration::from_secs(1),
        authorized_ttl: Duration::from_secs(300),
        unauthorized_ttl: Duration::from_secs(30),
        failure_policy,
        match_conditions: MatchConditions::compile(conditions.iter().copied()).unwrap(),
    };
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { ApiServerSettings::read(Some(&kubeconfig), spec.timeout) })
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Authorizer::Webhook(Arc::new(SubjectAccessReviewAuthorizer::new(
        ApiServerClient::new(client, 1, Arc::new(ApiServerMetrics::default())),
        &spec,
        &AuthzMetrics::default(),
    )))
}

#[test]
fn a_false_match_condition_skips_the_webhook_and_shows_each_result() {
    let chain = vec![
        webhook(
            &[
                "request.user != ''",
                "!('system:nodes' in request.groups)",
                "request.user.startsWith('system:serviceaccount:')",
            ],
            FailurePolicy::Deny,
        ),
        Authorizer::AlwaysAllow,
    ];
    let node = user("system:node:node-a", &["system:nodes"]);
    let e = run(chain, &node, Method::GET, "/healthz");
    assert_eq!(e.exit_status(), EXIT_ALLOWED);
    let webhook = &e.attributes[0].answers[0];
    assert_eq!(webhook.answer, Answer::NoOpinion);
    assert_eq!(
        webhook.reason,
        "webhook not asked: a matchCondition is false"
    );
    let results: Vec<_> = webhook.match_conditions.iter().map(|c| c.result).collect();
    assert_eq!(
        results,
        [
            ConditionOutcome::True,
            ConditionOutcome::False,
            ConditionOutcome::NotEvaluated
        ]
    );
    assert_eq!(webhook.webhook, Some(WebhookStep::Skipped));
    assert_eq!(e.attributes[0].decided_by, Some("AlwaysAllow"));

    let json: serde_json::Value = serde_json::from_str(&render_json(&e)).unwrap();
    assert_eq!(
        json["attributes"][0]["answers"][0]["matchConditions"][1],
        serde_json::json!({"expression": "!('system:nodes' in request.groups)", "result": "false"})
    );
    assert_eq!(
        json["attributes"][0]["answers"][0]["matchConditions"][2]["result"],
        "notEvaluated"
    );
    assert_eq!(json["attributes"][0]["answers"][0]["webhook"], "skipped");
    // Authorizers without conditions have neither field.
    let always_allow = json["attributes"][0]["answers"][1].as_object().unwrap();
    assert!(!always_allow.contains_key("matchConditions"));
    assert!(!always_allow.contains_key("webhook"));

    let text = render_text(&e);
    for line in [
        "    Webhook      NoOpinion  webhook not asked: a matchCondition is false\n",
        "      condition true          request.user != ''\n",
        "      condition false         !('system:nodes' in request.groups)\n",
        "      condition not evaluated request.user.startsWith('system:serviceaccount:')\n",
        "      webhook skipped: a condition is false (no opinion)\n",
        "    AlwaysAllow  Allow      AlwaysAllow\n",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
}

#[test]
fn a_match_condition_error_follows_the_failure_policy() {
    let error = "request.nonResourceAttributes.path == '/healthz'";
    let alice = user("alice", &[]);

    // Deny: the chain stops at the error; the proxy's 500.
    let chain = vec![
        webhook(&[error, "true"], FailurePolicy::Deny),
        Authorizer::AlwaysAllow,
    ];
    let e = run(chain, &alice, Method::GET, "/healthz");
    assert_eq!(e.exit_status(), EXIT_ERROR);
    assert_eq!(e.result.status, Some(500));
    let trial = &e.attributes[0];
    assert_eq!(trial.decision, Answer::Error);
    assert_eq!(trial.answers[0].answer, Answer::Error);
    assert_eq!(
        trial.answers[0].reason,
        "matchConditions: cel evaluation error: expression \
         'request.nonResourceAttributes.path == '/healthz'' resulted in error: \
         No such key: nonResourceAttributes"
    );
    assert_eq!(trial.answers[0].webhook, Some(WebhookStep::NotCalled));
    assert_eq!(
        trial.answers[0].match_conditions[0].error.as_deref(),
        Some("No such key: nonResourceAttributes")
    );
    assert_eq!(trial.answers[1].answer, Answer::NotAsked);
    let text = render_text(&e);
    for line in [
        "      condition error         request.nonResourceAttributes.path == '/healthz'\n",
        "        error: No such key: nonResourceAttributes\n",
        "      condition true          true\n",
        "      webhook not called: a condition could not be evaluated (the failurePolicy answers)\n",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }

    // NoOpinion: the error is kept while the next authorizer decides; it allows.
    let chain = vec![
        webhook(&[error], FailurePolicy::NoOpinion),
        Authorizer::AlwaysAllow,
    ];
    let e = run(chain, &alice, Method::GET, "/healthz");
    assert_eq!(e.exit_status(), EXIT_ALLOWED);
    assert_eq!(e.attributes[0].answers[0].answer, Answer::Error);
    assert_eq!(e.attributes[0].answers[1].answer, Answer::Allow);
}
