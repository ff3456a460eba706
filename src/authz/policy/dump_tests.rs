//! A cluster's RBAC dump as it is (`tests/data/rbac-dump.yaml`) and aggregated ClusterRoles.

use super::tests::decide;
use super::*;
use crate::authn::User;
use crate::authz::attributes::AttributeMapping;
use crate::authz::policy::lint::{UnlistedRules, lint_policies};
use crate::test_data::{RBAC_DUMP, text};
use crate::test_fixtures::user;

/// The node every request of these tests is for.
const NODE: &str = "node-1";

fn dump_text() -> String {
    text(RBAC_DUMP)
}

fn load(text: &str) -> PolicyAuthorizer {
    PolicyAuthorizer::from_sources(&[("dump.yaml".into(), text.into())])
        .unwrap_or_else(|e| panic!("{e}"))
}

fn rules_of<'p>(p: &'p PolicyAuthorizer, name: &str) -> PolicyRole<'p> {
    p.roles()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name}"))
}

#[test]
fn a_cluster_dump_loads_as_it_is_and_answers_as_rbac_does() {
    let p = load(&dump_text());
    assert_eq!(
        p.stats(),
        PolicyStats {
            cluster_roles: 17,
            cluster_role_bindings: 13,
            roles: 0,
            role_bindings: 0,
            rules: 53,
        }
    );
    let allowed = |u: &User, verb, sub| match decide(&p, u, verb, sub, NODE) {
        Decision::Allow(reason) => Some(reason.to_string()),
        _ => None,
    };
    assert_eq!(
        allowed(&user("alice", &["system:masters"]), "create", "proxy").as_deref(),
        Some(
            "RBAC: allowed by ClusterRoleBinding \"cluster-admin\" of ClusterRole \
             \"cluster-admin\" to Group \"system:masters\""
        )
    );
    let apiserver = user("kube-apiserver-kubelet-client", &["system:authenticated"]);
    assert_eq!(
        allowed(&apiserver, "create", "proxy").as_deref(),
        Some(
            "RBAC: allowed by ClusterRoleBinding \"kubeadm:apiserver-kubelet-client\" of \
             ClusterRole \"system:kubelet-api-admin\" to User \"kube-apiserver-kubelet-client\""
        )
    );
    assert!(allowed(&apiserver, "get", "stats").is_some());
    // Not in system:kubelet-api-admin as this dump has it.
    assert_eq!(allowed(&apiserver, "create", "checkpoint"), None);
    // view, edit and admin (aggregated) are about namespaced objects: nothing on the kubelet.
    for group in ["dev-team", "platform"] {
        for (verb, sub) in [("get", "stats"), ("create", "proxy"), ("get", "pods")] {
            assert_eq!(allowed(&user("bob", &[group]), verb, sub), None, "{group}");
        }
    }
    // list and watch on everything never match a kubelet request, which asks get, create, ….
    assert_eq!(
        allowed(&user("system:kube-controller-manager", &[]), "get", "proxy"),
        None
    );
    let metrics_server = user("system:serviceaccount:kube-system:metrics-server", &[]);
    assert_eq!(allowed(&metrics_server, "get", "metrics"), None);
}

#[test]
fn in_a_dump_only_rules_meant_for_the_kubelet_are_named() {
    let p = load(&dump_text());
    let lint = lint_policies([&p], &AttributeMapping::default(), NODE);
    let named: Vec<_> = lint
        .warnings
        .iter()
        .map(|w| (w.role.as_str(), w.rule, w.field))
        .collect();
    // kubeadm's `get nodes` (the Node object) is the only rule outside Kubernetes' own roles
    // that names nodes in the core group.
    assert_eq!(named, [("kubeadm:get-nodes", 0, "resources")]);
    // Every rule of the 15 default roles but the two that can match (cluster-admin's `*` and
    // system:kubelet-api-admin's nodes/… rule), and the metrics-server role's (metrics.k8s.io).
    assert_eq!(
        lint.unlisted,
        UnlistedRules {
            rules: 50,
            roles: 16
        }
    );
}

/// Each aggregated role of the dump, its rules removed, is filled in again from the other roles
/// exactly as the clusterrole-aggregation controller wrote it.
#[test]
fn aggregation_recomputes_the_rules_the_controller_wrote() {
    let text = dump_text();
    let dump = load(&text);
    let mut value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let mut emptied = 0;
    for item in value["items"].as_array_mut().unwrap() {
        if item.get("aggregationRule").is_some() {
            item["rules"] = serde_json::Value::Null;
            emptied += 1;
        }
    }
    assert_eq!(emptied, 3);
    // JSON is YAML.
    let rebuilt = load(&value.to_string());
    for name in ["admin", "edit", "view"] {
        let (written, filled) = (rules_of(&dump, name), rules_of(&rebuilt, name));
        assert!(!written.aggregated && filled.aggregated, "{name}");
        assert!(!filled.rules.is_empty(), "{name}");
        assert_eq!(filled.rules, written.rules, "{name}");
    }
    assert_eq!(rules_of(&rebuilt, "admin").rules.len(), 9);
}

#[test]
fn aggregation_follows_selectors_in_order_and_roles_by_name() {
    let text = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleList
items:
- metadata:
    name: node-readers
    labels: {example.com/kubelet: read}
  aggregationRule:
    clusterRoleSelectors:
    - matchExpressions:
      - {key: example.com/kubelet, operator: In, values: [read, inspect]}
      - {key: example.com/retired, operator: DoesNotExist}
    - matchLabels: {tier: ops}
- metadata: {name: b-logs, labels: {example.com/kubelet: read}}
  rules: [{apiGroups: [""], resources: [nodes/log], verbs: [get]}]
- metadata: {name: a-stats, labels: {example.com/kubelet: inspect}}
  rules: [{apiGroups: [""], resources: [nodes/stats], verbs: [get]}]
- metadata: {name: c-exec, labels: {example.com/kubelet: write}}
  rules: [{apiGroups: [""], resources: [nodes/proxy], verbs: [create]}]
- metadata: {name: e-old, labels: {example.com/kubelet: read, example.com/retired: "2025"}}
  rules: [{apiGroups: [""], resources: [nodes/configz], verbs: [get]}]
- metadata: {name: d-ops, labels: {tier: ops}}
  rules:
  - {apiGroups: [""], resources: [nodes/metrics], verbs: [get]}
  - {apiGroups: [""], resources: [nodes/log], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBindingList
items:
- metadata: {name: readers}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-readers}
  subjects: [{kind: Group, name: readers}]
"#;
    let p = load(text);
    let role = rules_of(&p, "node-readers");
    let resources: Vec<&str> = role.rules.iter().map(|r| r.resources[0].as_str()).collect();
    // First selector: a-stats, b-logs (by name; e-old is retired, c-exec not selected, the
    // role itself skipped); second: d-ops, whose nodes/log rule is already there.
    assert_eq!(resources, ["nodes/stats", "nodes/log", "nodes/metrics"]);
    let reader = user("r", &["readers"]);
    assert!(matches!(
        decide(&p, &reader, "get", "log", NODE),
        Decision::Allow(_)
    ));
    assert!(matches!(
        decide(&p, &reader, "create", "proxy", NODE),
        Decision::NoOpinion(_)
    ));
    assert!(matches!(
        decide(&p, &reader, "get", "configz", NODE),
        Decision::NoOpinion(_)
    ));
}

#[test]
fn aggregated_roles_selecting_each_other_settle() {
    let text = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleList
items:
- metadata: {name: ping, labels: {x: "1"}}
  aggregationRule: {clusterRoleSelectors: [{matchLabels: {y: "1"}}, {matchExpressions: [{key: z, operator: NotIn, values: ["0"]}]}]}
- metadata: {name: pong, labels: {y: "1"}}
  aggregationRule: {clusterRoleSelectors: [{matchLabels: {x: "1"}}]}
- metadata: {name: source, labels: {y: "1", z: "0"}}
  rules: [{apiGroups: [""], resources: [nodes/stats], verbs: [get]}]
"#;
    let p = load(text);
    // ping: pong and source through the first selector; the second selects every role without
    // z=0 (pong, ping itself skipped). pong: ping.
    for name in ["ping", "pong"] {
        let role = rules_of(&p, name);
        assert_eq!(role.rules.len(), 1, "{name}");
        assert_eq!(role.rules[0].resources, ["nodes/stats"], "{name}");
    }
}
