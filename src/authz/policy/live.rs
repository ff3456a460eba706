//! A policy built from the roles and bindings the `RBAC` authorizer watches
//! ([`crate::authz::live_rbac`]) rather than from files: the same resolution, aggregation and
//! subject index, so the two modes decide with one evaluator. The API server validated every
//! object already; what differs from files is that a binding may name a role that does not exist
//! (or that the watch did not keep), which grants nothing instead of failing the load.

use std::collections::BTreeMap;

use super::PolicyAuthorizer;
use super::aggregate::{AggregationRule, LabelSelector};
use super::errors::PolicyError;
use super::kinds::Kind;
use super::load::{Loader, MissingRole, Origin, PendingBinding, PendingRole};
use crate::authz::rbac::{PolicyRule, Subject};

/// What the RBAC authorizer's `explain` and error messages name as the source of a watched object.
const WATCHED_SOURCE: &str = "the API server";

/// An object's namespace (empty for cluster-scoped kinds) and name: how watched objects are keyed.
pub type ObjectKey = (String, String);

/// A ClusterRole (namespace empty) or Role as the watch keeps it: only what decisions use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchedRole {
    /// `metadata.labels`, which aggregated ClusterRoles select by; kept only where aggregation
    /// can read them.
    pub labels: BTreeMap<String, String>,
    /// The rules that can grant an attribute the proxy asks about, in order.
    pub rules: Vec<PolicyRule>,
    /// The `aggregationRule` selectors of a ClusterRole written without rules, which are filled
    /// in from the roles they select.
    pub aggregation: Option<Vec<LabelSelector>>,
}

/// The kind of role a binding's `roleRef` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    /// A ClusterRole.
    ClusterRole,
    /// A Role in the binding's namespace (RoleBindings only).
    Role,
}

/// A ClusterRoleBinding (namespace empty) or RoleBinding as the watch keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchedBinding {
    /// `roleRef.kind`.
    pub role_kind: RoleKind,
    /// `roleRef.name`.
    pub role_name: String,
    /// `subjects`.
    pub subjects: Vec<Subject>,
}

impl PolicyAuthorizer {
    /// The policy the watched objects make, bindings in the order given (the first allowing one
    /// gives the reason). A binding whose role is not among `roles` grants nothing.
    pub fn from_watched<'a>(
        roles: impl IntoIterator<Item = (&'a ObjectKey, &'a WatchedRole)>,
        bindings: impl IntoIterator<Item = (&'a ObjectKey, &'a WatchedBinding)>,
    ) -> Result<PolicyAuthorizer, PolicyError> {
        let origin = Origin {
            source_name: WATCHED_SOURCE.to_owned(),
            line: 0,
        };
        let mut loader = Loader::default();
        for ((namespace, name), role) in roles {
            loader.add_role(PendingRole {
                kind: if namespace.is_empty() {
                    Kind::ClusterRole
                } else {
                    Kind::Role
                },
                namespace: namespace.clone(),
                name: name.clone(),
                labels: role.labels.clone(),
                rules: role.rules.clone(),
                fill_from: role
                    .aggregation
                    .clone()
                    .filter(|_| role.rules.is_empty())
                    .map(AggregationRule::new),
                origin: origin.clone(),
            });
        }
        for ((namespace, name), binding) in bindings {
            loader.add_binding(PendingBinding {
                kind: if namespace.is_empty() {
                    Kind::ClusterRoleBinding
                } else {
                    Kind::RoleBinding
                },
                namespace: namespace.clone(),
                name: name.clone(),
                role_kind: match binding.role_kind {
                    RoleKind::ClusterRole => Kind::ClusterRole,
                    RoleKind::Role => Kind::Role,
                },
                role_name: binding.role_name.clone(),
                subjects: binding.subjects.clone(),
                origin: origin.clone(),
            });
        }
        loader.finish(MissingRole::Skip)
    }
}
