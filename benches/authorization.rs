//! Micro-benchmarks of the per-request decision path: attribute mapping and the path gate, the
//! `Policy` authorizer over 10,000 bindings, review-cache hits and key computation, a `Webhook`
//! authorizer's cached answer without and with match conditions, the kubelet's whole
//! authorization loop with `Node,Policy`, and recording a request's metrics. Run with
//! `cargo bench`; each benchmark warms up for 1 s and measures for 2 s, so the whole run takes
//! about a minute once built.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::Method;
use tokio::runtime::Runtime;

use kubelet_auth_proxy::apiserver::cache::{KeyHasher, ReviewCache, random_hmac_key};
use kubelet_auth_proxy::apiserver::{ApiServerClient, ApiServerSettings};
use kubelet_auth_proxy::apiserver::{ApiServerMetrics, ReviewKind};
use kubelet_auth_proxy::authn::User;
use kubelet_auth_proxy::authn::token::token_cache_key;
use kubelet_auth_proxy::authz::attributes::{AttributeMapping, kubelet_attributes};
use kubelet_auth_proxy::authz::match_conditions::MatchConditions;
use kubelet_auth_proxy::authz::metrics::AuthzMetrics;
use kubelet_auth_proxy::authz::node::NodeAuthorizer;
use kubelet_auth_proxy::authz::policy::PolicyAuthorizer;
use kubelet_auth_proxy::authz::webhook::{SubjectAccessReviewAuthorizer, review_cache_key};
use kubelet_auth_proxy::authz::{Attributes, Authorizer, AuthorizerChain, Decision};
use kubelet_auth_proxy::base::reload::Reloadable;
use kubelet_auth_proxy::config::authorization::{FailurePolicy, WebhookSpec};
use kubelet_auth_proxy::request::canonical_path::{PathCheck, check_path};
use kubelet_auth_proxy::request::decision::{RequestDecision, Unobserved, authorize_request};
use kubelet_auth_proxy::request::metrics::{RequestLabels, RequestMetrics};
use kubelet_auth_proxy::request::outcome::Outcome;

mod support;

/// The node the proxy guards in every benchmark.
const NODE: &str = "node-a";
/// ClusterRoleBindings in the generated policy.
const BINDINGS: usize = 10_000;
/// ClusterRoles in the generated policy; binding `j` references role `j % ROLES`.
const ROLES: usize = 60;
/// Every hundredth binding binds a group (`team-<j / 100>`), the others one user each.
const GROUP_EVERY: usize = 100;
/// What role `r` grants (`get nodes/<subresource>`): `GRANTS[r % GRANTS.len()]`.
const GRANTS: [&str; 6] = ["stats", "metrics", "log", "pods", "healthz", "proxy"];

/// Short measurements keep `cargo bench` to about a minute on a small shared machine; the
/// benchmarked functions take nanoseconds to a few microseconds, so 2 s still gives tight medians.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

/// A kubelet's traffic in miniature: scrapers, health checks, logs, exec and port-forward.
const REQUEST_MIX: [(Method, &str); 12] = [
    (Method::GET, "/metrics"),
    (Method::GET, "/metrics/cadvisor"),
    (Method::GET, "/metrics/resource"),
    (Method::GET, "/stats/summary"),
    (Method::GET, "/healthz"),
    (Method::GET, "/pods"),
    (Method::GET, "/configz"),
    (Method::GET, "/logs/kube-apiserver.log"),
    (
        Method::GET,
        "/containerLogs/kube-system/coredns-5d78c9869d-x7k2p/coredns",
    ),
    (Method::GET, "/exec/default/web-0/nginx"),
    (Method::POST, "/exec/default/web-0/nginx"),
    (Method::POST, "/portForward/default/web-0"),
];

fn attribute_mapping(c: &mut Criterion) {
    let mut group = c.benchmark_group("attributes");
    let mapping = AttributeMapping::default();
    group.throughput(Throughput::Elements(REQUEST_MIX.len() as u64));
    group.bench_function("kubelet_attributes/mix_of_12", |b| {
        b.iter(|| {
            for (method, path) in &REQUEST_MIX {
                black_box(kubelet_attributes(&mapping, method, black_box(path)));
            }
        })
    });
    group.throughput(Throughput::Elements(1));
    // A long log path, the same with escapes (decoded into a new string), and one to redirect.
    let paths = [
        (
            "canonical",
            "/containerLogs/kube-system/coredns-5d78c9869d-x7k2p/coredns",
            false,
        ),
        (
            "escaped",
            "/logs/pods/default_web-0_3f1c/app%5B1%5D%20x/0.log",
            false,
        ),
        ("unclean", "/stats//summary/./../summary", true),
    ];
    for (kind, raw, redirects) in paths {
        let outcome = check_path(raw);
        assert!(
            matches!(outcome, PathCheck::Redirect { .. }) == redirects
                && !matches!(outcome, PathCheck::Reject(_)),
            "{raw}: {outcome:?}"
        );
        group.bench_function(format!("check_path/{kind}"), |b| {
            b.iter(|| check_path(black_box(raw)))
        });
    }
    group.finish();
}

/// The generated policy and the callers the benchmarks use, built once per process: parsing
/// 10,000 bindings is by far the slowest step, and the policy and whole-request groups share it.
struct Fixture {
    policy: Arc<Reloadable<PolicyAuthorizer>>,
    /// A user bound near the end of the policy to a role granting `get nodes/stats`.
    stats_user: User,
    /// A user with no binding of its own, in a group bound to a role granting `get nodes/proxy`.
    group_member: User,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let sources = vec![("generated.yaml".to_owned(), policy_yaml())];
    let policy = Reloadable::load("policy", Vec::new(), move |_| {
        PolicyAuthorizer::from_sources(&sources).map_err(|e| e.to_string())
    })
    .expect("the generated policy is valid");
    assert_eq!(policy.current().stats().cluster_role_bindings, BINDINGS);
    let user_binding = last_binding(false, "stats");
    let group_binding = last_binding(true, "proxy");
    Fixture {
        policy: Arc::new(policy),
        stats_user: User {
            name: format!("user-{user_binding:05}"),
            groups: vec![
                format!("team-{}", group_binding / GROUP_EVERY),
                "system:authenticated".to_owned(),
            ],
            ..User::default()
        },
        group_member: User {
            name: "carol".to_owned(),
            groups: vec![
                format!("team-{}", group_binding / GROUP_EVERY),
                "system:authenticated".to_owned(),
            ],
            ..User::default()
        },
    }
});

fn is_group_binding(j: usize) -> bool {
    j % GROUP_EVERY == GROUP_EVERY - 1
}

fn grant_of_binding(j: usize) -> &'static str {
    GRANTS[(j % ROLES) % GRANTS.len()]
}

/// The last user (or group) binding whose role grants `get nodes/<subresource>`.
fn last_binding(group: bool, subresource: &str) -> usize {
    (0..BINDINGS)
        .rev()
        .find(|&j| is_group_binding(j) == group && grant_of_binding(j) == subresource)
        .expect("some binding grants every subresource")
}

/// `ROLES` ClusterRoles, each with a rule restricted to another node (evaluated, never matching)
/// before the rule that grants, and `BINDINGS` ClusterRoleBindings of one subject each.
fn policy_yaml() -> String {
    let mut yaml = String::with_capacity(BINDINGS * 320);
    for r in 0..ROLES {
        let grant = GRANTS[r % GRANTS.len()];
        yaml.push_str(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\n\
             kind: ClusterRole\n\
             metadata: {{name: reader-{r}}}\n\
             rules:\n\
             - {{apiGroups: [\"\"], resources: [nodes/{grant}, nodes/proxy], \
             verbs: [get, create], resourceNames: [node-{r}]}}\n\
             - {{apiGroups: [\"\"], resources: [nodes/{grant}], verbs: [get]}}\n\
             ---\n"
        ));
    }
    for j in 0..BINDINGS {
        let (kind, subject) = if is_group_binding(j) {
            ("Group", format!("team-{}", j / GROUP_EVERY))
        } else {
            ("User", format!("user-{j:05}"))
        };
        yaml.push_str(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\n\
             kind: ClusterRoleBinding\n\
             metadata: {{name: binding-{j}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader-{}}}\n\
             subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: {kind}, name: {subject}}}]\n\
             ---\n",
            j % ROLES
        ));
    }
    yaml
}

fn attributes<'a>(
    user: &'a User,
    verb: &'a str,
    subresource: &'a str,
    path: &'a str,
) -> Attributes<'a> {
    Attributes::node(user, verb, subresource, NODE, path)
}

fn policy_evaluation(c: &mut Criterion) {
    let fixture = &*FIXTURE;
    let policy = fixture.policy.current_arc();
    let cases = [
        (
            "user_hit_near_end",
            attributes(&fixture.stats_user, "get", "stats", "/stats/summary"),
            true,
        ),
        (
            "group_hit",
            attributes(
                &fixture.group_member,
                "get",
                "proxy",
                "/containerLogs/default/web-0/app",
            ),
            true,
        ),
        (
            "miss",
            attributes(
                &fixture.stats_user,
                "create",
                "proxy",
                "/exec/default/web-0/app",
            ),
            false,
        ),
    ];
    let mut group = c.benchmark_group("policy_10k_bindings");
    for (name, attrs, allowed) in cases {
        assert_eq!(
            matches!(policy.authorize(&attrs), Decision::Allow(_)),
            allowed,
            "{name}"
        );
        group.bench_function(name, |b| b.iter(|| policy.authorize(black_box(&attrs))));
    }
    group.finish();
}

/// A bound service-account token's shape and size: three base64url parts, about 1 KB.
fn service_account_token() -> String {
    let part = |len: usize| -> String {
        "eyJhbGciOiJSUzI1NiIsImtpZCI6IjdTNWZpUWp4In0"
            .chars()
            .cycle()
            .take(len)
            .collect()
    };
    format!("{}.{}.{}", part(94), part(560), part(342))
}

/// A service account running in a pod, as TokenReview describes it.
fn service_account_user() -> User {
    User {
        name: "system:serviceaccount:monitoring:prometheus-k8s".to_owned(),
        uid: "6f1c2a3e-8b0d-4c55-9e2f-0a7b3c9d1e44".to_owned(),
        groups: vec![
            "system:serviceaccounts".to_owned(),
            "system:serviceaccounts:monitoring".to_owned(),
            "system:authenticated".to_owned(),
        ],
        extra: [
            ("authentication.kubernetes.io/credential-id", "JTI=0c8e2f6a"),
            ("authentication.kubernetes.io/node-name", "node-a"),
            ("authentication.kubernetes.io/pod-name", "prometheus-k8s-0"),
            (
                "authentication.kubernetes.io/pod-uid",
                "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), vec![v.to_owned()]))
        .collect(),
    }
}

fn current_thread_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
}

fn review_cache(c: &mut Criterion) {
    let user = service_account_user();
    let attrs = attributes(&user, "get", "metrics", "/metrics/cadvisor");
    let token = service_account_token();
    let audiences = ["https://kubernetes.default.svc.cluster.local".to_owned()];
    let hmac_key = random_hmac_key().expect("system randomness");

    let mut group = c.benchmark_group("cache");
    group.bench_function("key/subject_access_review", |b| {
        b.iter(|| review_cache_key(black_box(&attrs)))
    });
    group.bench_function("key/token", |b| {
        b.iter(|| token_cache_key(&hmac_key, black_box(&token), &audiences))
    });

    let runtime = current_thread_runtime();
    let cache: ReviewCache<Decision> = ReviewCache::new(
        ReviewKind::SubjectAccessReview,
        8192,
        |_| Duration::from_secs(300),
        Arc::new(ApiServerMetrics::default()),
    );
    let warm = review_cache_key(&attrs);
    runtime.block_on(async {
        for i in 0..1_000u32 {
            let mut other = KeyHasher::sha256();
            other.field(&i.to_be_bytes());
            let filled = cache
                .get_or_review(other.finish(), || async { Ok::<_, ()>(allowed()) })
                .await;
            assert!(filled.is_ok());
        }
        let filled = cache
            .get_or_review(warm, || async { Ok::<_, ()>(allowed()) })
            .await;
        assert!(filled.is_ok());
        let hit = cache
            .get_or_review(warm, || async { Err("a warm key must not be reviewed") })
            .await;
        assert_eq!(hit, Ok(allowed()));
    });
    group.bench_function("get_or_review/warm_key", |b| {
        b.to_async(&runtime).iter(|| {
            cache.get_or_review(black_box(warm), || async {
                Err("a warm key must not be reviewed")
            })
        })
    });
    group.finish();
}

/// A Webhook authorizer's answer from its cache, without and with two match conditions (the
/// Kubernetes documentation's: not a node, and only `nodes/proxy`), both true, so the cache is
/// still asked: what evaluating the conditions adds to a cached review.
fn webhook_cache_hit(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let reviews = Arc::new(AtomicUsize::new(0));
    let dir = std::env::temp_dir().join(format!("kap-bench-{}", std::process::id()));
    let path = support::kubeconfig(
        &dir,
        runtime.block_on(support::answering_api_server(
            Arc::clone(&reviews),
            r#"{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{},"status":{"allowed":true,"reason":"bench"}}"#,
        )),
    );
    let user = service_account_user();
    let attrs = attributes(
        &user,
        "get",
        "proxy",
        "/containerLogs/monitoring/agent-0/agent",
    );
    let cases = [
        ("no_conditions", &[][..]),
        (
            "two_conditions",
            &[
                "!('system:nodes' in request.groups)",
                "has(request.resourceAttributes) && request.resourceAttributes.subresource == 'proxy'",
            ][..],
        ),
    ];
    let mut group = c.benchmark_group("webhook_cache_hit");
    for (name, conditions) in cases {
        let spec = WebhookSpec {
            name: name.to_owned(),
            kubeconfig: Some(path.clone()),
            timeout: Duration::from_secs(5),
            authorized_ttl: Duration::from_secs(300),
            unauthorized_ttl: Duration::from_secs(30),
            failure_policy: FailurePolicy::Deny,
            match_conditions: MatchConditions::compile(conditions.iter().copied())
                .expect("the documentation's conditions compile"),
        };
        let authorizer = runtime.block_on(async {
            let settings =
                ApiServerSettings::read(Some(&path), spec.timeout).expect("the kubeconfig loads");
            SubjectAccessReviewAuthorizer::new(
                ApiServerClient::new(settings, 16, Arc::new(ApiServerMetrics::default())),
                &spec,
                &AuthzMetrics::default(),
            )
        });
        let reviewed = reviews.load(Ordering::Relaxed);
        for _ in 0..2 {
            let decision = runtime.block_on(authorizer.authorize(&attrs));
            assert_eq!(
                decision.map_err(|e| e.to_string()),
                Ok(Decision::Allow(kubelet_auth_proxy::authz::Reason::Shared(
                    Arc::from("bench")
                ))),
                "{name}"
            );
        }
        assert_eq!(
            reviews.load(Ordering::Relaxed),
            reviewed + 1,
            "{name}: one review, then the cache"
        );
        group.bench_function(name, |b| {
            b.to_async(&runtime)
                .iter(|| authorizer.authorize(black_box(&attrs)))
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(path.parent().unwrap_or(&path));
}

fn allowed() -> Decision {
    Decision::Allow(kubelet_auth_proxy::authz::Reason::Static("allowed"))
}

fn whole_request(c: &mut Criterion) {
    let fixture = &*FIXTURE;
    let chain = AuthorizerChain::new(vec![
        Authorizer::Node(NodeAuthorizer::new(NODE.into())),
        Authorizer::Policy(Arc::clone(&fixture.policy)),
    ]);
    let other_node = User {
        name: "system:node:node-b".to_owned(),
        groups: vec!["system:nodes".to_owned(), "system:authenticated".to_owned()],
        ..User::default()
    };
    let mapping = AttributeMapping::default();
    let cases = [
        (
            "user_hit_stats",
            &fixture.stats_user,
            "/stats/summary",
            "allowed",
        ),
        (
            "group_hit_pods_via_proxy",
            &fixture.group_member,
            "/pods",
            "allowed",
        ),
        (
            "forbidden_exec",
            &fixture.stats_user,
            "/exec/default/web-0/app",
            "forbidden",
        ),
        ("other_node_denied", &other_node, "/pods", "forbidden"),
    ];
    let runtime = current_thread_runtime();
    let mut group = c.benchmark_group("authorize_request_node_policy");
    for (name, user, path, expected) in cases {
        let request = kubelet_attributes(&mapping, &Method::GET, path);
        let outcome = match runtime.block_on(authorize_request(
            &chain, &request, None, user, NODE, path, Unobserved,
        )) {
            RequestDecision::Allowed { .. } => "allowed",
            RequestDecision::Forbidden { .. } => "forbidden",
            RequestDecision::Error { .. } => "error",
        };
        assert_eq!(outcome, expected, "{name}");
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| {
                authorize_request(
                    &chain,
                    black_box(&request),
                    None,
                    user,
                    NODE,
                    black_box(path),
                    Unobserved,
                )
            })
        });
    }
    group.finish();
}

/// What recording a request's metrics costs, without and with the time the proxy adds
/// (`request_decision_duration_seconds`), side by side: the second is what every allowed request
/// pays.
fn request_metrics(c: &mut Criterion) {
    let metrics = RequestMetrics::default();
    let labels = RequestLabels {
        code: 200,
        decision: Outcome::Allowed,
        subresource: "stats",
    };
    let mut group = c.benchmark_group("request_metrics");
    group.bench_function("observe_request", |b| {
        b.iter(|| {
            let started = Instant::now();
            metrics.observe_request(black_box(&labels), started.elapsed());
        })
    });
    group.bench_function("observe_request_and_decision", |b| {
        b.iter(|| {
            let started = Instant::now();
            metrics.observe_decision(started.elapsed());
            metrics.observe_request(black_box(&labels), started.elapsed());
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = attribute_mapping, policy_evaluation, review_cache, webhook_cache_hit, whole_request,
        request_metrics
}
criterion_main!(benches);
