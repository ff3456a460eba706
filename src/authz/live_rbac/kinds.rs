//! The four kinds the `RBAC` authorizer watches, each with what the watch keeps of it and where.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::rbac::v1 as rbac;
use serde::de::DeserializeOwned;

use super::objects::{self, Scope};
use super::store::Store;
use crate::authz::policy::{ObjectKey, WatchedBinding, WatchedRole};

/// A watched kind, as metrics label it and messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchKind {
    /// `clusterroles`.
    ClusterRoles,
    /// `clusterrolebindings`.
    ClusterRoleBindings,
    /// `roles`, all namespaces (`--pod-scoped-authz` only).
    Roles,
    /// `rolebindings`, all namespaces (`--pod-scoped-authz` only).
    RoleBindings,
}

impl WatchKind {
    /// Every kind, in the order they are listed and reported.
    pub const ALL: [WatchKind; 4] = [
        WatchKind::ClusterRoles,
        WatchKind::ClusterRoleBindings,
        WatchKind::Roles,
        WatchKind::RoleBindings,
    ];

    /// The kinds watched: Roles and RoleBindings can only grant the pod-level sets.
    pub fn watched(scope: Scope) -> &'static [WatchKind] {
        if scope.pods {
            &WatchKind::ALL
        } else {
            &WatchKind::ALL[..2]
        }
    }

    /// The resource, as RBAC rules and `kubectl` name it.
    pub fn resource(self) -> &'static str {
        match self {
            WatchKind::ClusterRoles => "clusterroles",
            WatchKind::ClusterRoleBindings => "clusterrolebindings",
            WatchKind::Roles => "roles",
            WatchKind::RoleBindings => "rolebindings",
        }
    }

    /// The position in [`WatchKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A Kubernetes type the authorizer watches.
pub(super) trait Watched:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static
{
    /// Which kind it is.
    const KIND: WatchKind;
    /// What the watch keeps of one.
    type Held: Send + 'static;
    /// What the watch keeps of `self`, `None` when nothing a decision could use.
    fn hold(self, scope: Scope) -> Option<Self::Held>;
    /// Where the store keeps this kind.
    fn slot(store: &mut Store) -> &mut BTreeMap<ObjectKey, Self::Held>;
}

impl Watched for rbac::ClusterRole {
    const KIND: WatchKind = WatchKind::ClusterRoles;
    type Held = WatchedRole;
    fn hold(self, scope: Scope) -> Option<WatchedRole> {
        scope.cluster_role(self)
    }
    fn slot(store: &mut Store) -> &mut BTreeMap<ObjectKey, WatchedRole> {
        &mut store.cluster_roles
    }
}

impl Watched for rbac::Role {
    const KIND: WatchKind = WatchKind::Roles;
    type Held = WatchedRole;
    fn hold(self, scope: Scope) -> Option<WatchedRole> {
        scope.role(self)
    }
    fn slot(store: &mut Store) -> &mut BTreeMap<ObjectKey, WatchedRole> {
        &mut store.roles
    }
}

impl Watched for rbac::ClusterRoleBinding {
    const KIND: WatchKind = WatchKind::ClusterRoleBindings;
    type Held = WatchedBinding;
    fn hold(self, _scope: Scope) -> Option<WatchedBinding> {
        objects::binding(self.role_ref, self.subjects)
    }
    fn slot(store: &mut Store) -> &mut BTreeMap<ObjectKey, WatchedBinding> {
        &mut store.cluster_role_bindings
    }
}

impl Watched for rbac::RoleBinding {
    const KIND: WatchKind = WatchKind::RoleBindings;
    type Held = WatchedBinding;
    fn hold(self, _scope: Scope) -> Option<WatchedBinding> {
        objects::binding(self.role_ref, self.subjects)
    }
    fn slot(store: &mut Store) -> &mut BTreeMap<ObjectKey, WatchedBinding> {
        &mut store.role_bindings
    }
}
