//! RBAC rule and subject matching against the upstream vectors.

use super::*;
use crate::test_data::{KUBELET_VECTORS, cases};

/// The vectors' request object: `apiGroup`, `resource`, … are absent for non-resource requests.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VectorRequest {
    verb: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    name: String,
    resource_request: bool,
    #[serde(default)]
    path: String,
}

impl VectorRequest {
    fn as_rule_request(&self) -> RuleRequest<'_> {
        RuleRequest {
            verb: &self.verb,
            api_group: &self.api_group,
            resource: &self.resource,
            subresource: &self.subresource,
            name: &self.name,
            resource_request: self.resource_request,
            path: &self.path,
        }
    }
}

/// One `rbacRuleAllows` case.
#[derive(Debug, Deserialize)]
struct RuleCase {
    rule: PolicyRule,
    request: VectorRequest,
    allows: bool,
}

#[test]
fn rule_allows_matches_every_kubelet_vector() {
    for case in cases::<RuleCase>(KUBELET_VECTORS, "rbacRuleAllows") {
        assert_eq!(
            rule_allows(&case.rule, &case.request.as_rule_request()),
            case.allows,
            "{case:?}"
        );
    }
}

/// One `subjectApplies` case.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubjectCase {
    user: String,
    groups: Vec<String>,
    subject: Subject,
    binding_namespace: String,
    applies: bool,
}

#[test]
fn subject_applies_matches_every_kubelet_vector() {
    for case in cases::<SubjectCase>(KUBELET_VECTORS, "subjectApplies") {
        assert_eq!(
            subject_applies(
                &case.subject,
                &case.user,
                &case.groups,
                &case.binding_namespace
            ),
            case.applies,
            "{case:?}"
        );
    }
}

fn nodes(verb: &'static str, subresource: &'static str) -> RuleRequest<'static> {
    RuleRequest {
        verb,
        resource: "nodes",
        subresource,
        name: "n1",
        resource_request: true,
        ..RuleRequest::default()
    }
}

fn rule(resources: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: vec!["get".into()],
        api_groups: vec![String::new()],
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

#[test]
fn subresource_wildcard_needs_the_exact_subresource() {
    // `*/proxy` must not be taken as a prefix or suffix pattern.
    assert!(!rule_allows(&rule(&["*/proxy"]), &nodes("get", "xproxy")));
    assert!(!rule_allows(&rule(&["*/proxy"]), &nodes("get", "prox")));
    assert!(!rule_allows(&rule(&["x*/proxy"]), &nodes("get", "proxy")));
    // A literal `*` subresource is matched by `nodes/*` and `*/*`, as upstream.
    assert!(rule_allows(&rule(&["nodes/*"]), &nodes("get", "*")));
    assert!(rule_allows(&rule(&["*/*"]), &nodes("get", "*")));
}

#[test]
fn combined_resource_is_compared_whole() {
    assert!(!rule_allows(&rule(&["nodes/"]), &nodes("get", "")));
    assert!(!rule_allows(&rule(&["nodesproxy"]), &nodes("get", "proxy")));
    assert!(!rule_allows(
        &rule(&["nodes/proxyx"]),
        &nodes("get", "proxy")
    ));
    assert!(!rule_allows(&rule(&["node/proxy"]), &nodes("get", "proxy")));
    assert!(rule_allows(&rule(&["nodes"]), &nodes("get", "")));
}

#[test]
fn literal_empty_verb_matches_verbless_requests() {
    let mut r = rule(&["nodes/proxy"]);
    r.verbs = vec![String::new()];
    assert!(rule_allows(&r, &nodes("", "proxy")));
    assert!(!rule_allows(&r, &nodes("get", "proxy")));
}

#[test]
fn service_account_match_is_exact() {
    let sa = Subject {
        kind: SERVICE_ACCOUNT_KIND.into(),
        name: "agent".into(),
        namespace: "mon".into(),
        ..Subject::default()
    };
    for user in [
        "system:serviceaccount:mon:agentx",
        "system:serviceaccount:monx:agent",
        "system:serviceaccount:mon:",
        "system:serviceaccounts:mon:agent",
        "mon:agent",
    ] {
        assert!(!subject_applies(&sa, user, &[], ""), "{user}");
    }
    let user = service_account_username("mon", "agent");
    assert!(subject_applies(&sa, &user, &[], ""));
}

#[test]
fn service_account_without_any_namespace_never_matches() {
    let sa = Subject {
        kind: SERVICE_ACCOUNT_KIND.into(),
        name: "agent".into(),
        ..Subject::default()
    };
    // Even the user name an empty namespace would produce.
    assert!(!subject_applies(
        &sa,
        "system:serviceaccount::agent",
        &[],
        ""
    ));
    assert!(subject_applies(
        &sa,
        "system:serviceaccount:mon:agent",
        &[],
        "mon"
    ));
}

#[test]
fn unknown_subject_kind_never_matches() {
    let s = Subject {
        kind: "user".into(),
        name: "alice".into(),
        ..Subject::default()
    };
    assert!(!subject_applies(&s, "alice", &["alice".into()], "ns"));
}

#[test]
fn typo_in_rule_field_is_rejected() {
    let err = serde_json::from_str::<PolicyRule>(r#"{"verb":["get"]}"#).unwrap_err();
    assert!(err.to_string().contains("verb"), "{err}");
    let r: PolicyRule = serde_json::from_str(r#"{"nonResourceURLs":["/healthz"]}"#).unwrap();
    assert_eq!(r.non_resource_urls, ["/healthz"]);
}
