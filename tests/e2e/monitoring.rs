//! The alerting rules and the dashboard under `config/monitoring/` hold together with the proxy
//! and its documentation: the PrometheusRule is the rules file wrapped (generated from it), every
//! alert has a runbook section and a promtool test that fires it, and every metric a rule or a
//! dashboard panel names is one a running proxy exports, with the labels and label values the
//! queries ask for. So a renamed metric or label breaks the build, not an alert. promtool itself
//! (`check rules`, `test rules`, the dashboard's queries parsing) runs in
//! `config/monitoring/test.sh`, which `.ci/run` calls.

use std::collections::{BTreeMap, BTreeSet};

use http::StatusCode;
use serde_json::Value;

use crate::manifests::{file, read};
use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, TokenUser, Verdict};
use crate::support::eventually;
use crate::support::harness::ProxySpec;

/// Where every `runbook_url` points: docs/RUNBOOK.md of the project's repository, one section
/// per alert, anchored by the alert's name in lower case.
const RUNBOOK_URL: &str =
    "https://github.com/kubelet-auth-proxy/kubelet-auth-proxy/blob/main/docs/RUNBOOK.md";

/// What the PrometheusRule says before the rules file's `groups:`.
const PROMETHEUS_RULE_HEAD: &str = "\
# The rules of alerts.yaml as a PrometheusRule for the Prometheus Operator. Generated from
# alerts.yaml by
#   KAP_UPDATE_MONITORING=1 cargo test --test e2e monitoring::
# Do not edit: edit alerts.yaml and run that. The labels below are those kube-prometheus's
# Prometheus selects rules by (prometheus: k8s, role: alert-rules); for the kube-prometheus-stack
# Helm chart add `release: <its release name>`, or whatever your Prometheus's ruleSelector asks
# (docs/OPERATIONS.md, \"Alerts and the dashboard\").
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kubelet-auth-proxy
  namespace: kube-system
  labels:
    app.kubernetes.io/name: kubelet-auth-proxy
    prometheus: k8s
    role: alert-rules
spec:
";

/// The PrometheusRule for a rules file: its `groups:` and all that follows, indented under
/// `spec:`, so comments, block scalars and order stay as written.
fn prometheus_rule(rules: &str) -> String {
    let start = rules
        .find("\ngroups:\n")
        .expect("alerts.yaml has a top-level `groups:`")
        + 1;
    let mut out = String::from(PROMETHEUS_RULE_HEAD);
    for line in rules[start..].lines() {
        if !line.is_empty() {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

fn yaml(relative: &str) -> Value {
    serde_saphyr::from_str(&read(&file(relative))).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// Every rule of the rules file, in order.
fn rules() -> Vec<Value> {
    let source = yaml("config/monitoring/alerts.yaml");
    let groups = source["groups"].as_array().expect("groups is a list");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules is a list").clone())
        .collect()
}

fn text<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {value}"))
}

#[test]
fn the_prometheus_rule_is_the_rules_file_wrapped() {
    let source = read(&file("config/monitoring/alerts.yaml"));
    let wanted = prometheus_rule(&source);
    let path = file("config/monitoring/prometheus-rule.yaml");
    if std::env::var_os("KAP_UPDATE_MONITORING").is_some() {
        std::fs::write(&path, &wanted).unwrap();
    }
    assert!(
        read(&path) == wanted,
        "config/monitoring/prometheus-rule.yaml is not alerts.yaml wrapped: run \
         `KAP_UPDATE_MONITORING=1 cargo test --test e2e monitoring::` and commit the result"
    );
    // The wrapping keeps the meaning: the same groups, read back.
    let wrapped = yaml("config/monitoring/prometheus-rule.yaml");
    assert_eq!(wrapped["kind"], "PrometheusRule");
    assert_eq!(wrapped["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        wrapped["spec"],
        yaml("config/monitoring/alerts.yaml"),
        "spec is the rules file"
    );
}

/// The sections of docs/RUNBOOK.md headed by an alert's name (`### Name`), with their text.
fn runbook_sections() -> BTreeMap<String, String> {
    let runbook = read(&file("docs/RUNBOOK.md"));
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in runbook.lines() {
        if line.starts_with("## ") || line.starts_with("### ") {
            if let Some((name, body)) = current.take() {
                sections.insert(name, body);
            }
            if let Some(name) = line.strip_prefix("### KubeletAuthProxy") {
                current = Some((format!("KubeletAuthProxy{name}"), String::new()));
            }
            continue;
        }
        if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((name, body)) = current {
        sections.insert(name, body);
    }
    sections
}

#[test]
fn every_alert_has_a_severity_a_text_and_a_runbook_section() {
    let sections = runbook_sections();
    let mut alerts = BTreeSet::new();
    for rule in rules() {
        let name = text(&rule["alert"], "a rule's alert").to_owned();
        let severity = text(&rule["labels"]["severity"], &format!("{name}'s severity"));
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                !text(&rule["annotations"][annotation], annotation).is_empty(),
                "{name}: empty {annotation}"
            );
        }
        assert_eq!(
            text(&rule["annotations"]["runbook_url"], "runbook_url"),
            format!("{RUNBOOK_URL}#{}", name.to_lowercase()),
            "{name}: runbook_url is its section of docs/RUNBOOK.md"
        );
        let section = sections
            .get(&name)
            .unwrap_or_else(|| panic!("docs/RUNBOOK.md has no section `### {name}`"));
        for part in ["**What it means.**", "**Confirm.**", "**What to do.**"] {
            assert!(
                section.contains(part),
                "{name}'s runbook section lacks {part}"
            );
        }
        let confirm = &section[section.find("**Confirm.**").unwrap()..];
        assert!(
            confirm.contains("```"),
            "{name}'s runbook section confirms with no command"
        );
        alerts.insert(name);
    }
    let orphans: Vec<_> = sections.keys().filter(|s| !alerts.contains(*s)).collect();
    assert!(
        orphans.is_empty(),
        "runbook sections of no alert: {orphans:?}"
    );
}

#[test]
fn every_alert_and_severity_has_a_promtool_test_that_fires_it_and_one_that_does_not() {
    let tests = yaml("config/monitoring/alerts.test.yaml");
    assert_eq!(tests["rule_files"], serde_json::json!(["alerts.yaml"]));
    let mut fired: BTreeSet<(String, String)> = BTreeSet::new();
    let mut quiet: BTreeSet<String> = BTreeSet::new();
    for test in tests["tests"].as_array().expect("tests is a list") {
        for case in test["alert_rule_test"].as_array().expect("alert_rule_test") {
            let name = text(&case["alertname"], "alertname").to_owned();
            let expected = case["exp_alerts"].as_array().expect("exp_alerts is a list");
            if expected.is_empty() {
                quiet.insert(name.clone());
            }
            for alert in expected {
                let severity = text(&alert["exp_labels"]["severity"], "severity");
                fired.insert((name.clone(), severity.to_owned()));
            }
        }
    }
    for rule in rules() {
        let name = text(&rule["alert"], "alert").to_owned();
        let severity = text(&rule["labels"]["severity"], "severity").to_owned();
        assert!(
            fired.contains(&(name.clone(), severity.clone())),
            "alerts.test.yaml never fires {name} ({severity})"
        );
        assert!(
            quiet.contains(&name),
            "alerts.test.yaml never checks that {name} stays quiet"
        );
    }
}

/// A metric a query names: the name and the matchers written with it.
#[derive(Debug)]
struct Reference {
    metric: String,
    /// `(label, operator, value)` of each matcher in braces after the name.
    matchers: Vec<(String, String, String)>,
}

/// Every `kubelet_auth_proxy_*` name in a PromQL expression, with its matchers.
fn references(expr: &str) -> Vec<Reference> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("kubelet_auth_proxy_") {
        let after = &rest[at..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(after.len());
        let metric = after[..end].to_owned();
        let mut matchers = Vec::new();
        rest = &after[end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let close = inner.find('}').expect("a closing brace");
            for matcher in inner[..close].split(',').map(str::trim) {
                let op_at = matcher
                    .find(['=', '!'])
                    .unwrap_or_else(|| panic!("a matcher without an operator: {matcher}"));
                let (label, op_value) = matcher.split_at(op_at);
                let op_len = if ["!=", "!~", "=~"].iter().any(|op| op_value.starts_with(op)) {
                    2
                } else {
                    1
                };
                let (op, value) = op_value.split_at(op_len);
                matchers.push((
                    label.trim().to_owned(),
                    op.to_owned(),
                    value.trim().trim_matches('"').to_owned(),
                ));
            }
            rest = &inner[close + 1..];
        }
        found.push(Reference { metric, matchers });
    }
    found
}

/// The label names of `by (…)`, `without (…)`, `on (…)` and `ignoring (…)` clauses.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut labels = Vec::new();
    for keyword in ["by", "without", "on", "ignoring"] {
        let mut rest = expr;
        while let Some(at) = rest.find(&format!("{keyword} (")) {
            let preceded_by_word = rest[..at]
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let inner = &rest[at + keyword.len() + 2..];
            let close = inner.find(')').expect("a closing parenthesis");
            if !preceded_by_word {
                labels.extend(
                    inner[..close]
                        .split(',')
                        .map(|l| l.trim().to_owned())
                        .filter(|l| !l.is_empty()),
                );
            }
            rest = &inner[close..];
        }
    }
    labels
}

/// The samples of an exposition by name: the label sets each name has.
fn exposition(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut samples: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).expect("a sample line");
        let name = &line[..name_end];
        let mut labels = BTreeMap::new();
        if let Some(inner) = line[name_end..].strip_prefix('{') {
            let inner = &inner[..inner.rfind('}').expect("a closing brace")];
            for pair in inner.split("\",") {
                let (label, value) = pair.split_once('=').expect("label=\"value\"");
                labels.insert(label.to_owned(), value.trim_matches('"').to_owned());
            }
        }
        samples.entry(name.to_owned()).or_default().push(labels);
    }
    samples
}

/// Labels Prometheus adds to every series it scrapes (target labels), and the histogram bucket
/// bound, which no query needs the proxy to write beside the others.
const SCRAPE_LABELS: [&str; 3] = ["job", "instance", "le"];

/// Every query of the rules and the dashboard, with where it comes from, and the label names
/// each alert's text uses (`$labels.name`).
fn queries() -> Vec<(String, String, Vec<String>)> {
    let mut queries = Vec::new();
    for rule in rules() {
        let name = text(&rule["alert"], "alert").to_owned();
        let mut templated = Vec::new();
        for annotation in ["summary", "description"] {
            let mut rest = text(&rule["annotations"][annotation], annotation);
            while let Some(at) = rest.find("$labels.") {
                let after = &rest[at + "$labels.".len()..];
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                templated.push(after[..end].to_owned());
                rest = &after[end..];
            }
        }
        queries.push((
            format!("alert {name}"),
            text(&rule["expr"], "expr").to_owned(),
            templated,
        ));
    }
    let dashboard: Value =
        serde_json::from_str(&read(&file("config/monitoring/dashboard.json"))).unwrap();
    fn walk(value: &Value, title: &str, out: &mut Vec<(String, String, Vec<String>)>) {
        match value {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
                if let Some(expr) = map.get("expr").and_then(Value::as_str) {
                    out.push((format!("panel {title:?}"), expr.to_owned(), Vec::new()));
                }
                for child in map.values() {
                    walk(child, title, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, title, out)),
            _ => {}
        }
    }
    let before = queries.len();
    walk(&dashboard, "dashboard", &mut queries);
    assert!(queries.len() > before, "the dashboard has no query");
    queries
}

#[tokio::test]
async fn every_metric_and_label_the_rules_and_the_dashboard_name_is_exported() {
    // A proxy using every part a query looks at: the RBAC and Webhook modes (watches, reviews),
    // bearer tokens (TokenReview), a JWT issuer of --authentication-config, an audit log with its
    // flood budget and the shipped policy.
    let api = ApiServer::start().await;
    api.add_token("grafana-token", TokenUser::new("grafana"));
    // Grafana may read stats (allowed: a forwarded request); the rest has no opinion (forbidden).
    api.set_rules(|review| {
        Verdict::allow_when(review.user == "grafana" && review.subresource == "stats")
    });
    let dir = TempDir::new("monitoring");
    let audit_log = format!(
        "--audit-log-path={}",
        dir.path().join("audit.log").display()
    );
    let audit_policy = format!(
        "--audit-policy-file={}",
        file("config/audit-policy.yaml").display()
    );
    // A JWT issuer nobody serves: its counters exist from the start.
    let authentication_config = dir.path().join("authentication-config.yaml");
    std::fs::write(
        &authentication_config,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n\
         jwt:\n- issuer: {url: 'https://127.0.0.1:9/issuer', audiences: [kubelet]}\n  \
         claimMappings: {username: {claim: sub, prefix: 'oidc:'}}\n",
    )
    .unwrap();
    let authentication_config = format!(
        "--authentication-config={}",
        authentication_config.display()
    );
    let h = ProxySpec::new(&[
        "--authorization-mode=RBAC,Webhook",
        "--rbac-start-jitter=0s",
        "--authentication-token-webhook",
        &authentication_config,
        &audit_log,
        &audit_policy,
    ])
    .apiserver(&api)
    .start()
    .await;
    eventually(
        "/readyz once the RBAC mode's first lists are in force",
        || async { (h.admin_get("/readyz").await.status == StatusCode::OK).then_some(()) },
    )
    .await;
    // A certificate user and a token user: requests decided, reviews made and cached.
    for path in ["/stats/summary", "/pods"] {
        h.user("alice", &[]).get(path).await;
        h.bearer_get(path, "grafana-token").await;
    }
    let reply = h.admin_get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    let exported = exposition(&reply.text());

    let mut problems = Vec::new();
    for (origin, expr, templated) in queries() {
        let refs = references(&expr);
        if refs.is_empty() {
            problems.push(format!(
                "{origin}: names no kubelet_auth_proxy_ metric: {expr}"
            ));
        }
        let mut labels_here = BTreeSet::new();
        for reference in &refs {
            let Some(samples) = exported.get(&reference.metric) else {
                problems.push(format!("{origin}: {} is not exported", reference.metric));
                continue;
            };
            labels_here.extend(samples.iter().flat_map(|s| s.keys().cloned()));
            for (label, op, value) in &reference.matchers {
                if SCRAPE_LABELS.contains(&label.as_str()) {
                    continue;
                }
                let has_label = samples.iter().any(|s| s.contains_key(label));
                let has_value = samples
                    .iter()
                    .any(|s| s.get(label).map(String::as_str) == Some(value.as_str()));
                if !has_label {
                    problems.push(format!(
                        "{origin}: {} has no label {label}",
                        reference.metric
                    ));
                } else if (op == "=" || op == "!=") && !has_value {
                    problems.push(format!(
                        "{origin}: {} never has {label}=\"{value}\"",
                        reference.metric
                    ));
                }
            }
        }
        for label in grouping_labels(&expr).into_iter().chain(templated) {
            if !SCRAPE_LABELS.contains(&label.as_str()) && !labels_here.contains(&label) {
                problems.push(format!(
                    "{origin}: no metric of the query has the label {label}: {expr}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks above would let a query through that names nothing they can see: each reading
/// helper finds what a query says.
#[test]
fn the_query_reader_finds_names_matchers_and_grouping_labels() {
    let expr = "sum by (kind, cause) (rate(kubelet_auth_proxy_apiserver_review_failures_total\
                {job=~\"$job\", cause!=\"busy\"}[5m])) / ignoring (cause) group_left \
                kubelet_auth_proxy_connections_limit > 0";
    let refs = references(expr);
    assert_eq!(refs.len(), 2);
    assert_eq!(
        refs[0].metric,
        "kubelet_auth_proxy_apiserver_review_failures_total"
    );
    assert_eq!(
        refs[0].matchers,
        vec![
            ("job".to_owned(), "=~".to_owned(), "$job".to_owned()),
            ("cause".to_owned(), "!=".to_owned(), "busy".to_owned()),
        ]
    );
    assert_eq!(refs[1].metric, "kubelet_auth_proxy_connections_limit");
    assert!(refs[1].matchers.is_empty());
    assert_eq!(grouping_labels(expr), ["kind", "cause", "cause"]);
    let samples = exposition(
        "# TYPE x counter\nkubelet_auth_proxy_x_total{a=\"1\",b=\"two, three\"} 4\n\
         kubelet_auth_proxy_y 1\n# EOF\n",
    );
    assert_eq!(samples["kubelet_auth_proxy_x_total"][0]["b"], "two, three");
    assert!(samples["kubelet_auth_proxy_y"][0].is_empty());
}
