//! The `Policy` authorizer: local RBAC from ClusterRole / ClusterRoleBinding manifests (and Role /
//! RoleBinding, which only the pod-level attributes of `--pod-scoped-authz` can match), evaluated
//! like the API server's RBAC authorizer, so kubelet access rules hold while the API server is down.
//! Manifests are validated and indexed by subject once at load; a request only visits its bindings.

mod aggregate;
mod errors;
mod index;
mod kinds;
pub mod lint;
mod live;
mod load;
mod validation;

use std::collections::HashMap;

use super::rbac::{PolicyRule, RuleRequest, rule_allows};
use super::{Attributes, Decision, Reason};
use index::{Binding, Candidate, SubjectIndex};
use load::RoleSource;

pub use aggregate::LabelSelector;
pub use errors::{PolicyError, PolicyProblem};
pub use live::{ObjectKey, RoleKind, WatchedBinding, WatchedRole};
pub use load::MAX_POLICY_FILE_BYTES;

/// The reason given when no binding allows a kubelet (cluster-wide) attribute set.
const NO_BINDING_ALLOWS: Reason =
    Reason::Static("no ClusterRoleBinding of the local policy allows the request");
/// The reason given when no binding allows a pod-level (namespaced) attribute set.
const NO_BINDING_ALLOWS_IN_NAMESPACE: Reason =
    Reason::Static("no ClusterRoleBinding or RoleBinding of the local policy allows the request");

/// Counts of what a policy holds, for the start-up log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyStats {
    /// ClusterRoles loaded.
    pub cluster_roles: usize,
    /// ClusterRoleBindings loaded.
    pub cluster_role_bindings: usize,
    /// Roles loaded.
    pub roles: usize,
    /// RoleBindings loaded.
    pub role_bindings: usize,
    /// Rules over all ClusterRoles and Roles.
    pub rules: usize,
}

/// Authorizes kubelet requests from local ClusterRoles and ClusterRoleBindings, as the API
/// server's RBAC authorizer would: `Allow` when some binding applying to the user references a
/// role with a rule that allows the request, otherwise `NoOpinion` — never `Deny`.
///
/// Immutable after load, so it is shared between requests without locking. Per request it does
/// one hash lookup for the user name and one per group, evaluates only the bindings found there,
/// and allocates nothing. When several bindings allow, the first in load order (files in the
/// order given, documents and List items in file order) gives the reason.
#[derive(Debug)]
pub struct PolicyAuthorizer {
    /// Rules of each ClusterRole and Role, by role index.
    roles: Vec<Box<[PolicyRule]>>,
    /// ClusterRoleBindings and RoleBindings in load order.
    bindings: Vec<Binding>,
    /// The ClusterRoleBindings that name each user and group.
    index: SubjectIndex,
    /// The RoleBindings of each namespace that name each user and group.
    namespaces: HashMap<String, SubjectIndex>,
    /// How many of `bindings` are RoleBindings.
    role_bindings: usize,
    /// Name and definition site of each ClusterRole, by role index; read only by [`roles`]
    /// (`explain`'s policy warnings), never on the request path.
    ///
    /// [`roles`]: PolicyAuthorizer::roles
    role_sources: Vec<RoleSource>,
}

/// One ClusterRole or Role of a loaded policy as written, for tools that inspect a policy
/// (`explain`'s warnings about rules no kubelet request can match).
#[derive(Debug, Clone, Copy)]
pub struct PolicyRole<'a> {
    /// `ClusterRole` or `Role`.
    pub kind: &'static str,
    /// `metadata.namespace` of a Role; empty for a ClusterRole.
    pub namespace: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
    /// The file (or in-memory source name) that defines it.
    pub source_name: &'a str,
    /// The 1-based line where its manifest starts.
    pub line: u64,
    /// Its rules, in order (`rules[i]`); for an aggregated role written without rules, those
    /// aggregation filled in.
    pub rules: &'a [PolicyRule],
    /// One of Kubernetes' own roles (labelled `kubernetes.io/bootstrapping: rbac-defaults`), as
    /// found in a dump of a cluster's RBAC: its rules are not the operator's to fix.
    pub is_default: bool,
    /// Its rules were filled in from its `aggregationRule`.
    pub aggregated: bool,
}

impl PolicyAuthorizer {
    /// What the policy holds, for operators (logged at start-up).
    pub fn stats(&self) -> PolicyStats {
        let roles = self
            .role_sources
            .iter()
            .filter(|r| !r.namespace.is_empty())
            .count();
        PolicyStats {
            cluster_roles: self.roles.len() - roles,
            cluster_role_bindings: self.bindings.len() - self.role_bindings,
            roles,
            role_bindings: self.role_bindings,
            rules: self.roles.iter().map(|rules| rules.len()).sum(),
        }
    }

    /// The namespaces some RoleBinding is in: where the pod-level sets of `--pod-scoped-authz`
    /// can be allowed by a RoleBinding.
    pub fn binding_namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.keys().map(String::as_str)
    }

    /// Every ClusterRole and Role in load order, with where it was defined, so its rules can be checked
    /// against what the kubelet ever asks.
    pub fn roles(&self) -> impl Iterator<Item = PolicyRole<'_>> {
        self.roles
            .iter()
            .zip(&self.role_sources)
            .map(|(rules, source)| PolicyRole {
                kind: source.kind,
                namespace: &source.namespace,
                name: &source.name,
                source_name: &source.origin.source_name,
                line: source.origin.line,
                rules,
                is_default: source.is_default,
                aggregated: source.aggregated,
            })
    }

    /// Decides one attribute set as RBAC does: the ClusterRoleBindings first, then, for a
    /// namespaced set (the pod-level one), the RoleBindings of its namespace. `Allow` with RBAC's
    /// reason (`RBAC: allowed by ClusterRoleBinding "<b>" of ClusterRole "<r>" to <subject>`,
    /// naming the binding's first subject that applies), else `NoOpinion`. Never `Deny`, so later
    /// authorizers are still asked.
    pub fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let request = RuleRequest {
            verb: attrs.verb,
            api_group: "",
            resource: attrs.resource,
            subresource: attrs.subresource,
            name: attrs.name,
            resource_request: true,
            path: attrs.path,
        };
        let namespaced = (!attrs.namespace.is_empty())
            .then(|| self.namespaces.get(attrs.namespace))
            .flatten();
        for index in std::iter::once(&self.index).chain(namespaced) {
            if let Some(decision) = self.first_allowing(index, attrs, &request) {
                return decision;
            }
        }
        Decision::NoOpinion(if attrs.namespace.is_empty() {
            NO_BINDING_ALLOWS
        } else {
            NO_BINDING_ALLOWS_IN_NAMESPACE
        })
    }

    /// The `Allow` of the first binding in `index` (lowest in load order) that applies to the
    /// user and allows `request`.
    fn first_allowing(
        &self,
        index: &SubjectIndex,
        attrs: &Attributes<'_>,
        request: &RuleRequest<'_>,
    ) -> Option<Decision> {
        let lists = index.lists(attrs.user);
        // The allowing candidate with the lowest (binding, subject): each list is sorted, so it
        // is abandoned as soon as it reaches a binding after the best found so far.
        let mut best: Option<Candidate> = None;
        for list in lists {
            for &candidate in list {
                match best {
                    Some(found) if candidate.binding > found.binding => break,
                    Some(found) if candidate.binding == found.binding => {
                        if candidate.subject < found.subject {
                            best = Some(candidate);
                        }
                        break;
                    }
                    _ if self.binding_allows(candidate.binding, request) => {
                        best = Some(candidate);
                        break;
                    }
                    _ => {}
                }
            }
        }
        best.map(|c| Decision::Allow(self.bindings[c.binding].reasons[c.subject].clone()))
    }

    /// Whether some rule of the role of binding `binding` allows `request`.
    fn binding_allows(&self, binding: usize, request: &RuleRequest<'_>) -> bool {
        self.roles[self.bindings[binding].role]
            .iter()
            .any(|rule| rule_allows(rule, request))
    }
}

#[cfg(test)]
mod dump_tests;
#[cfg(test)]
mod tests;
