//! The `Policy` authorizer: local RBAC from ClusterRole / ClusterRoleBinding manifests, evaluated
//! like the API server's RBAC authorizer, so kubelet access rules hold while the API server is down.
//! Manifests are validated and indexed by subject once at load; a request only visits its bindings.

mod aggregate;
mod index;
pub mod lint;
mod load;

use super::rbac::{PolicyRule, RuleRequest, rule_allows};
use super::{Attributes, Decision, RESOURCE, Reason};
use index::{Binding, Candidate, SubjectIndex};
use load::RoleSource;

pub use load::{MAX_POLICY_FILE_BYTES, PolicyError, PolicyProblem};

/// The reason given when no binding allows a request.
const NO_BINDING_ALLOWS: Reason =
    Reason::Static("no ClusterRoleBinding of the local policy allows the request");

/// Counts of what a policy holds, for the start-up log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyStats {
    /// ClusterRoles loaded.
    pub cluster_roles: usize,
    /// ClusterRoleBindings loaded.
    pub cluster_role_bindings: usize,
    /// Rules over all ClusterRoles.
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
    /// Rules of each ClusterRole, by role index.
    roles: Vec<Box<[PolicyRule]>>,
    /// ClusterRoleBindings in load order.
    bindings: Vec<Binding>,
    /// The bindings that name each user and group.
    index: SubjectIndex,
    /// Name and definition site of each ClusterRole, by role index; read only by [`roles`]
    /// (`explain`'s policy warnings), never on the request path.
    ///
    /// [`roles`]: PolicyAuthorizer::roles
    role_sources: Vec<RoleSource>,
}

/// One ClusterRole of a loaded policy as written, for tools that inspect a policy (`explain`'s
/// warnings about rules no kubelet request can match).
#[derive(Debug, Clone, Copy)]
pub struct PolicyRole<'a> {
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
        PolicyStats {
            cluster_roles: self.roles.len(),
            cluster_role_bindings: self.bindings.len(),
            rules: self.roles.iter().map(|rules| rules.len()).sum(),
        }
    }

    /// Every ClusterRole in load order, with where it was defined, so its rules can be checked
    /// against what the kubelet ever asks.
    pub fn roles(&self) -> impl Iterator<Item = PolicyRole<'_>> {
        self.roles
            .iter()
            .zip(&self.role_sources)
            .map(|(rules, source)| PolicyRole {
                name: &source.name,
                source_name: &source.origin.source_name,
                line: source.origin.line,
                rules,
                is_default: source.is_default,
                aggregated: source.aggregated,
            })
    }

    /// Decides one kubelet attribute: `Allow` with RBAC's reason
    /// (`RBAC: allowed by ClusterRoleBinding "<b>" of ClusterRole "<r>" to <subject>`, naming the
    /// binding's first subject that applies), else `NoOpinion`. Never `Deny`, so later
    /// authorizers are still asked.
    pub fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let request = RuleRequest {
            verb: attrs.verb,
            api_group: "",
            resource: RESOURCE,
            subresource: attrs.subresource,
            name: attrs.name,
            resource_request: true,
            path: attrs.path,
        };
        let lists = self.index.lists(attrs.user);
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
                    _ if self.binding_allows(candidate.binding, &request) => {
                        best = Some(candidate);
                        break;
                    }
                    _ => {}
                }
            }
        }
        match best {
            Some(c) => Decision::Allow(self.bindings[c.binding].reasons[c.subject].clone()),
            None => Decision::NoOpinion(NO_BINDING_ALLOWS),
        }
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
