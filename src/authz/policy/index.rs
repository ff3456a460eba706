//! The subject index the loader builds and `authorize` walks: bindings by user name (User and
//! ServiceAccount subjects) and by group, so a request visits only the bindings that name it.

use std::collections::HashMap;

use crate::authn::User;
use crate::authz::Reason;
use crate::authz::rbac::{GROUP_KIND, SERVICE_ACCOUNT_KIND, Subject, service_account_username};

/// A resolved ClusterRoleBinding.
#[derive(Debug)]
pub(super) struct Binding {
    /// Index into `PolicyAuthorizer::roles`.
    pub(super) role: usize,
    /// The `Allow` reason for each subject, built at load so the request path only clones an
    /// `Arc`.
    pub(super) reasons: Box<[Reason]>,
}

/// "Binding `binding` applies to this key through its subject `subject`". Each binding appears
/// at most once per key, with its first subject for that key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    pub(super) binding: usize,
    pub(super) subject: usize,
}

/// Bindings by the subjects they name, each list in ascending binding order.
#[derive(Debug, Default)]
pub(super) struct SubjectIndex {
    /// Bindings with a User subject of that name or a ServiceAccount subject whose user name
    /// (`system:serviceaccount:<ns>:<name>`) it is.
    by_user: HashMap<String, Vec<Candidate>>,
    /// Bindings with a Group subject of that name.
    by_group: HashMap<String, Vec<Candidate>>,
}

impl SubjectIndex {
    /// Records that `subject` (the `subject`-th of binding `binding`) names its user or group.
    /// Bindings must be added in ascending order; only a binding's first subject for a key is
    /// kept, as it is the one RBAC names.
    pub(super) fn add(&mut self, subject: &Subject, candidate: Candidate) {
        let (index, key) = match subject.kind.as_str() {
            GROUP_KIND => (&mut self.by_group, subject.name.clone()),
            SERVICE_ACCOUNT_KIND => (
                &mut self.by_user,
                service_account_username(&subject.namespace, &subject.name),
            ),
            _ => (&mut self.by_user, subject.name.clone()),
        };
        let list = index.entry(key).or_default();
        if list.last().is_none_or(|c| c.binding != candidate.binding) {
            list.push(candidate);
        }
    }

    /// The candidate lists that apply to `user`: one hash lookup for the name and one per group,
    /// no allocation.
    pub(super) fn lists<'a>(&'a self, user: &'a User) -> impl Iterator<Item = &'a [Candidate]> {
        self.by_user
            .get(user.name.as_str())
            .into_iter()
            .chain(
                user.groups
                    .iter()
                    .filter_map(|group| self.by_group.get(group.as_str())),
            )
            .map(Vec::as_slice)
    }
}
