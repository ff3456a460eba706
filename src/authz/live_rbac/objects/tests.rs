use k8s_openapi::api::rbac::v1 as rbac;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::*;

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> rbac::PolicyRule {
    rbac::PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..rbac::PolicyRule::default()
    }
}

fn cluster_role(rules: Vec<rbac::PolicyRule>) -> rbac::ClusterRole {
    rbac::ClusterRole {
        metadata: ObjectMeta {
            name: Some("r".to_owned()),
            labels: Some([("team".to_owned(), "a".to_owned())].into()),
            annotations: Some([("note".to_owned(), "x".repeat(1000))].into()),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
        ..rbac::ClusterRole::default()
    }
}

const NODES: Scope = Scope { pods: false };
const PODS: Scope = Scope { pods: true };

#[test]
fn only_rules_that_can_grant_a_kubelet_attribute_are_kept() {
    let role = cluster_role(vec![
        rule(&[""], &["configmaps"], &["get"]),
        rule(&[""], &["nodes/proxy"], &["get"]),
        rule(&["apps"], &["nodes/proxy"], &["get"]),
        rule(&["*"], &["*/stats"], &["*"]),
        rule(&[""], &["nodes"], &["get"]),
        rule(&[""], &["nodes/proxy"], &[]),
        rule(&[""], &["pods/exec"], &["create"]),
        rule(&[""], &["*"], &["list"]),
    ]);
    let kept = NODES
        .cluster_role(role.clone())
        .expect("some rules can grant");
    let resources: Vec<&[String]> = kept.rules.iter().map(|r| r.resources.as_slice()).collect();
    assert_eq!(
        resources,
        vec![
            &["nodes/proxy".to_owned()][..],
            &["*/stats".to_owned()],
            &["*".to_owned()]
        ]
    );
    assert_eq!(kept.labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(kept.aggregation, None);

    // With --pod-scoped-authz, pods/exec can grant too.
    let kept = PODS.cluster_role(role).expect("some rules can grant");
    assert!(
        kept.rules
            .iter()
            .any(|r| r.resources == ["pods/exec".to_owned()])
    );
}

#[test]
fn roles_that_grant_nothing_the_proxy_asks_are_not_kept() {
    let role = cluster_role(vec![rule(&[""], &["configmaps", "secrets"], &["*"])]);
    assert_eq!(NODES.cluster_role(role), None);
    let pods_only = cluster_role(vec![rule(&[""], &["pods/log"], &["get"])]);
    assert_eq!(NODES.cluster_role(pods_only.clone()), None);
    assert!(PODS.cluster_role(pods_only).is_some());

    let namespaced = rbac::Role {
        metadata: ObjectMeta {
            name: Some("r".to_owned()),
            namespace: Some("ns".to_owned()),
            labels: Some([("team".to_owned(), "a".to_owned())].into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![rule(&[""], &["pods/exec"], &["create"])]),
    };
    let kept = PODS.role(namespaced).expect("pods/exec can grant");
    // Aggregation never selects Roles: their labels are not kept.
    assert!(kept.labels.is_empty());
}

#[test]
fn an_aggregated_role_without_rules_keeps_its_selectors_and_labels() {
    let mut role = cluster_role(Vec::new());
    role.aggregation_rule = Some(rbac::AggregationRule {
        cluster_role_selectors: Some(vec![LabelSelector {
            match_labels: Some([("kubelet".to_owned(), "true".to_owned())].into()),
            ..LabelSelector::default()
        }]),
    });
    let kept = NODES
        .cluster_role(role.clone())
        .expect("aggregated roles are kept");
    assert!(kept.rules.is_empty());
    assert_eq!(kept.aggregation.as_ref().map(Vec::len), Some(1));

    // Rules the controller already wrote are used as they are: no selectors kept, and none of
    // them grants anything here.
    role.rules = Some(vec![rule(&[""], &["configmaps"], &["get"])]);
    assert_eq!(NODES.cluster_role(role), None);
}

#[test]
fn bindings_keep_their_role_and_subjects() {
    let binding = super::binding(
        rbac::RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: "reader".to_owned(),
        },
        Some(vec![rbac::Subject {
            kind: "ServiceAccount".to_owned(),
            name: "scraper".to_owned(),
            namespace: Some("monitoring".to_owned()),
            api_group: None,
        }]),
    )
    .expect("a ClusterRole roleRef");
    assert_eq!(binding.role_kind, RoleKind::ClusterRole);
    assert_eq!(binding.role_name, "reader");
    assert_eq!(binding.subjects[0].namespace, "monitoring");

    let other_group = super::binding(
        rbac::RoleRef {
            api_group: Some("example.com".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: "reader".to_owned(),
        },
        None,
    );
    assert_eq!(other_group, None);
}
