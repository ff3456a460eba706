//! The API server's validation of a role's rules and a binding's subjects, so that a rule or
//! subject written wrong fails the load instead of silently granting nothing.

use super::errors::PolicyProblem;
use super::kinds::{Kind, RBAC_API_GROUP};
use crate::authz::rbac::{GROUP_KIND, PolicyRule, SERVICE_ACCOUNT_KIND, Subject, USER_KIND};

/// Checks one ClusterRole rule as the API server's validation would: a forgotten `apiGroups: [""]`
/// or `verbs` would otherwise load as a rule that silently grants nothing.
pub(super) fn rule_problem(rule: &PolicyRule) -> Option<&'static str> {
    if rule.verbs.is_empty() {
        return Some("verbs must contain at least one value");
    }
    if !rule.non_resource_urls.is_empty() {
        let mixed = !(rule.api_groups.is_empty()
            && rule.resources.is_empty()
            && rule.resource_names.is_empty());
        return mixed
            .then_some("rules cannot apply to both regular resources and non-resource URLs");
    }
    if rule.api_groups.is_empty() {
        return Some("resource rules must supply at least one api group");
    }
    if rule.resources.is_empty() {
        return Some("resource rules must supply at least one resource");
    }
    None
}

/// Checks one subject of a binding of kind `binding` as the API server's validation would, and
/// rejects what could never match.
pub(super) fn subject_problem(
    index: usize,
    subject: &Subject,
    binding: Kind,
) -> Option<PolicyProblem> {
    let api_group_ok = match subject.kind.as_str() {
        USER_KIND | GROUP_KIND => {
            subject.api_group.is_empty() || subject.api_group == RBAC_API_GROUP
        }
        SERVICE_ACCOUNT_KIND => subject.api_group.is_empty(),
        _ => {
            return Some(PolicyProblem::UnknownSubjectKind {
                index,
                kind: subject.kind.clone(),
            });
        }
    };
    if subject.name.is_empty() {
        return Some(PolicyProblem::EmptySubjectName { index });
    }
    if !api_group_ok {
        return Some(PolicyProblem::BadSubjectApiGroup {
            index,
            kind: subject.kind.clone(),
            api_group: subject.api_group.clone(),
        });
    }
    // In a RoleBinding it defaults to the binding's namespace.
    if subject.kind == SERVICE_ACCOUNT_KIND
        && subject.namespace.is_empty()
        && binding == Kind::ClusterRoleBinding
    {
        return Some(PolicyProblem::ServiceAccountWithoutNamespace {
            index,
            name: subject.name.clone(),
        });
    }
    None
}
