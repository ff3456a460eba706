//! Lint for local policies: rule entries no kubelet request can ever match under the attribute
//! table in force (with `--pod-scoped-authz`, the pod-level sets too), named with file, line,
//! role and rule index. Shown by `explain`, and warned about at start-up and by `check-config`.
//!
//! Only rules that look meant for the kubelet are named one by one: a dump of a cluster's RBAC
//! holds hundreds of rules about other resources, and Kubernetes' own roles, which can never
//! match a kubelet request and are not the operator's mistakes. Those are counted in one line.

use std::fmt;

use serde::Serialize;

use super::kinds::BOOTSTRAPPING_LABEL;
use super::{PolicyAuthorizer, PolicyRole};
use crate::authz::attributes::{AttributeMapping, kubelet_verbs};
use crate::authz::pod_attributes::pod_subresources;
use crate::authz::rbac::PolicyRule;
use crate::authz::{POD_RESOURCE, RESOURCE};

/// The RBAC wildcard.
const ALL: &str = "*";

/// A policy rule part that no kubelet request can match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyWarning {
    /// The policy file.
    pub file: String,
    /// The line where the role starts.
    pub line: u64,
    /// `ClusterRole` or `Role`.
    pub kind: &'static str,
    /// The role's name; `namespace/name` for a Role.
    pub role: String,
    /// The rule's index in `rules`.
    pub rule: usize,
    /// The rule field at fault: `verbs`, `apiGroups`, `resources`, `resourceNames` or
    /// `nonResourceURLs`.
    pub field: &'static str,
    /// What can never match, and why.
    pub message: String,
    /// Whether the whole rule can never match (otherwise only this entry is dead).
    pub rule_never_matches: bool,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} {:?} rules[{}]: {}{}",
            self.file,
            self.line,
            self.kind,
            self.role,
            self.rule,
            self.message,
            if self.rule_never_matches {
                "; this rule can never match a kubelet request"
            } else {
                ""
            }
        )
    }
}

/// The rules that can never match a kubelet request but are not named one by one: rules about
/// other resources or non-resource URLs, and the rules of Kubernetes' own roles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UnlistedRules {
    /// Rules that can never match.
    pub rules: usize,
    /// The roles they belong to.
    pub roles: usize,
}

impl fmt::Display for UnlistedRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} more rule(s) in {} role(s) can never match a kubelet request and are not \
             listed: they are about other resources or non-resource URLs, or belong to \
             Kubernetes' own roles ({}: {})",
            self.rules, self.roles, BOOTSTRAPPING_LABEL.0, BOOTSTRAPPING_LABEL.1
        )
    }
}

/// What the lint found in a set of policies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyLint {
    /// Rules meant for the kubelet that cannot match, or their dead entries, one by one.
    pub warnings: Vec<PolicyWarning>,
    /// The other rules that can never match, counted.
    pub unlisted: UnlistedRules,
}

/// The lint of every local policy in `policies` for kubelet requests on `node_name` under
/// `mapping`. `explain`, `check-config` and the server's start-up all report it.
pub fn lint_policies<'a>(
    policies: impl IntoIterator<Item = &'a PolicyAuthorizer>,
    mapping: &AttributeMapping,
    node_name: &str,
) -> PolicyLint {
    let mut lint = PolicyLint::default();
    for policy in policies {
        for role in policy.roles() {
            let (warnings, unlisted) = role_lint(&role, mapping, node_name);
            lint.warnings.extend(warnings);
            if unlisted > 0 {
                lint.unlisted.rules += unlisted;
                lint.unlisted.roles += 1;
            }
        }
    }
    lint
}

/// What the kubelet ever asks about, from the attribute table in force, for one role.
struct Asked {
    verbs: [&'static str; 5],
    /// The `(resource, subresource)` pairs asked about: the kubelet's `nodes/<subresource>` sets
    /// (cluster-wide, so never for a Role), and with `--pod-scoped-authz` the pod-level ones.
    resources: Vec<(&'static str, &'static str)>,
    /// Whether resourceNames are the Node's name (a ClusterRole) or pods' names only (a Role).
    names_are_pods: bool,
}

impl Asked {
    fn new(mapping: &AttributeMapping, namespaced: bool) -> Asked {
        let mut resources = Vec::new();
        if !namespaced {
            resources.extend(mapping.subresources().into_iter().map(|s| (RESOURCE, s)));
        }
        if mapping.pod_scoped {
            for (subresource, _) in pod_subresources() {
                if !resources.contains(&(POD_RESOURCE, subresource)) {
                    resources.push((POD_RESOURCE, subresource));
                }
            }
        }
        Asked {
            verbs: kubelet_verbs(),
            resources,
            names_are_pods: namespaced,
        }
    }

    /// The subresources asked about on `resource`.
    fn subresources_of(&self, resource: &str) -> Vec<&'static str> {
        let all = resource == ALL;
        self.resources
            .iter()
            .filter(|(r, _)| all || *r == resource)
            .map(|(_, s)| *s)
            .collect()
    }

    /// `nodes/<a>, nodes/<b>, pods/<c>`, for messages.
    fn describe(&self) -> String {
        let names: Vec<String> = self
            .resources
            .iter()
            .map(|(r, s)| format!("{r}/{s}"))
            .collect();
        names.join(", ")
    }
}

/// The lint of one role: warnings for the entries no kubelet request can match under `mapping`
/// in the rules that look meant for the kubelet, each marked with whether the rule as a whole is
/// dead, and the number of other rules that can never match.
///
/// A rule looks meant for the kubelet when it names a `nodes/…` resource, `nodes` or a wildcard
/// resource in the core group, or a path the kubelet serves: such a rule that can never match is
/// warned about in full. In a rule that can match, only dead `nodes/…` entries are (`nodes/*`, a
/// subresource never asked): its other entries are for the API server. Kubernetes' own roles are
/// never warned about. A Role is asked about only by the pod-level sets of `--pod-scoped-authz`:
/// without it, one warning says the Role never applies.
pub fn role_lint(
    role: &PolicyRole<'_>,
    mapping: &AttributeMapping,
    node_name: &str,
) -> (Vec<PolicyWarning>, usize) {
    let namespaced = !role.namespace.is_empty();
    let warning = |rule: usize, field: &'static str, message: String, dead: bool| PolicyWarning {
        file: role.source_name.to_owned(),
        line: role.line,
        kind: role.kind,
        role: if namespaced {
            format!("{}/{}", role.namespace, role.name)
        } else {
            role.name.to_owned()
        },
        rule,
        field,
        message,
        rule_never_matches: dead,
    };
    if namespaced && !mapping.pod_scoped {
        if role.is_default || role.rules.is_empty() {
            return (Vec::new(), role.rules.len());
        }
        let message = "a Role is asked about only by the pod-level attributes of \
                       --pod-scoped-authz, which is off: kubelet requests have no namespace, so \
                       no rule of this Role can match"
            .to_owned();
        return (vec![warning(0, "rules", message, true)], 0);
    }
    let asked = Asked::new(mapping, namespaced);
    let mut warnings = Vec::new();
    let mut unlisted = 0;
    for (index, rule) in role.rules.iter().enumerate() {
        let (mut found, dead) = rule_warnings(rule, &asked, node_name);
        if role.is_default || (dead && !looks_meant_for_the_kubelet(rule)) {
            unlisted += usize::from(dead);
            continue;
        }
        if !dead {
            found.retain(|(field, entry, _)| *field == "resources" && entry.starts_with("nodes/"));
        }
        warnings.extend(
            found
                .into_iter()
                .map(|(field, _, message)| warning(index, field, message, dead)),
        );
    }
    (warnings, unlisted)
}

/// The first path segments the kubelet serves: a non-resource rule naming one of them was
/// meant for the kubelet.
const KUBELET_PATHS: [&str; 16] = [
    "/attach",
    "/checkpoint",
    "/configz",
    "/containerLogs",
    "/cri",
    "/debug",
    "/exec",
    "/healthz",
    "/logs",
    "/metrics",
    "/pods",
    "/portForward",
    "/run",
    "/runningpods",
    "/spec",
    "/stats",
];

/// Whether a rule names a `nodes/…` resource, `nodes` or a wildcard resource in the core group
/// (`nodes` in `metrics.k8s.io` is another API), or a path the kubelet serves.
fn looks_meant_for_the_kubelet(rule: &PolicyRule) -> bool {
    let core = rule.api_groups.iter().any(|g| g.is_empty() || g == ALL);
    rule.resources.iter().any(|r| {
        r.starts_with("nodes/") || (core && (r == "nodes" || r == ALL || r.starts_with("*/")))
    }) || rule.non_resource_urls.iter().any(|url| {
        let url = url.trim_end_matches('*');
        KUBELET_PATHS.iter().any(|path| {
            url.strip_prefix(path)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    })
}

/// The dead entries of one rule as `(field, entry, message)`, and whether the whole rule is
/// dead.
fn rule_warnings<'r>(
    rule: &'r PolicyRule,
    asked: &Asked,
    node_name: &str,
) -> (Vec<(&'static str, &'r str, String)>, bool) {
    if !rule.non_resource_urls.is_empty() {
        let message = format!(
            "nonResourceURLs {:?} never match: the kubelet only makes resource requests \
             (nodes/<subresource>)",
            rule.non_resource_urls
        );
        return (vec![("nonResourceURLs", "", message)], true);
    }
    let mut found = Vec::new();
    let mut dead = false;

    let verb_live = |v: &String| v == ALL || v.is_empty() || asked.verbs.contains(&v.as_str());
    for verb in rule.verbs.iter().filter(|v| !verb_live(v)) {
        found.push((
            "verbs",
            verb.as_str(),
            format!(
                "verb {verb:?} is never asked: the kubelet asks only {} (and \"\" for other \
                 methods)",
                asked.verbs.join(", ")
            ),
        ));
    }
    dead |= !rule.verbs.iter().any(verb_live);

    let group_live = |g: &String| g.is_empty() || g == ALL;
    for group in rule.api_groups.iter().filter(|g| !group_live(g)) {
        found.push((
            "apiGroups",
            group.as_str(),
            format!(
                "apiGroup {group:?} never matches: kubelet requests are in the core group \"\""
            ),
        ));
    }
    dead |= !rule.api_groups.iter().any(group_live);

    let mut any_resource_live = false;
    for resource in &rule.resources {
        match resource_problem(resource, asked) {
            Some(message) => found.push(("resources", resource.as_str(), message)),
            None => any_resource_live = true,
        }
    }
    dead |= !any_resource_live;

    // A pod-level set names a pod, which the lint cannot know; a node-level one this node.
    let names_node = !asked.names_are_pods
        && rule.resources.iter().all(|r| {
            r.split_once('/')
                .is_none_or(|(resource, _)| resource != POD_RESOURCE)
        });
    if names_node
        && !rule.resource_names.is_empty()
        && !rule.resource_names.iter().any(|n| n == node_name)
    {
        found.push((
            "resourceNames",
            "",
            format!(
                "resourceNames {:?} do not include this node's name {node_name:?}",
                rule.resource_names
            ),
        ));
        dead = true;
    }
    (found, dead)
}

/// Why a `resources` entry never matches a kubelet request, or `None` when it can.
fn resource_problem(resource: &str, asked: &Asked) -> Option<String> {
    if resource == ALL {
        return (asked.resources.is_empty()).then(|| {
            "no request is ever asked about in a namespace without --pod-scoped-authz".to_owned()
        });
    }
    let pods = asked.resources.iter().any(|(r, _)| *r == POD_RESOURCE);
    let (named, subresource) = match resource.split_once('/') {
        Some((named @ (RESOURCE | ALL), sub)) => (named, sub),
        Some((POD_RESOURCE, sub)) if pods => (POD_RESOURCE, sub),
        _ if resource == RESOURCE || (pods && resource == POD_RESOURCE) => {
            return Some(format!(
                "resource {resource:?} matches only requests without a subresource, and every \
                 kubelet request has one: name it, e.g. \"{resource}/{}\"",
                if resource == RESOURCE {
                    "proxy"
                } else {
                    "exec"
                }
            ));
        }
        _ => {
            return Some(format!(
                "resource {resource:?} never matches: the kubelet asks only about {}",
                if pods {
                    "nodes/<subresource> and pods/<subresource>"
                } else {
                    "nodes/<subresource>"
                }
            ));
        }
    };
    let subresources = asked.subresources_of(named);
    if subresources.contains(&subresource) {
        return None;
    }
    if subresource == ALL {
        return Some(format!(
            "{resource:?} is not a wildcard in RBAC (only \"*\" and \"*/<subresource>\" are)"
        ));
    }
    if subresources.is_empty() {
        return Some(format!(
            "resource {resource:?} never matches: the kubelet asks only about {}",
            asked.describe()
        ));
    }
    Some(format!(
        "subresource {subresource:?} is never asked: the kubelet asks only about {}",
        subresources.join(", ")
    ))
}
