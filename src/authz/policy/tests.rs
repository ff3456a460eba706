//! The Policy authorizer's tests: loading and validation, and decisions against the RBAC and
//! kubelet vectors.

use std::path::PathBuf;

use super::kinds::{LIST_API_VERSION, RBAC_API_GROUP, RBAC_API_VERSION};
use super::*;
use crate::authn::User;
use crate::authz::rbac::SERVICE_ACCOUNT_KIND;
use crate::test_data::{AttributeCase, KUBELET_VECTORS, cases};
use crate::test_fixtures::user;

/// A ClusterRole granting `get` on `nodes/metrics` and `nodes/stats` (the grant the kubelet
/// docs give metrics scrapers).
const METRICS_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kubelet-metrics-reader
rules:
- apiGroups: [""]
  resources: ["nodes/metrics", "nodes/stats"]
  verbs: ["get"]
"#;

fn binding(name: &str, role: &str, subjects: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
             metadata:\n  name: {name}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  \
             kind: ClusterRole\n  name: {role}\nsubjects:\n{subjects}"
    )
}

fn policy(sources: &[(&str, &str)]) -> Result<PolicyAuthorizer, PolicyError> {
    let owned: Vec<(String, String)> = sources
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    PolicyAuthorizer::from_sources(&owned)
}

/// What `p` answers `u` asking `verb` on `nodes/<subresource>` of `node`.
pub(super) fn decide(
    p: &PolicyAuthorizer,
    u: &User,
    verb: &str,
    subresource: &str,
    node: &str,
) -> Decision {
    p.authorize(&Attributes {
        user: u,
        verb,
        namespace: "",
        resource: "nodes",
        subresource,
        name: node,
        path: "/",
    })
}

fn allow_reason_of(decision: Decision) -> String {
    match decision {
        Decision::Allow(reason) => reason.to_string(),
        other => panic!("expected Allow, got {other:?}"),
    }
}

/// The verb and subresources the kubelet derives for `method path` (fine-grained gate on when
/// a case has it, the 1.33 table), taken from the kubelet vectors.
fn kubelet_attributes(method: &str, path: &str) -> (String, Vec<String>) {
    let mut matching: Vec<AttributeCase> = cases(KUBELET_VECTORS, "kubeletAttributes")
        .into_iter()
        .filter(|c: &AttributeCase| {
            c.method == method && c.path == path && !c.standalone_statusz_flagz
        })
        .collect();
    matching.sort_by_key(|c| !c.fine_grained_authz);
    let case = matching
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no kubelet vector for {method} {path}"));
    (case.verb, case.subresources)
}

/// The kubelet's loop: each attribute in order, only `Allow` stops. Returns the reason of the
/// allowing attribute, or `None` for a 403.
fn kubelet_allows(
    p: &PolicyAuthorizer,
    u: &User,
    node: &str,
    method: &str,
    path: &str,
) -> Option<String> {
    let (verb, subresources) = kubelet_attributes(method, path);
    subresources.iter().find_map(|sub| {
        match p.authorize(&Attributes {
            user: u,
            verb: &verb,
            namespace: "",
            resource: "nodes",
            subresource: sub,
            name: node,
            path,
        }) {
            Decision::Allow(reason) => Some(reason.to_string()),
            Decision::Deny(reason) => panic!("Policy must never deny: {reason}"),
            Decision::NoOpinion(_) => None,
        }
    })
}

fn invalid(result: Result<PolicyAuthorizer, PolicyError>) -> (PolicyProblem, String) {
    match result {
        Err(e @ PolicyError::Invalid { .. }) => {
            let message = e.to_string();
            let PolicyError::Invalid { problem, .. } = e else {
                unreachable!()
            };
            (*problem, message)
        }
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

#[test]
fn metrics_reader_service_account_end_to_end() {
    let crb = binding(
        "agent-metrics",
        "kubelet-metrics-reader",
        "- kind: ServiceAccount\n  name: agent\n  namespace: mon\n",
    );
    let p = policy(&[("policy.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
    let agent = user(
        "system:serviceaccount:mon:agent",
        &["system:serviceaccounts"],
    );
    let want = "RBAC: allowed by ClusterRoleBinding \"agent-metrics\" of ClusterRole \
                    \"kubelet-metrics-reader\" to ServiceAccount \"agent/mon\"";
    assert_eq!(
        kubelet_allows(&p, &agent, "n1", "GET", "/metrics/cadvisor").as_deref(),
        Some(want)
    );
    assert_eq!(
        kubelet_allows(&p, &agent, "n1", "GET", "/stats/summary").as_deref(),
        Some(want)
    );
    assert_eq!(kubelet_allows(&p, &agent, "n1", "GET", "/pods"), None);
    assert_eq!(
        kubelet_allows(&p, &agent, "n1", "GET", "/exec/default/pod/ctr"),
        None
    );
    assert_eq!(
        kubelet_allows(&p, &agent, "n1", "POST", "/exec/default/pod/ctr"),
        None
    );
    // Another service account of the same namespace gets nothing.
    let other = user(
        "system:serviceaccount:mon:other",
        &["system:serviceaccounts"],
    );
    assert_eq!(
        kubelet_allows(&p, &other, "n1", "GET", "/metrics/cadvisor"),
        None
    );
}

#[test]
fn resource_names_limit_access_to_one_node() {
    let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                    metadata: {name: n1-proxy}\nrules:\n- apiGroups: [\"\"]\n  \
                    resources: [nodes/proxy]\n  verbs: [get]\n  resourceNames: [n1]\n";
    let crb = binding("ops-n1", "n1-proxy", "- kind: User\n  name: ops\n");
    let p = policy(&[("policy.yaml", &format!("{role}---\n{crb}"))]).unwrap();
    let ops = user("ops", &[]);
    // `/pods` is tried as nodes/pods first, then allowed through the nodes/proxy fallback.
    assert_eq!(
        kubelet_allows(&p, &ops, "n1", "GET", "/pods").as_deref(),
        Some(
            "RBAC: allowed by ClusterRoleBinding \"ops-n1\" of ClusterRole \"n1-proxy\" to User \"ops\""
        )
    );
    assert_eq!(kubelet_allows(&p, &ops, "n2", "GET", "/pods"), None);
}

/// RBAC's namespaced rules (kubernetes `pkg/registry/rbac/validation/rule.go` `VisitRulesFor`):
/// ClusterRoleBindings first, then the RoleBindings of the request's namespace, which reach a
/// Role of that namespace or a ClusterRole; a ServiceAccount subject without namespace is the
/// binding's. Kubelet attribute sets have no namespace, so RoleBindings never apply to them.
#[test]
fn role_bindings_apply_only_in_their_namespace() {
    let text = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: debugger, namespace: team-a}
rules:
- {apiGroups: [""], resources: [pods/exec], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: log-reader}
rules:
- {apiGroups: [""], resources: [pods/log, nodes/proxy], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBindingList
items:
- metadata: {name: debuggers, namespace: team-a}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: debugger}
  subjects:
  - {kind: Group, name: team-a-devs}
  - {kind: ServiceAccount, name: shipper}
- metadata: {name: logs, namespace: team-b}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: log-reader}
  subjects: [{kind: ServiceAccount, name: shipper, namespace: team-a}]
"#;
    let p = policy(&[("ns.yaml", text)]).unwrap();
    assert_eq!(
        p.stats(),
        PolicyStats {
            cluster_roles: 1,
            cluster_role_bindings: 0,
            roles: 1,
            role_bindings: 2,
            rules: 2,
        }
    );
    let pod = |u: &User, verb: &'static str, ns: &'static str, sub: &'static str| {
        p.authorize(&Attributes {
            user: u,
            verb,
            namespace: ns,
            resource: "pods",
            subresource: sub,
            name: "web-0",
            path: "/",
        })
    };
    let dev = user("dana", &["team-a-devs"]);
    assert_eq!(
        allow_reason_of(pod(&dev, "create", "team-a", "exec")),
        "RBAC: allowed by RoleBinding \"debuggers/team-a\" of Role \"debugger\" to Group \"team-a-devs\""
    );
    assert!(matches!(
        pod(&dev, "create", "team-b", "exec"),
        Decision::NoOpinion(_)
    ));
    assert!(matches!(
        pod(&dev, "get", "team-a", "log"),
        Decision::NoOpinion(_)
    ));
    let shipper = user("system:serviceaccount:team-a:shipper", &[]);
    assert_eq!(
        allow_reason_of(pod(&shipper, "create", "team-a", "exec")),
        "RBAC: allowed by RoleBinding \"debuggers/team-a\" of Role \"debugger\" to ServiceAccount \"shipper/team-a\""
    );
    assert_eq!(
        allow_reason_of(pod(&shipper, "get", "team-b", "log")),
        "RBAC: allowed by RoleBinding \"logs/team-b\" of ClusterRole \"log-reader\" to ServiceAccount \"shipper/team-a\""
    );
    // The ClusterRole's nodes/proxy rule, reached through a RoleBinding, never applies to the
    // kubelet's own attributes (namespace "").
    assert!(matches!(
        decide(&p, &shipper, "get", "proxy", "node-1"),
        Decision::NoOpinion(_)
    ));
}

#[test]
fn namespaced_objects_need_a_namespace_and_a_role_in_it() {
    let role_ref = "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}";
    let cases: Vec<(String, &str, PolicyProblem)> = vec![
        (
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r}\n".into(),
            "Role \"r\"",
            PolicyProblem::MissingNamespace { kind: "Role" },
        ),
        (
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: b, namespace: a}}\n{role_ref}\n"
            ),
            "RoleBinding \"a/b\"",
            PolicyProblem::MissingRole {
                kind: "Role",
                name: "r".into(),
                namespace: "a".into(),
            },
        ),
        (
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\n"
            ),
            "ClusterRoleBinding \"b\"",
            PolicyProblem::BadRoleRef {
                binding: "ClusterRoleBinding",
                kind: "Role".into(),
                api_group: RBAC_API_GROUP.into(),
            },
        ),
    ];
    // A Role "r" exists, but in namespace "other".
    let other = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r, namespace: other}\n";
    for (text, object, want) in cases {
        let (problem, message) = invalid(policy(&[("ns.yaml", &format!("{other}---\n{text}"))]));
        assert_eq!(problem, want, "{text}");
        assert_eq!(message, format!("ns.yaml:5: {object}: {want}"), "{text}");
    }
    assert_eq!(
        PolicyProblem::MissingRole {
            kind: "Role",
            name: "r".into(),
            namespace: "a".into()
        }
        .to_string(),
        "roleRef names Role \"r\" in namespace \"a\", which no policy file defines"
    );
}

#[test]
fn subject_kinds_and_reasons() {
    let crb = binding(
        "readers",
        "kubelet-metrics-reader",
        "- kind: User\n  apiGroup: rbac.authorization.k8s.io\n  name: alice\n\
             - kind: Group\n  name: monitoring\n\
             - kind: ServiceAccount\n  name: agent\n  namespace: mon\n",
    );
    let p = policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
    let prefix = "RBAC: allowed by ClusterRoleBinding \"readers\" of ClusterRole \"kubelet-metrics-reader\" to ";
    let cases = [
        (user("alice", &[]), "User \"alice\""),
        (user("bob", &["monitoring"]), "Group \"monitoring\""),
        (
            user("system:serviceaccount:mon:agent", &[]),
            "ServiceAccount \"agent/mon\"",
        ),
    ];
    for (u, subject) in cases {
        assert_eq!(
            allow_reason_of(decide(&p, &u, "get", "stats", "n1")),
            format!("{prefix}{subject}"),
            "{u:?}"
        );
    }
    // Case-sensitive names; a group named like the user does not count; wrong verb.
    for (u, verb) in [
        (user("Alice", &[]), "get"),
        (user("monitoring", &["Monitoring"]), "get"),
        (user("alice", &[]), "create"),
        (user("system:serviceaccount:other:agent", &["mon"]), "get"),
    ] {
        assert_eq!(
            decide(&p, &u, verb, "stats", "n1"),
            Decision::NoOpinion(NO_BINDING_ALLOWS),
            "{u:?} {verb}"
        );
    }
}

#[test]
fn first_applying_subject_of_a_binding_is_named() {
    // The user matches both subjects; RBAC names the first in the binding's order, even
    // though the index reaches the binding through the user name first.
    let crb = binding(
        "b",
        "kubelet-metrics-reader",
        "- kind: Group\n  name: ops\n- kind: User\n  name: alice\n",
    );
    let p = policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
    let reason = allow_reason_of(decide(&p, &user("alice", &["ops"]), "get", "metrics", "n1"));
    assert!(reason.ends_with("to Group \"ops\""), "{reason}");
    let reason = allow_reason_of(decide(&p, &user("alice", &[]), "get", "metrics", "n1"));
    assert!(reason.ends_with("to User \"alice\""), "{reason}");
}

#[test]
fn first_allowing_binding_in_load_order_is_named() {
    let proxy_role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                          metadata: {name: proxy}\nrules:\n- apiGroups: [\"\"]\n  \
                          resources: [\"nodes/proxy\"]\n  verbs: [\"*\"]\n";
    // 1st: matches alice but grants nothing for stats; 2nd: via a group; 3rd: via her name;
    // 4th: via another group.
    let first = binding("a-proxy", "proxy", "- kind: User\n  name: alice\n");
    let second = binding(
        "b-group",
        "kubelet-metrics-reader",
        "- kind: Group\n  name: ops\n",
    );
    let third = binding(
        "c-user",
        "kubelet-metrics-reader",
        "- kind: User\n  name: alice\n",
    );
    let fourth = binding(
        "d-late",
        "kubelet-metrics-reader",
        "- kind: Group\n  name: late\n",
    );
    let p = policy(&[
        (
            "bindings.yaml",
            &format!("{first}---\n{second}---\n{third}---\n{fourth}"),
        ),
        ("roles.yaml", &format!("{METRICS_READER}---\n{proxy_role}")),
    ])
    .unwrap();
    let alice = user("alice", &["ops"]);
    let reason = allow_reason_of(decide(&p, &alice, "get", "stats", "n1"));
    assert!(reason.contains("\"b-group\""), "{reason}");
    let reason = allow_reason_of(decide(&p, &user("alice", &[]), "get", "stats", "n1"));
    assert!(reason.contains("\"c-user\""), "{reason}");
    // Found through the user name first, a later binding found through a group loses.
    let reason = allow_reason_of(decide(&p, &user("alice", &["late"]), "get", "stats", "n1"));
    assert!(reason.contains("\"c-user\""), "{reason}");
    let reason = allow_reason_of(decide(&p, &alice, "", "proxy", "n1"));
    assert!(reason.contains("\"a-proxy\""), "{reason}");
    assert_eq!(
        p.stats(),
        PolicyStats {
            cluster_roles: 2,
            cluster_role_bindings: 4,
            roles: 0,
            role_bindings: 0,
            rules: 2
        }
    );
}

#[test]
fn multi_document_list_and_kubectl_output_are_accepted() {
    let list = r#"
# leading comment, then empty documents
---
---
apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata:
    annotations:
      rbac.authorization.kubernetes.io/autoupdate: "true"
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      kubernetes.io/bootstrapping: rbac-defaults
    name: system:kubelet-api-admin
    resourceVersion: "74"
    uid: 2f1e7c1e-5d5b-4a55-9b8e-0d6c2f3c8d11
  rules:
  - apiGroups:
    - ""
    resources:
    - nodes/proxy
    - nodes/log
    - nodes/stats
    - nodes/metrics
    - nodes/spec
    verbs:
    - '*'
  - nonResourceURLs:
    - /healthz
    verbs:
    - get
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata:
    name: kube-apiserver-kubelet-client
  roleRef:
    apiGroup: rbac.authorization.k8s.io
    kind: ClusterRole
    name: system:kubelet-api-admin
  subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: kube-apiserver-kubelet-client
---
"#;
    let p = policy(&[("list.yaml", list)]).unwrap();
    assert_eq!(
        p.stats(),
        PolicyStats {
            cluster_roles: 1,
            cluster_role_bindings: 1,
            roles: 0,
            role_bindings: 0,
            rules: 2
        }
    );
    let apiserver = user("kube-apiserver-kubelet-client", &["system:masters"]);
    assert_eq!(
        kubelet_allows(&p, &apiserver, "n1", "POST", "/exec/default/pod/ctr").as_deref(),
        Some(
            "RBAC: allowed by ClusterRoleBinding \"kube-apiserver-kubelet-client\" of \
                 ClusterRole \"system:kubelet-api-admin\" to User \"kube-apiserver-kubelet-client\""
        )
    );
    assert_eq!(
        kubelet_allows(&p, &apiserver, "n1", "POST", "/checkpoint/default/pod/ctr"),
        None
    );
}

#[test]
fn roles_name_their_file_line_and_rules_in_load_order() {
    let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: rbac.authorization.k8s.io/v1\n  \
                    kind: ClusterRole\n  metadata: {name: in-list}\n  rules:\n  - {apiGroups: [\"\"], \
                    resources: [nodes/proxy], verbs: [get]}\n  - {nonResourceURLs: [/healthz], verbs: [get]}\n";
    let p = policy(&[("a.yaml", METRICS_READER), ("b.yaml", list)]).unwrap();
    let roles: Vec<_> = p
        .roles()
        .map(|r| (r.name, r.source_name, r.line, r.rules.len()))
        .collect();
    assert_eq!(
        roles,
        [
            ("kubelet-metrics-reader", "a.yaml", 2, 1),
            ("in-list", "b.yaml", 4, 2)
        ]
    );
    let in_list = p.roles().nth(1).unwrap();
    assert_eq!(in_list.rules[0].resources, ["nodes/proxy"]);
    assert_eq!(in_list.rules[1].non_resource_urls, ["/healthz"]);
}

#[test]
fn policy_without_bindings_never_allows() {
    for text in ["", "# nothing here\n", METRICS_READER] {
        let p = policy(&[("empty.yaml", text)]).unwrap();
        assert_eq!(
            decide(
                &p,
                &user("system:masters", &["system:masters"]),
                "get",
                "proxy",
                "n1"
            ),
            Decision::NoOpinion(NO_BINDING_ALLOWS)
        );
    }
}

#[test]
fn no_sources_is_an_error() {
    assert!(matches!(
        PolicyAuthorizer::load(&[]),
        Err(PolicyError::NoSources)
    ));
    assert!(matches!(
        PolicyAuthorizer::from_sources(&[]),
        Err(PolicyError::NoSources)
    ));
}

#[test]
fn yaml_errors_name_the_source_and_line() {
    let cases = [
        ("kind: ClusterRole\nmetadata: {name: x\n", "line"),
        // An operator's typo in a rule field.
        (
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\n\
                 rules:\n- apiGroups: [\"\"]\n  resources: [nodes/proxy]\n  verb: [get]\n",
            "unknown field `verb`",
        ),
        // Unknown top-level field.
        (
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\nstatus: {}\n",
            "unknown field `status`",
        ),
        // A duplicate key must not silently replace the first value.
        ("kind: ClusterRole\nkind: ClusterRoleBinding\n", "duplicate"),
        ("- not a mapping\n", "line 1"),
    ];
    for (text, needle) in cases {
        match policy(&[("bad.yaml", text)]) {
            Err(e @ PolicyError::Yaml { .. }) => {
                let message = e.to_string();
                assert!(
                    message.starts_with("bad.yaml: invalid policy YAML: "),
                    "{message}"
                );
                assert!(message.contains(needle), "{message} lacks {needle}");
                assert!(!message.contains('\n'), "one line: {message}");
            }
            other => panic!("{text:?}: expected a YAML error, got {other:?}"),
        }
    }
    let Err(PolicyError::Yaml { error, .. }) = policy(&[("bad.yaml", cases[1].0)]) else {
        panic!("expected a YAML error")
    };
    assert_eq!(error.location().map(|l| l.line()), Some(7));
}

#[test]
fn manifest_errors_name_file_line_object_and_problem() {
    let rbac = "apiVersion: rbac.authorization.k8s.io/v1";
    let role_ref = "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kubelet-metrics-reader}";
    let cases: Vec<(String, &str, PolicyProblem)> = vec![
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n".into(),
                "document",
                PolicyProblem::UnknownKind("Pod".into()),
            ),
            ("metadata: {name: p}\n".into(), "document", PolicyProblem::MissingKind),
            (
                "apiVersion: rbac.authorization.k8s.io/v1beta1\nkind: ClusterRole\nmetadata: {name: r}\n".into(),
                "ClusterRole \"r\"",
                PolicyProblem::WrongApiVersion {
                    found: "rbac.authorization.k8s.io/v1beta1".into(),
                    expected: RBAC_API_VERSION,
                },
            ),
            (
                "kind: ClusterRoleBinding\nmetadata: {name: b}\n".into(),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::WrongApiVersion { found: String::new(), expected: RBAC_API_VERSION },
            ),
            (
                format!("{rbac}\nkind: List\nitems: []\n"),
                "List",
                PolicyProblem::WrongApiVersion { found: RBAC_API_VERSION.into(), expected: LIST_API_VERSION },
            ),
            (
                "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n".into(),
                "List",
                PolicyProblem::NestedList,
            ),
            (format!("{rbac}\nkind: ClusterRole\nmetadata: {{labels: {{a: b}}}}\n"), "ClusterRole", PolicyProblem::MissingName),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: agg}}\naggregationRule:\n  clusterRoleSelectors:\n  - matchLabels: {{a: b}}\n  - matchExpressions: [{{key: a, operator: In}}]\n"),
                "ClusterRole \"agg\"",
                PolicyProblem::BadSelector { index: 1, reason: "matchExpressions[0]: for 'In', 'NotIn' operators, values set can't be empty".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: agg}}\naggregationRule:\n  clusterRoleSelectors:\n  - matchExpressions: [{{key: a, operator: Exists, values: [b]}}]\n"),
                "ClusterRole \"agg\"",
                PolicyProblem::BadSelector { index: 0, reason: "matchExpressions[0]: values set must be empty for exists and does not exist".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: agg}}\naggregationRule:\n  clusterRoleSelectors:\n  - matchExpressions: [{{key: a, operator: in, values: [b]}}]\n"),
                "ClusterRole \"agg\"",
                PolicyProblem::BadSelector { index: 0, reason: "matchExpressions[0]: \"in\" is not a valid label selector operator (In, NotIn, Exists, DoesNotExist)".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleList\nitems:\n- metadata: {{name: b}}\n  {role_ref}\n"),
                "ClusterRole \"b\"",
                PolicyProblem::UnexpectedField { field: "roleRef", kind: "ClusterRole" },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBindingList\nitems:\n- {{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {{name: r}}}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::WrongItemKind { list: "ClusterRoleBindingList", expected: "ClusterRoleBinding" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{verbs: [get], apiGroups: [\"\"], resources: [nodes/stats]}}\n- {{verbs: [get], resources: [nodes/proxy]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 1, reason: "resource rules must supply at least one api group" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{apiGroups: [\"\"], resources: [nodes/proxy]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 0, reason: "verbs must contain at least one value" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{verbs: [get], apiGroups: [\"\"]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 0, reason: "resource rules must supply at least one resource" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{verbs: [get], nonResourceURLs: [/healthz], resources: [nodes/proxy]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 0, reason: "rules cannot apply to both regular resources and non-resource URLs" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nsubjects: []\n"),
                "ClusterRole \"r\"",
                PolicyProblem::UnexpectedField { field: "subjects", kind: "ClusterRole" },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nrules: []\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::UnexpectedField { field: "rules", kind: "ClusterRoleBinding" },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nsubjects: []\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::MissingRoleRef,
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::BadRoleRef { binding: "ClusterRoleBinding", kind: "Role".into(), api_group: RBAC_API_GROUP.into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nroleRef: {{kind: ClusterRole, name: kubelet-metrics-reader}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::BadRoleRef { binding: "ClusterRoleBinding", kind: "ClusterRole".into(), api_group: String::new() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nowhere}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::MissingRole { kind: "ClusterRole", name: "nowhere".into(), namespace: String::new() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: User, name: a}}\n- {{kind: user, name: a}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::UnknownSubjectKind { index: 1, kind: "user".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: ServiceAccount, name: agent}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::ServiceAccountWithoutNamespace { index: 0, name: "agent".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: Group, name: \"\"}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::EmptySubjectName { index: 0 },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: ServiceAccount, apiGroup: rbac.authorization.k8s.io, name: a, namespace: n}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::BadSubjectApiGroup { index: 0, kind: SERVICE_ACCOUNT_KIND.into(), api_group: RBAC_API_GROUP.into() },
            ),
        ];
    for (text, object, want) in cases {
        // Line 1 of the file is the role; the object under test starts after `---` on line 11.
        let source = format!("{METRICS_READER}---\n{text}");
        let (problem, message) = invalid(policy(&[("cfg/p.yaml", &source)]));
        assert_eq!(problem, want, "{text}");
        // Problems with a list's item are reported at the item.
        let line = if text.contains("items:\n-") { 14 } else { 11 };
        let prefix = format!("cfg/p.yaml:{line}: {object}: {want}");
        assert_eq!(message, prefix, "{text}");
    }
}

#[test]
fn duplicate_names_point_at_the_first_definition() {
    let (problem, message) = invalid(policy(&[
        ("a.yaml", METRICS_READER),
        (
            "b.yaml",
            &format!(
                "# the same role again
{METRICS_READER}"
            ),
        ),
    ]));
    assert_eq!(
        problem,
        PolicyProblem::Duplicate {
            first: "a.yaml:2".into()
        }
    );
    assert_eq!(
        message,
        "b.yaml:3: ClusterRole \"kubelet-metrics-reader\": duplicate name, first defined at a.yaml:2"
    );

    let crb = binding(
        "twice",
        "kubelet-metrics-reader",
        "- kind: User\n  name: a\n",
    );
    let (problem, message) = invalid(policy(&[(
        "p.yaml",
        &format!("{METRICS_READER}---\n{crb}---\n{crb}"),
    )]));
    assert_eq!(
        problem,
        PolicyProblem::Duplicate {
            first: "p.yaml:11".into()
        }
    );
    assert!(
        message.starts_with("p.yaml:23: ClusterRoleBinding \"twice\": "),
        "{message}"
    );

    // A role and a binding may share a name: they are different kinds.
    let crb = binding("kubelet-metrics-reader", "kubelet-metrics-reader", "  []\n");
    policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
}

#[test]
fn load_reads_files_in_order_and_reports_unreadable_ones() {
    let dir =
        std::env::temp_dir().join(format!("kubelet-auth-proxy-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let roles = dir.join("roles.yaml");
    let bindings = dir.join("bindings.yaml");
    std::fs::write(&roles, METRICS_READER).unwrap();
    std::fs::write(
        &bindings,
        binding(
            "b",
            "kubelet-metrics-reader",
            "- kind: User\n  name: alice\n",
        ),
    )
    .unwrap();

    // The binding's role comes from a file loaded after it.
    let p = PolicyAuthorizer::load(&[bindings.clone(), roles.clone()]).unwrap();
    assert!(matches!(
        decide(&p, &user("alice", &[]), "get", "metrics", "n1"),
        Decision::Allow(_)
    ));

    let missing = dir.join("missing.yaml");
    let err = PolicyAuthorizer::load(&[roles.clone(), missing.clone()]).unwrap_err();
    assert!(
        matches!(&err, PolicyError::Read { path, .. } if *path == missing),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );

    // A directory given by mistake.
    let err = PolicyAuthorizer::load(std::slice::from_ref(&dir)).unwrap_err();
    assert!(matches!(err, PolicyError::Read { .. }), "{err:?}");

    // Errors inside a file name that file.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: Secret\n").unwrap();
    let err = PolicyAuthorizer::load(&[roles, bad.clone()])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("{}:1: document: ", bad.display())),
        "{err}"
    );

    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn endless_file_is_refused() {
    let path = PathBuf::from("/dev/zero");
    match PolicyAuthorizer::load(std::slice::from_ref(&path)) {
        Err(PolicyError::TooLarge { path: p, limit }) => {
            assert_eq!(p, path);
            assert_eq!(limit, MAX_POLICY_FILE_BYTES);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn names_are_quoted_like_go_in_reasons() {
    let crb = binding(
        "b",
        "kubelet-metrics-reader",
        "- kind: User\n  name: \"eve\\\"\\n\\u0001\\\\x\\u0085\\u2028é\"\n",
    );
    let p = policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
    let eve = user("eve\"\n\u{1}\\x\u{85}\u{2028}é", &[]);
    let reason = allow_reason_of(decide(&p, &eve, "get", "stats", "n1"));
    assert!(
        reason.ends_with(r#"to User "eve\"\n\x01\\x\u0085\u2028é""#),
        "{reason}"
    );
}

#[test]
fn index_finds_the_right_binding_among_ten_thousand() {
    const N: usize = 10_000;
    let mut text = String::from(METRICS_READER);
    for i in 0..N {
        let subjects = format!("- kind: User\n  name: user-{i}\n");
        text.push_str("---\n");
        text.push_str(&binding(
            &format!("binding-{i}"),
            "kubelet-metrics-reader",
            &subjects,
        ));
    }
    // One binding per node-scoped role, for a user whose access is limited to one node.
    let scoped = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                      metadata: {name: node-7-stats}\nrules:\n- apiGroups: [\"\"]\n  \
                      resources: [nodes/stats]\n  verbs: [get]\n  resourceNames: [node-7]\n---\n";
    text.push_str(scoped);
    text.push_str(&binding(
        "scoped",
        "node-7-stats",
        "- kind: Group\n  name: node-7-readers\n",
    ));
    let p = policy(&[("big.yaml", &text)]).unwrap();
    assert_eq!(p.stats().cluster_role_bindings, N + 1);

    for i in [0, 1, 4_242, N - 1] {
        let reason = allow_reason_of(decide(
            &p,
            &user(&format!("user-{i}"), &[]),
            "get",
            "stats",
            "n1",
        ));
        assert_eq!(
            reason,
            format!(
                "RBAC: allowed by ClusterRoleBinding \"binding-{i}\" of ClusterRole \
                     \"kubelet-metrics-reader\" to User \"user-{i}\""
            )
        );
    }
    for name in [format!("user-{N}"), "user-".into(), "User-1".into()] {
        assert_eq!(
            decide(
                &p,
                &user(&name, &["system:authenticated"]),
                "get",
                "stats",
                "n1"
            ),
            Decision::NoOpinion(NO_BINDING_ALLOWS),
            "{name}"
        );
    }
    let reader = user("someone", &["system:authenticated", "node-7-readers"]);
    assert!(allow_reason_of(decide(&p, &reader, "get", "stats", "node-7")).contains("\"scoped\""));
    assert_eq!(
        decide(&p, &reader, "get", "stats", "node-8"),
        Decision::NoOpinion(NO_BINDING_ALLOWS)
    );
}
