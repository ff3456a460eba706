//! Micro-benchmarks of `--audit-policy-file` on the request path: the decision for a scraper
//! that an early rule silences, for an exec that reaches the catch-all after every rule, and for
//! a caller with 451 groups checked against group rules; and the same exec's decision with its
//! omission counting (`PolicyGate::stages_kept`). Run with `cargo bench --bench audit_policy`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

use kubelet_auth_proxy::audit::ObjectRef;
use kubelet_auth_proxy::audit::policy::{AuditPolicy, OmittedEvents, PolicyGate, PolicyRequest};
use kubelet_auth_proxy::authn::User;

/// A policy as an operator would write it: the scrapers silenced first, then a few group and
/// path rules that most requests fall through, then the catch-all.
const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users:
      - system:serviceaccount:monitoring:prometheus
      - system:serviceaccount:kube-system:metrics-server
    verbs: [get]
    resources:
      - group: ""
        resources: [nodes/metrics, nodes/stats]
  - level: None
    nonResourceURLs: [/healthz, /readyz, "/livez*"]
  - level: None
    userGroups: [probes, synthetic-checks, load-balancers, node-problem-detector, team-00, team-01,
                 team-02, team-03, team-04, team-05, team-06, team-07, team-08, team-09, team-10,
                 team-11, team-12, team-13, team-14, team-15]
    verbs: [get]
    resources:
      - group: ""
        resources: [nodes/healthz, nodes/metrics]
  - level: Metadata
    omitStages: [ResponseStarted]
    userGroups: [log-readers, auditors]
    resources:
      - group: ""
        resources: [nodes/log, "pods/log"]
  - level: Metadata
    namespaces: [kube-system]
  - level: Metadata
"#;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

fn user(name: &str, groups: Vec<String>) -> User {
    User {
        name: name.to_owned(),
        uid: String::new(),
        groups,
        extra: Default::default(),
    }
}

fn node(subresource: &'static str) -> ObjectRef {
    ObjectRef {
        resource: "nodes",
        namespace: None,
        subresource,
        name: Arc::from("node-a"),
    }
}

fn bench_policy(c: &mut Criterion) {
    let policy = match AuditPolicy::parse(POLICY) {
        Ok(policy) => policy,
        Err(e) => panic!("the benchmark's policy: {e}"),
    };
    let scraper = user(
        "system:serviceaccount:monitoring:prometheus",
        vec![
            "system:serviceaccounts".to_owned(),
            "system:authenticated".to_owned(),
        ],
    );
    let alice = user("alice", vec!["system:authenticated".to_owned()]);
    let crowded = user(
        "bob",
        (0..450)
            .map(|i| format!("directory-group-{i:03}"))
            .chain(["system:authenticated".to_owned()])
            .collect(),
    );
    let (metrics, proxy) = (node("metrics"), node("proxy"));
    let scrape = PolicyRequest {
        user: Some(&scraper),
        verb: "get",
        object_ref: Some(&metrics),
        path: "/metrics/cadvisor",
    };
    let exec = PolicyRequest {
        user: Some(&alice),
        verb: "create",
        object_ref: Some(&proxy),
        path: "/exec/default/web-0/app",
    };
    let crowded_get = PolicyRequest {
        user: Some(&crowded),
        verb: "get",
        object_ref: Some(&metrics),
        path: "/metrics",
    };
    assert_eq!(policy.decide(&scrape).rule, Some(0));
    assert_eq!(policy.decide(&exec).rule, Some(5));
    assert_eq!(policy.decide(&crowded_get).rule, Some(5));

    let mut group = c.benchmark_group("audit_policy");
    group.bench_function("scraper_first_rule", |b| {
        b.iter(|| policy.decide(black_box(&scrape)))
    });
    group.bench_function("exec_catch_all", |b| {
        b.iter(|| policy.decide(black_box(&exec)))
    });
    group.bench_function("451_groups_catch_all", |b| {
        b.iter(|| policy.decide(black_box(&crowded_get)))
    });
    let gate = match AuditPolicy::parse(POLICY) {
        Ok(policy) => PolicyGate::new(policy, OmittedEvents::default()),
        Err(e) => panic!("the benchmark's policy: {e}"),
    };
    group.bench_function("scraper_stages_kept_counted", |b| {
        b.iter(|| gate.stages_kept(black_box(&scrape), false, false))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_policy
}
criterion_main!(benches);
