use std::time::Duration;

use super::health::{Health, State};
use super::kinds::WatchKind;
use super::objects::Scope;
use super::store::Store;
use crate::authn::User;
use crate::authz::policy::{LabelSelector, RoleKind, WatchedBinding, WatchedRole};
use crate::authz::rbac::{PolicyRule, Subject};
use crate::authz::{Attributes, Decision, RESOURCE};

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_owned(), name.to_owned())
}

fn proxy_rule() -> PolicyRule {
    PolicyRule {
        verbs: vec!["get".to_owned()],
        api_groups: vec![String::new()],
        resources: vec!["nodes/proxy".to_owned()],
        ..PolicyRule::default()
    }
}

fn user_binding(role: &str, user: &str) -> WatchedBinding {
    WatchedBinding {
        role_kind: RoleKind::ClusterRole,
        role_name: role.to_owned(),
        subjects: vec![Subject {
            kind: "User".to_owned(),
            name: user.to_owned(),
            ..Subject::default()
        }],
    }
}

fn proxy_decision(store: &Store, user: &str) -> Decision {
    let policy = store.build().expect("watched objects always build");
    let user = User {
        name: user.to_owned(),
        ..User::default()
    };
    policy.authorize(&Attributes {
        user: &user,
        verb: "get",
        namespace: "",
        resource: RESOURCE,
        subresource: "proxy",
        name: "node-a",
        path: "/pods",
    })
}

#[test]
fn a_binding_to_a_role_not_held_grants_nothing_and_does_not_fail_the_build() {
    let mut store = Store::default();
    store
        .cluster_role_bindings
        .insert(key("", "ghost"), user_binding("missing", "alice"));
    assert!(matches!(
        proxy_decision(&store, "alice"),
        Decision::NoOpinion(_)
    ));
    store.cluster_roles.insert(
        key("", "missing"),
        WatchedRole {
            rules: vec![proxy_rule()],
            ..WatchedRole::default()
        },
    );
    match proxy_decision(&store, "alice") {
        Decision::Allow(reason) => assert_eq!(
            reason.as_str(),
            "RBAC: allowed by ClusterRoleBinding \"ghost\" of ClusterRole \"missing\" to User \"alice\""
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_aggregated_role_follows_the_labels_of_the_roles_it_selects() {
    let mut store = Store::default();
    store.cluster_roles.insert(
        key("", "kubelet-readers"),
        WatchedRole {
            aggregation: Some(vec![LabelSelector::new(
                [("kubelet".to_owned(), "true".to_owned())].into(),
                [],
            )]),
            ..WatchedRole::default()
        },
    );
    store
        .cluster_role_bindings
        .insert(key("", "b"), user_binding("kubelet-readers", "alice"));
    let mut proxy = WatchedRole {
        rules: vec![proxy_rule()],
        ..WatchedRole::default()
    };
    store.cluster_roles.insert(key("", "proxy"), proxy.clone());
    assert!(matches!(
        proxy_decision(&store, "alice"),
        Decision::NoOpinion(_)
    ));
    proxy.labels = [("kubelet".to_owned(), "true".to_owned())].into();
    store.cluster_roles.insert(key("", "proxy"), proxy);
    assert!(matches!(
        proxy_decision(&store, "alice"),
        Decision::Allow(_)
    ));
}

#[test]
fn the_first_binding_by_name_gives_the_reason_whatever_the_order_of_events() {
    let mut store = Store::default();
    store.cluster_roles.insert(
        key("", "r"),
        WatchedRole {
            rules: vec![proxy_rule()],
            ..WatchedRole::default()
        },
    );
    store
        .cluster_role_bindings
        .insert(key("", "zz"), user_binding("r", "alice"));
    store
        .cluster_role_bindings
        .insert(key("", "aa"), user_binding("r", "alice"));
    match proxy_decision(&store, "alice") {
        Decision::Allow(reason) => assert!(reason.as_str().contains("\"aa\""), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn health_is_unusable_until_every_watched_kind_synced() {
    let watched = WatchKind::watched(Scope { pods: false });
    let health = Health::new(watched, Duration::from_secs(600));
    assert!(!health.usable());
    assert_eq!(
        health.state(),
        State::NotSynced {
            kind: WatchKind::ClusterRoles
        }
    );
    health.synced(WatchKind::ClusterRoles);
    assert!(!health.usable());
    health.synced(WatchKind::ClusterRoleBindings);
    // Roles and RoleBindings are not watched without --pod-scoped-authz.
    assert!(health.usable());
    assert_eq!(health.state(), State::Fresh);
}

#[test]
fn a_broken_watch_decides_until_the_bound_then_has_no_opinion() {
    let watched = WatchKind::watched(Scope { pods: true });
    let health = Health::new(watched, Duration::from_secs(600));
    for &kind in watched {
        health.synced(kind);
    }
    health.broken(WatchKind::RoleBindings, false);
    assert!(health.usable(), "within the bound, the last state decides");
    assert!(matches!(
        health.state(),
        State::Stale {
            kind: WatchKind::RoleBindings,
            ..
        }
    ));
    assert!(!health.kind_healthy(WatchKind::RoleBindings));
    health.contact(WatchKind::RoleBindings);
    assert!(health.usable());
    assert_eq!(health.state(), State::Fresh);

    // A zero bound: no opinion from the first failure.
    let strict = Health::new(watched, Duration::ZERO);
    for &kind in watched {
        strict.synced(kind);
    }
    assert!(strict.usable());
    strict.broken(WatchKind::ClusterRoles, false);
    assert!(!strict.usable());
    assert!(matches!(
        strict.state(),
        State::Expired {
            kind: WatchKind::ClusterRoles,
            ..
        }
    ));
    strict.contact(WatchKind::ClusterRoles);
    assert!(strict.usable(), "usable again once the watch is back");
}

#[test]
fn a_broken_kind_stays_broken_when_other_kinds_change() {
    let watched = WatchKind::watched(Scope { pods: false });
    let health = Health::new(watched, Duration::ZERO);
    for &kind in watched {
        health.contact(kind);
        health.synced(kind);
    }
    health.broken(WatchKind::ClusterRoleBindings, false);
    assert!(!health.usable());
    // Every rebuild (here: after a ClusterRole changed) says again which kinds are complete.
    health.contact(WatchKind::ClusterRoles);
    for &kind in watched {
        health.synced(kind);
    }
    assert!(!health.usable(), "the broken watch still bounds the state");
    assert!(!health.kind_healthy(WatchKind::ClusterRoleBindings));
    assert!(health.kind_healthy(WatchKind::ClusterRoles));
}
