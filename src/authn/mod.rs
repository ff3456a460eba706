//! Who is calling: the authenticated [`User`] and the kubelet's authenticator chain.
//!
//! The chain mirrors the kubelet's `DelegatingAuthenticatorConfig` (reference §3.3): x509 first,
//! then (later) bearer tokens; errors do not stop later authenticators, but any error prevents the
//! anonymous fallback, so a bad credential is a 401 even when anonymous access is on.

pub mod x509;

use std::collections::BTreeMap;

/// The group every authenticated (non-anonymous) user is put in, as the kubelet's
/// `AuthenticatedGroupAdder` does.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group of the anonymous user.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The anonymous user's name.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// An authenticated caller, with the same fields as Kubernetes' `user.Info`.
///
/// Built once per connection (x509) or per request (token) and shared as `Arc<User>`; every
/// authorizer sees it read-only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// The user name (certificate CN, or TokenReview `username`), case preserved.
    pub name: String,
    /// A unique identifier, empty when the credential carries none.
    pub uid: String,
    /// Groups in credential order (certificate O values), duplicates kept.
    pub groups: Vec<String>,
    /// Extra attributes, e.g. `authentication.kubernetes.io/credential-id`.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The identity given to requests that carry no credential when `--anonymous-auth` is on.
    pub fn anonymous() -> User {
        User {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        }
    }

    /// Whether `group` is among the user's groups (exact, case-sensitive).
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// Appends `system:authenticated` exactly as the kubelet's `AuthenticatedGroupAdder`: not for
    /// `system:anonymous`, and not when the user already has `system:authenticated` or
    /// `system:unauthenticated`.
    pub fn add_authenticated_group(&mut self) {
        if self.name == ANONYMOUS_USER
            || self.in_group(AUTHENTICATED_GROUP)
            || self.in_group(UNAUTHENTICATED_GROUP)
        {
            return;
        }
        self.groups.push(AUTHENTICATED_GROUP.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticated_group_added_once_and_never_to_anonymous() {
        let mut u = User {
            name: "alice".into(),
            groups: vec!["a".into()],
            ..User::default()
        };
        u.add_authenticated_group();
        u.add_authenticated_group();
        assert_eq!(u.groups, ["a", AUTHENTICATED_GROUP]);

        let mut anon_name = User {
            name: ANONYMOUS_USER.into(),
            ..User::default()
        };
        anon_name.add_authenticated_group();
        assert!(anon_name.groups.is_empty());

        let mut unauth = User {
            name: "x".into(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..User::default()
        };
        unauth.add_authenticated_group();
        assert_eq!(unauth.groups, [UNAUTHENTICATED_GROUP]);
    }
}
