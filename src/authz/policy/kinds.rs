//! The kinds of object a policy file may hold (roles, bindings and lists of them), each with its
//! name, apiVersion and top-level fields, and the RBAC names that go with them.

use super::errors::PolicyProblem;

/// The only apiVersion accepted for ClusterRole and ClusterRoleBinding.
pub(super) const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";
/// The API group a roleRef (and a User or Group subject) names.
pub(super) const RBAC_API_GROUP: &str = "rbac.authorization.k8s.io";
/// The apiVersion of `kind: List`, as `kubectl get -o yaml` writes it.
pub(super) const LIST_API_VERSION: &str = "v1";

/// The label Kubernetes puts on the roles and bindings it creates itself (bootstrap policy).
pub(super) const BOOTSTRAPPING_LABEL: (&str, &str) =
    ("kubernetes.io/bootstrapping", "rbac-defaults");

/// The kinds a policy file may hold, parsed once from a document's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    ClusterRole,
    ClusterRoleBinding,
    /// Namespaced: grants only on the pod-level attributes of `--pod-scoped-authz`.
    Role,
    /// Namespaced, as [`Kind::Role`].
    RoleBinding,
    /// `kind: List`, as `kubectl get -o yaml` writes several objects.
    List,
    /// A typed list, as the API server answers a list request (`GET .../clusterroles`): its
    /// items may leave out `apiVersion` and `kind`.
    ClusterRoleList,
    /// The same for ClusterRoleBindings.
    ClusterRoleBindingList,
    /// The same for Roles.
    RoleList,
    /// The same for RoleBindings.
    RoleBindingList,
}

/// Every kind with its name, the kind of its items (typed lists) and its top-level fields
/// besides apiVersion, kind and metadata.
const KINDS: [(Kind, &str, Option<Kind>, &[&str]); 9] = [
    (
        Kind::ClusterRole,
        "ClusterRole",
        None,
        &["rules", "aggregationRule"],
    ),
    (
        Kind::ClusterRoleBinding,
        "ClusterRoleBinding",
        None,
        &["subjects", "roleRef"],
    ),
    (Kind::Role, "Role", None, &["rules"]),
    (
        Kind::RoleBinding,
        "RoleBinding",
        None,
        &["subjects", "roleRef"],
    ),
    (Kind::List, "List", None, &["items"]),
    (
        Kind::ClusterRoleList,
        "ClusterRoleList",
        Some(Kind::ClusterRole),
        &["items"],
    ),
    (
        Kind::ClusterRoleBindingList,
        "ClusterRoleBindingList",
        Some(Kind::ClusterRoleBinding),
        &["items"],
    ),
    (Kind::RoleList, "RoleList", Some(Kind::Role), &["items"]),
    (
        Kind::RoleBindingList,
        "RoleBindingList",
        Some(Kind::RoleBinding),
        &["items"],
    ),
];

impl Kind {
    /// Its row of [`KINDS`].
    fn row(self) -> &'static (Kind, &'static str, Option<Kind>, &'static [&'static str]) {
        // Every variant has its row.
        KINDS
            .iter()
            .find(|row| row.0 == self)
            .expect("a row per kind")
    }

    /// The kind as written.
    pub(super) fn name(self) -> &'static str {
        self.row().1
    }

    /// Whether this kind holds `items`.
    pub(super) fn is_list(self) -> bool {
        self == Kind::List || self.item_kind().is_some()
    }

    /// The kind of the items of a typed list, which the API server writes without `kind`.
    pub(super) fn item_kind(self) -> Option<Kind> {
        self.row().2
    }

    /// Whether objects of this kind live in a namespace.
    pub(super) fn is_namespaced(self) -> bool {
        matches!(self, Kind::Role | Kind::RoleBinding)
    }

    /// Whether this kind is a role (holds rules).
    pub(super) fn is_role(self) -> bool {
        matches!(self, Kind::ClusterRole | Kind::Role)
    }

    /// The only apiVersion accepted with it.
    pub(super) fn api_version(self) -> &'static str {
        if self == Kind::List {
            LIST_API_VERSION
        } else {
            RBAC_API_VERSION
        }
    }

    /// The top-level fields (besides apiVersion, kind and metadata) it may have.
    pub(super) fn fields(self) -> &'static [&'static str] {
        self.row().3
    }

    /// The kind a document declares; `in_list` for the items of a list, which cannot nest.
    pub(super) fn parse(kind: &str, in_list: bool) -> Result<Kind, PolicyProblem> {
        if kind.is_empty() {
            return Err(PolicyProblem::MissingKind);
        }
        match KINDS.iter().find(|row| row.1 == kind) {
            Some(&(kind, ..)) if in_list && kind.is_list() => Err(PolicyProblem::NestedList),
            Some(&(kind, ..)) => Ok(kind),
            None => Err(PolicyProblem::UnknownKind(kind.to_owned())),
        }
    }
}
