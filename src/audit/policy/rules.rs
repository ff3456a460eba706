//! One compiled policy rule and how it matches a request, step for step as kube-apiserver's
//! `ruleMatches`: users, then userGroups, then verbs, then resources and namespaces or
//! nonResourceURLs. Lists become sets at load, so a caller with hundreds of groups costs one
//! lookup per group and nothing is allocated.

use std::collections::HashSet;

use super::{Level, PolicyRequest, Stages};
use crate::authn::User;

/// Lists up to this long are scanned; longer ones are hashed.
const SCAN_UP_TO: usize = 8;

/// A list of names from the file (users, groups, verbs, namespaces, resource names), matched
/// exactly: kube-apiserver's audit policy has no wildcard in these.
#[derive(Debug)]
pub(super) struct Names {
    /// Bit `n` set when a name is `n` bytes long (bit 63: 63 or more): most names asked about
    /// (a caller's hundreds of groups) are ruled out by their length alone, before any compare
    /// or hash.
    lengths: u64,
    list: List,
}

#[derive(Debug)]
enum List {
    /// Short: compared one by one, quicker than hashing.
    Few(Box<[Box<str>]>),
    /// Long: hashed.
    Many(HashSet<Box<str>>),
}

fn length_bit(name: &str) -> u64 {
    1 << name.len().min(63)
}

impl Names {
    pub(super) fn new(names: Vec<String>) -> Names {
        let lengths = names.iter().fold(0, |bits, name| bits | length_bit(name));
        let list = if names.len() <= SCAN_UP_TO {
            List::Few(names.into_iter().map(String::into_boxed_str).collect())
        } else {
            List::Many(names.into_iter().map(String::into_boxed_str).collect())
        };
        Names { lengths, list }
    }

    /// Whether the list is empty: the field does not constrain the rule.
    pub(super) fn is_empty(&self) -> bool {
        self.lengths == 0
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        if self.lengths & length_bit(name) == 0 {
            return false;
        }
        match &self.list {
            List::Few(names) => names.iter().any(|n| &**n == name),
            List::Many(names) => names.contains(name),
        }
    }
}

/// One entry of a rule's `resources`: an API group, its resources (with the `*`, `*/sub` and
/// `resource/*` forms) and optionally the object names.
#[derive(Debug)]
pub(super) struct GroupResources {
    pub(super) group: Box<str>,
    pub(super) resources: Box<[Box<str>]>,
    pub(super) resource_names: Names,
}

/// A rule of the policy, validated and compiled.
#[derive(Debug)]
pub(super) struct Rule {
    pub(super) level: Level,
    /// The rule's `omitStages` and the policy's together, as kube-apiserver merges them at load.
    pub(super) omit_stages: Stages,
    pub(super) users: Names,
    pub(super) user_groups: Names,
    pub(super) verbs: Names,
    pub(super) namespaces: Names,
    pub(super) resources: Box<[GroupResources]>,
    pub(super) non_resource_urls: Box<[Box<str>]>,
}

impl Rule {
    /// Whether the rule matches `request`.
    pub(super) fn matches(&self, request: &PolicyRequest<'_>) -> bool {
        self.matches_user(request.user) && self.matches_request(request)
    }

    /// Whether the rule names users or groups: it matches only some callers.
    pub(super) fn constrains_user(&self) -> bool {
        !self.users.is_empty() || !self.user_groups.is_empty()
    }

    /// The `users` and `userGroups` conditions; a request without a user matches neither.
    fn matches_user(&self, user: Option<&User>) -> bool {
        if !self.users.is_empty() && !user.is_some_and(|u| self.users.contains(&u.name)) {
            return false;
        }
        if !self.user_groups.is_empty()
            && !user.is_some_and(|u| u.groups.iter().any(|g| self.user_groups.contains(g)))
        {
            return false;
        }
        true
    }

    /// Every condition but the user's: verbs, then resources and namespaces, or
    /// nonResourceURLs.
    pub(super) fn matches_request(&self, request: &PolicyRequest<'_>) -> bool {
        if !self.verbs.is_empty() && !self.verbs.contains(request.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(request);
        }
        if !self.non_resource_urls.is_empty() {
            // kube-apiserver matches these only to requests without a resource; every request
            // the proxy maps has one (nodes/*), so the request path is matched instead.
            return self
                .non_resource_urls
                .iter()
                .any(|spec| path_matches(request.path, spec));
        }
        true
    }

    /// kube-apiserver's `ruleMatchesResource`, on the event's `objectRef` (API group `""`).
    fn matches_resource(&self, request: &PolicyRequest<'_>) -> bool {
        let Some(object) = request.object_ref else {
            return false;
        };
        // Non-namespaced resources use the empty string.
        let namespace = object.namespace.as_deref().unwrap_or("");
        if !self.namespaces.is_empty() && !self.namespaces.contains(namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let (resource, subresource) = (object.resource, object.subresource);
        for group in self.resources.iter().filter(|g| g.group.is_empty()) {
            if group.resources.is_empty() {
                return true;
            }
            if !group.resource_names.is_empty() && !group.resource_names.contains(&object.name) {
                continue;
            }
            if group
                .resources
                .iter()
                .any(|spec| resource_matches(spec, resource, subresource))
            {
                return true;
            }
        }
        false
    }
}

/// Whether `spec` from `resources` matches `resource` with `subresource` (empty for none):
/// `resource/subresource` exactly, `*`, `*/subresource`, or `resource/*` (which also matches the
/// resource without a subresource), in kube-apiserver's order.
pub(super) fn resource_matches(spec: &str, resource: &str, subresource: &str) -> bool {
    let combined = if subresource.is_empty() {
        spec == resource
    } else {
        spec.strip_prefix(resource)
            .and_then(|rest| rest.strip_prefix('/'))
            == Some(subresource)
    };
    if combined || spec == "*" {
        return true;
    }
    if !subresource.is_empty() && spec.strip_prefix("*/") == Some(subresource) {
        return true;
    }
    spec.strip_suffix("/*") == Some(resource)
}

/// kube-apiserver's `pathMatches`: `*`, the exact path, or a prefix ending in `*`.
pub(super) fn path_matches(path: &str, spec: &str) -> bool {
    if spec == "*" || spec == path {
        return true;
    }
    match spec.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix.trim_end_matches('*')),
        None => false,
    }
}
