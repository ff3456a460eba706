//! What the `RBAC` mode holds for a large cluster, without an API server: the kept form of a
//! generated RBAC set (5,000 ClusterRoles, half of them granting a kubelet subresource and half
//! about other resources, which are not kept; 5,000 ClusterRoleBindings; 20,000 RoleBindings in
//! 2,000 namespaces with 2,000 Roles granting `pods/exec`), the policy built from it as each
//! change rebuilds it, the resident memory each adds, and how long a rebuild takes (the part of
//! a change's latency spent on the node).
//!
//! ```text
//! cargo run --release --example rbac_held
//! cargo run --release --example rbac_held -- --cluster-roles 100 --bindings 100 --role-bindings 0
//! ```
//!
//! The held form is built with the same conversion the watch applies to each object
//! (`Scope::cluster_role`, `objects::binding`) from k8s-openapi objects, as they arrive
//! deserialized from the API server; those objects are dropped once converted, as in the proxy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1 as rbac;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubelet_auth_proxy::authz::live_rbac::Scope;
use kubelet_auth_proxy::authz::live_rbac::hold_binding;
use kubelet_auth_proxy::authz::policy::{ObjectKey, PolicyAuthorizer, WatchedBinding, WatchedRole};

struct Sizes {
    cluster_roles: usize,
    bindings: usize,
    role_bindings: usize,
    namespaces: usize,
}

fn main() {
    let sizes = match parse(std::env::args().skip(1)) {
        Ok(sizes) => sizes,
        Err(e) => {
            eprintln!("rbac_held: {e}");
            std::process::exit(2);
        }
    };
    let scope = Scope { pods: true };
    let before = rss_kib();
    let mut roles: BTreeMap<ObjectKey, WatchedRole> = BTreeMap::new();
    let mut bindings: BTreeMap<ObjectKey, WatchedBinding> = BTreeMap::new();
    for i in 0..sizes.cluster_roles {
        let resources = if i % 2 == 0 {
            vec!["nodes/proxy".to_owned(), "nodes/stats".to_owned()]
        } else {
            vec!["configmaps".to_owned(), "secrets".to_owned()]
        };
        let role = rbac::ClusterRole {
            metadata: meta(&format!("role-{i:05}"), None),
            rules: Some(vec![rule(resources, &["get", "list", "watch"])]),
            ..rbac::ClusterRole::default()
        };
        if let Some(held) = scope.cluster_role(role) {
            roles.insert((String::new(), format!("role-{i:05}")), held);
        }
    }
    for n in 0..sizes.namespaces {
        let namespace = format!("team-{n:04}");
        let role = rbac::Role {
            metadata: meta("exec", Some(&namespace)),
            rules: Some(vec![rule(vec!["pods/exec".to_owned()], &["create"])]),
        };
        if let Some(held) = scope.role(role) {
            roles.insert((namespace, "exec".to_owned()), held);
        }
    }
    for i in 0..sizes.bindings {
        let binding = rbac::ClusterRoleBinding {
            metadata: meta(&format!("binding-{i:05}"), None),
            role_ref: role_ref(
                "ClusterRole",
                &format!("role-{:05}", i % sizes.cluster_roles.max(1)),
            ),
            subjects: Some(vec![subject("User", &format!("user-{i:05}"), None)]),
        };
        if let Some(held) = hold_binding(binding.role_ref, binding.subjects) {
            bindings.insert((String::new(), format!("binding-{i:05}")), held);
        }
    }
    for i in 0..sizes.role_bindings {
        let namespace = format!("team-{:04}", i % sizes.namespaces.max(1));
        let binding = rbac::RoleBinding {
            metadata: meta(&format!("exec-{i:05}"), Some(&namespace)),
            role_ref: role_ref("Role", "exec"),
            subjects: Some(vec![subject(
                "ServiceAccount",
                &format!("tool-{i:05}"),
                Some(&namespace),
            )]),
        };
        if let Some(held) = hold_binding(binding.role_ref, binding.subjects) {
            bindings.insert((namespace, format!("exec-{i:05}")), held);
        }
    }
    let held = rss_kib();
    let started = Instant::now();
    let first = PolicyAuthorizer::from_watched(&roles, &bindings);
    let mut builds = vec![started.elapsed()];
    let one = rss_kib();
    let mut policy = Some(first);
    for _ in 0..4 {
        let started = Instant::now();
        let built = PolicyAuthorizer::from_watched(&roles, &bindings);
        builds.push(started.elapsed());
        // Replaced as a rebuild replaces the policy in force: at most two alive at once.
        policy = Some(built);
    }
    let built = rss_kib();
    builds.sort();
    let stats = match policy {
        Some(Ok(policy)) => policy.stats(),
        Some(Err(e)) => {
            eprintln!("rbac_held: the generated set makes no policy: {e}");
            std::process::exit(1);
        }
        None => unreachable!("five builds ran"),
    };
    println!(
        "generated: {} ClusterRoles ({} can grant), {} ClusterRoleBindings, {} Roles, {} RoleBindings in {} namespaces",
        sizes.cluster_roles,
        sizes.cluster_roles.div_ceil(2),
        sizes.bindings,
        sizes.namespaces,
        sizes.role_bindings,
        sizes.namespaces
    );
    println!(
        "held: {} roles, {} bindings; policy: {} ClusterRoles, {} ClusterRoleBindings, {} Roles, {} RoleBindings, {} rules",
        roles.len(),
        bindings.len(),
        stats.cluster_roles,
        stats.cluster_role_bindings,
        stats.roles,
        stats.role_bindings,
        stats.rules
    );
    println!(
        "RSS: {} KiB at start, +{} KiB the held objects, +{} KiB the policy built from them, \
         +{} KiB more after four rebuilds (the policy in force and the one being built)",
        before,
        held.saturating_sub(before),
        one.saturating_sub(held),
        built.saturating_sub(one)
    );
    println!(
        "rebuild: median {:.1} ms, min {:.1} ms, max {:.1} ms (5 builds)",
        ms(builds[2]),
        ms(builds[0]),
        ms(builds[4])
    );
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Sizes, String> {
    let mut sizes = Sizes {
        cluster_roles: 5_000,
        bindings: 5_000,
        role_bindings: 20_000,
        namespaces: 2_000,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: usize = value
            .parse()
            .map_err(|_| format!("{flag}: {value:?} is not a count"))?;
        match flag.as_str() {
            "--cluster-roles" => sizes.cluster_roles = n,
            "--bindings" => sizes.bindings = n,
            "--role-bindings" => sizes.role_bindings = n,
            "--namespaces" => sizes.namespaces = n,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(sizes)
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(
            [(
                "app.kubernetes.io/part-of".to_owned(),
                "generated".to_owned(),
            )]
            .into(),
        ),
        ..ObjectMeta::default()
    }
}

fn rule(resources: Vec<String>, verbs: &[&str]) -> rbac::PolicyRule {
    rbac::PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(resources),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..rbac::PolicyRule::default()
    }
}

fn role_ref(kind: &str, name: &str) -> rbac::RoleRef {
    rbac::RoleRef {
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

fn subject(kind: &str, name: &str, namespace: Option<&str>) -> rbac::Subject {
    rbac::Subject {
        kind: kind.to_owned(),
        name: name.to_owned(),
        namespace: namespace.map(str::to_owned),
        api_group: (kind != "ServiceAccount").then(|| "rbac.authorization.k8s.io".to_owned()),
    }
}

/// This process's resident set, from /proc/self/status.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
