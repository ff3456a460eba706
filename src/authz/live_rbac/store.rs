//! The watched objects as the watches keep them, and the policy built from them.

use std::collections::BTreeMap;

use crate::authz::policy::{ObjectKey, PolicyAuthorizer, PolicyError, WatchedBinding, WatchedRole};

/// What the watches hold, by kind, each keyed by (namespace, name). Only the watch tasks and the
/// rebuild touch it; requests read the policy built from it.
#[derive(Debug, Default)]
pub struct Store {
    /// ClusterRoles that can grant, or aggregate.
    pub cluster_roles: BTreeMap<ObjectKey, WatchedRole>,
    /// Roles that can grant (`--pod-scoped-authz`).
    pub roles: BTreeMap<ObjectKey, WatchedRole>,
    /// Every ClusterRoleBinding.
    pub cluster_role_bindings: BTreeMap<ObjectKey, WatchedBinding>,
    /// Every RoleBinding (`--pod-scoped-authz`).
    pub role_bindings: BTreeMap<ObjectKey, WatchedBinding>,
}

impl Store {
    /// The policy these objects make: ClusterRoleBindings in name order, then RoleBindings in
    /// (namespace, name) order, so the first allowing binding (the one a reason names) does not
    /// depend on the order events arrived in.
    pub fn build(&self) -> Result<PolicyAuthorizer, PolicyError> {
        PolicyAuthorizer::from_watched(
            self.cluster_roles.iter().chain(&self.roles),
            self.cluster_role_bindings.iter().chain(&self.role_bindings),
        )
    }
}
