//! Loading, refusals and matching, the matching cases after kube-apiserver's checker tests.

use std::sync::Arc;

use super::lint::{ActSample, act_warnings};
use super::*;
use crate::test_fixtures::user;

fn node(subresource: &'static str) -> ObjectRef {
    ObjectRef {
        resource: "nodes",
        namespace: None,
        subresource,
        name: Arc::from("node-1"),
    }
}

fn pod(namespace: &str, subresource: &'static str) -> ObjectRef {
    ObjectRef {
        resource: "pods",
        namespace: Some(Arc::from(namespace)),
        subresource,
        name: Arc::from("web-0"),
    }
}

fn policy(rules: &str) -> AuditPolicy {
    let text = format!("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n{rules}");
    AuditPolicy::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn refusal(text: &str) -> String {
    match AuditPolicy::parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn rule_of(
    policy: &AuditPolicy,
    user: Option<&User>,
    verb: &str,
    object: Option<&ObjectRef>,
    path: &str,
) -> Option<usize> {
    policy
        .decide(&PolicyRequest {
            user,
            verb,
            object_ref: object,
            path,
        })
        .rule
}

#[test]
fn reads_yaml_and_json_with_metadata_and_managed_fields() {
    let yaml = policy(
        "- level: None\n  users: [\"system:serviceaccount:monitoring:prometheus\"]\n  \
         omitManagedFields: true\n- level: Metadata\n",
    );
    assert_eq!(yaml.rules.len(), 2);
    let json = AuditPolicy::parse(
        r#"{"apiVersion":"audit.k8s.io/v1","kind":"Policy","metadata":{"name":"p"},
            "omitManagedFields":true,"omitStages":["RequestReceived"],
            "rules":[{"level":"Metadata","nonResourceURLs":["/healthz*"]}]}"#,
    )
    .expect("JSON policy");
    assert_eq!(json.rules.len(), 1);
}

#[test]
fn body_levels_are_refused_naming_the_rule() {
    for level in ["Request", "RequestResponse"] {
        let message = refusal(&format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n- level: {level}\n"
        ));
        assert!(message.starts_with("rules[1].level: "), "{message}");
        assert!(message.contains("records request bodies"), "{message}");
        assert!(message.contains("use Metadata"), "{message}");
    }
}

#[test]
fn malformed_policies_are_refused_with_the_field() {
    let cases = [
        (
            "apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]",
            "apiVersion: \"audit.k8s.io/v1beta1\" is not read",
        ),
        (
            "kind: Policy\nrules: [{level: None}]",
            "apiVersion: missing",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Event\nrules: [{level: None}]",
            "kind: \"Event\" is not an audit policy",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []",
            "rules: no rule",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{users: [a]}]",
            "rules[0].level: missing",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Everything}]",
            "rules[0].level: \"Everything\" is not a level",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [healthz]}]",
            "rules[0].nonResourceURLs[0]: \"healthz\": non-resource URL rules must begin with a '/'",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/a*b]}]",
            "wildcards '*' must be the final character",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/a], namespaces: [x]}]",
            "rules[0].nonResourceURLs: rules cannot apply to both",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{group: rbac.authorization.k8s.io/v1}]}]",
            "rules[0].resources[0].group",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{resourceNames: [a]}]}]",
            "rules[0].resources[0].resourceNames: using resourceNames requires at least one resource",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, omitStages: [Done]}]",
            "rules[0].omitStages[0]: \"Done\" is not a stage",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Later]\nrules: [{level: None}]",
            "omitStages[0]: \"Later\" is not a stage",
        ),
    ];
    for (text, expected) in cases {
        let message = refusal(text);
        assert!(message.contains(expected), "{text}\n→ {message}");
    }
}

#[test]
fn unknown_fields_are_refused_not_ignored() {
    for text in [
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, usergroups: [a]}]",
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrule: [{level: None}]",
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{resource: [a]}]}]",
    ] {
        let message = refusal(text);
        assert!(
            message.starts_with("not a valid audit.k8s.io/v1 Policy: "),
            "{message}"
        );
        assert!(message.contains("unknown field"), "{message}");
    }
}

#[test]
fn first_matching_rule_wins_and_no_match_is_level_none() {
    let p = policy("- level: None\n  users: [scraper]\n- level: Metadata\n  verbs: [create]\n");
    let scraper = user("scraper", &[]);
    let alice = user("alice", &[]);
    let stats = node("stats");
    assert_eq!(
        rule_of(&p, Some(&scraper), "create", Some(&stats), "/stats"),
        Some(0)
    );
    assert_eq!(
        rule_of(&p, Some(&alice), "create", Some(&stats), "/stats"),
        Some(1)
    );
    let none = p.decide(&PolicyRequest {
        user: Some(&alice),
        verb: "get",
        object_ref: Some(&stats),
        path: "/stats",
    });
    assert_eq!(none.level, Level::None);
    assert_eq!(none.rule, None);
}

#[test]
fn users_groups_and_verbs_match_exactly() {
    let p = policy(
        "- level: Metadata\n  users: [tim]\n- level: Metadata\n  userGroups: [admins]\n\
         - level: Metadata\n  verbs: [get, list]\n",
    );
    let tim = user("tim", &[]);
    let many: Vec<String> = (0..450).map(|i| format!("group-{i}")).collect();
    let mut admin = user("eve", &[]);
    admin.groups = many.clone();
    admin.groups.push("admins".to_owned());
    let mut nobody = user("eve", &[]);
    nobody.groups = many;
    let metrics = node("metrics");
    assert_eq!(
        rule_of(&p, Some(&tim), "create", Some(&metrics), "/metrics"),
        Some(0)
    );
    assert_eq!(
        rule_of(
            &p,
            Some(&user("Tim", &[])),
            "create",
            Some(&metrics),
            "/metrics"
        ),
        None
    );
    assert_eq!(
        rule_of(&p, Some(&admin), "create", Some(&metrics), "/metrics"),
        Some(1)
    );
    assert_eq!(
        rule_of(&p, Some(&nobody), "create", Some(&metrics), "/metrics"),
        None
    );
    assert_eq!(
        rule_of(&p, Some(&nobody), "get", Some(&metrics), "/metrics"),
        Some(2)
    );
    // No user: rules naming users or groups never match.
    assert_eq!(
        rule_of(&p, None, "create", Some(&metrics), "/metrics"),
        None
    );
    assert_eq!(rule_of(&p, None, "get", None, "/metrics"), Some(2));
}

#[test]
fn resources_match_as_kube_apiserver() {
    let cases: [(&str, ObjectRef, bool); 12] = [
        ("[nodes/proxy]", node("proxy"), true),
        ("[nodes]", node("proxy"), false),
        ("[\"*\"]", node("proxy"), true),
        ("[\"*/proxy\"]", node("proxy"), true),
        ("[\"*/proxy\"]", node("stats"), false),
        ("[nodes/*]", node("metrics"), true),
        ("[pods/*]", node("metrics"), false),
        ("[\"*/*\"]", node("metrics"), false),
        ("[pods/exec]", pod("default", "exec"), true),
        ("[pods/log]", pod("default", "exec"), false),
        ("[\"*/exec\"]", pod("default", "exec"), true),
        ("[nodes/stats, nodes/metrics]", node("metrics"), true),
    ];
    for (resources, object, matches) in cases {
        let p = policy(&format!(
            "- level: Metadata\n  resources:\n  - group: \"\"\n    resources: {resources}\n"
        ));
        assert_eq!(
            rule_of(&p, None, "get", Some(&object), "/x").is_some(),
            matches,
            "{resources} vs {}/{}",
            object.resource,
            object.subresource
        );
    }
}

#[test]
fn groups_names_and_namespaces() {
    let p = policy(
        "- level: Metadata\n  resources: [{group: apps}]\n\
         - level: Metadata\n  resources: [{group: \"\", resources: [nodes/proxy], resourceNames: [node-2]}]\n\
         - level: Metadata\n  namespaces: [kube-system]\n\
         - level: Metadata\n  resources: [{group: \"\"}]\n  namespaces: [\"\"]\n",
    );
    // The kubelet's resources are in the core group; node-1 is not named; pods in kube-system.
    assert_eq!(
        rule_of(&p, None, "get", Some(&node("proxy")), "/x"),
        Some(3)
    );
    assert_eq!(
        rule_of(&p, None, "get", Some(&pod("kube-system", "log")), "/x"),
        Some(2)
    );
    assert_eq!(
        rule_of(&p, None, "get", Some(&pod("default", "log")), "/x"),
        None
    );
    // Requests without an object match no resource rule.
    assert_eq!(rule_of(&p, None, "get", None, "/x"), None);
}

#[test]
fn non_resource_urls_match_the_path_of_every_request() {
    let p = policy(
        "- level: None\n  nonResourceURLs: [/healthz, \"/stats/*\"]\n- level: Metadata\n  nonResourceURLs: [\"*\"]\n",
    );
    let healthz = node("healthz");
    assert_eq!(
        rule_of(&p, None, "get", Some(&healthz), "/healthz"),
        Some(0)
    );
    assert_eq!(rule_of(&p, None, "get", None, "/healthz"), Some(0));
    assert_eq!(rule_of(&p, None, "get", None, "/healthzz"), Some(1));
    assert_eq!(rule_of(&p, None, "get", None, "/stats/summary"), Some(0));
    assert_eq!(rule_of(&p, None, "get", None, "/stats"), Some(1));
}

#[test]
fn omit_stages_combine_policy_and_rule() {
    let p = policy_with_stages();
    let d = p.decide(&PolicyRequest {
        user: None,
        verb: "get",
        object_ref: None,
        path: "/x",
    });
    assert!(d.omit_stages.contains(Stage::ResponseStarted));
    assert!(d.omit_stages.contains(Stage::ResponseComplete));
}

fn policy_with_stages() -> AuditPolicy {
    AuditPolicy::parse(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [ResponseStarted]\n\
         rules:\n- level: Metadata\n  omitStages: [ResponseComplete]\n",
    )
    .expect("policy")
}

fn gate(rules: &str) -> (PolicyGate, OmittedEvents) {
    let omitted = OmittedEvents::default();
    (PolicyGate::new(policy(rules), omitted.clone()), omitted)
}

#[test]
fn acts_are_kept_whatever_the_policy_and_omissions_are_counted() {
    let (gate, omitted) = gate(
        "- level: None\n  users: [scraper]\n- level: Metadata\n  omitStages: [ResponseStarted]\n  verbs: [watch]\n",
    );
    let scraper = user("scraper", &[]);
    let proxy = node("proxy");
    let request = |who| PolicyRequest {
        user: who,
        verb: "get",
        object_ref: Some(&proxy),
        path: "/exec/ns/pod/ctr",
    };
    assert_eq!(
        gate.stages_kept(&request(Some(&scraper)), false, false),
        Stages::NONE
    );
    assert_eq!(omitted.level_none.get(), 1);
    // The same request acting: recorded whole, a stream at both stages.
    let kept = gate.stages_kept(&request(Some(&scraper)), true, true);
    assert!(kept.contains(Stage::ResponseStarted) && kept.contains(Stage::ResponseComplete));
    assert_eq!(omitted.level_none.get(), 1);
    // No rule: level None, counted apart.
    assert_eq!(gate.stages_kept(&request(None), false, true), Stages::NONE);
    assert_eq!(omitted.no_rule.get(), 2);
    // A stream whose start is omitted keeps its end.
    let watch = PolicyRequest {
        verb: "watch",
        ..request(None)
    };
    let kept = gate.stages_kept(&watch, false, true);
    assert!(!kept.contains(Stage::ResponseStarted) && kept.contains(Stage::ResponseComplete));
    assert_eq!(omitted.omitted_stage.get(), 1);
}

fn lint(rules: &str) -> Vec<String> {
    let p = policy(rules);
    let proxy = node("proxy");
    let samples = [ActSample {
        label: "create nodes/proxy (POST /exec/default/pod/container)",
        request: PolicyRequest {
            user: None,
            verb: "create",
            object_ref: Some(&proxy),
            path: "/exec/default/pod/container",
        },
    }];
    act_warnings(&p, &samples)
}

#[test]
fn lint_names_rules_that_would_omit_acts() {
    let warnings = lint("- level: None\n  users: [scraper]\n- level: Metadata\n");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("rules[0] (level None) matches acts such as create nodes/proxy")
    );
    let warnings = lint("- level: Metadata\n  omitStages: [ResponseComplete]\n");
    assert!(
        warnings[0].contains("omitStages with ResponseComplete"),
        "{warnings:?}"
    );
    let warnings = lint("- level: Metadata\n  users: [alice]\n");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("match no rule for some callers"));
    assert!(lint("- level: None\n  verbs: [get]\n- level: Metadata\n").is_empty());
    assert!(lint("- level: None\n  resources: [{group: \"\", resources: [nodes/metrics, nodes/stats]}]\n- level: Metadata\n").is_empty());
}

#[test]
fn long_lists_and_names_of_any_length_match_exactly() {
    let long = "g".repeat(70);
    let mut groups: Vec<String> = (0..20).map(|i| format!("team-{i:02}")).collect();
    groups.push(long.clone());
    groups.push(String::new());
    let names = rules::Names::new(groups);
    assert!(names.contains("team-07") && names.contains(&long) && names.contains(""));
    assert!(!names.contains("team-7") && !names.contains(&"g".repeat(64)));
    assert!(!names.contains("team-20"));
    assert!(rules::Names::new(Vec::new()).is_empty());
    let few = rules::Names::new(vec!["a".to_owned(), "bb".to_owned()]);
    assert!(few.contains("bb") && !few.contains("b") && !few.contains("cc"));
}
