//! The per-request time of a webhook's `matchConditions` before and after their cost bound,
//! measured side by side in one run (before and after alternate), medians quoted.
//!
//! "Before" runs the condition as the proxy did without a bound: the compiled program executed
//! on the review (cel-rust, the standard library and the strings extension). "After" is the
//! proxy's `MatchConditions`: refused at load, refused on the review before it runs, or run
//! after its cost is computed.
//!
//! `cargo run --release --example cel_cost`; medians on a shared 2-core host:
//!
//! | condition | before | after |
//! |---|---|---|
//! | quadratic, 1,000 groups | 324 ms | refused at load (estimated 855,176,281,386) |
//! | deny list, 50,000 groups | 67.6 ms | 0.18 ms, refused before evaluation (cost 1,300,003) |
//! | ordinary, not priced, 20 groups | 2.29 µs | 2.47 µs |
//! | ordinary, priced, 20 groups | 12.27 µs | 12.95 µs |

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cel::{Context, Env, Program};
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;
use kubelet_auth_proxy::authn::User;
use kubelet_auth_proxy::authz::Attributes;
use kubelet_auth_proxy::authz::match_conditions::{Match, MatchConditions, request_value};
use kubelet_auth_proxy::authz::webhook::review_spec;

/// Quadratic in the groups: about 190 ms a request over 1,000 groups without a bound.
const QUADRATIC: &str = "request.groups.all(g, request.groups.exists(h, h == g))";
/// Linear in the groups, 26 a group: within the load limit, over the per-call limit from about
/// 38,500 groups.
const DENY_LIST: &str =
    "request.groups.all(g, !(g in ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']))";
/// Ordinary, estimated within the per-call limit: no cost computed per request.
const ORDINARY: &str = "!('system:nodes' in request.groups) && request.user.startsWith('oidc:')";
/// Ordinary, estimated above the per-call limit (within the load limit): its cost is computed
/// for each request.
const PRICED: &str = "request.groups.exists(g, g.startsWith('oidc:admins'))";

/// The review the proxy sends for `oidc:alice` in `groups` groups asking `get` on
/// `nodes/proxy` of `node-a`, built by the proxy's own `review_spec`.
fn spec(groups: usize) -> SubjectAccessReviewSpec {
    let user = User {
        name: "oidc:alice".to_owned(),
        groups: (0..groups).map(|i| format!("group-{i}")).collect(),
        ..User::default()
    };
    review_spec(&Attributes {
        user: &user,
        verb: "get",
        namespace: "",
        resource: "nodes",
        subresource: "proxy",
        name: "node-a",
        path: "/pods",
    })
}

/// The environment the proxy compiles conditions in.
fn env() -> Arc<Env> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension adds to the standard library");
    Arc::new(env)
}

/// The condition run without a bound, as before.
fn unbounded(env: &Arc<Env>, program: &Program, spec: &SubjectAccessReviewSpec) {
    let mut context = Context::with_env(Arc::clone(env));
    context.add_variable_as_val("request", Box::new(request_value(spec)));
    black_box(program.execute(&context).ok());
}

fn bounded(conditions: &MatchConditions, spec: &SubjectAccessReviewSpec) -> Match {
    conditions.evaluate(spec, |_| {})
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Runs `before` and `after` alternately `rounds` times; their medians.
fn side_by_side(
    rounds: usize,
    mut before: impl FnMut(),
    mut after: impl FnMut(),
) -> (Duration, Duration) {
    let (mut b, mut a) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let start = Instant::now();
        before();
        b.push(start.elapsed());
        let start = Instant::now();
        after();
        a.push(start.elapsed());
    }
    (median(b), median(a))
}

fn main() {
    let env = env();
    let compile = |expression: &str| env.compile(expression).expect("compiles");

    // 1. Quadratic over 1,000 groups: refused at load now.
    let thousand = spec(1000);
    let quadratic = compile(QUADRATIC);
    let (before, _) = side_by_side(11, || unbounded(&env, &quadratic, &thousand), || {});
    let refused = MatchConditions::compile([QUADRATIC].into_iter())
        .expect_err("the quadratic condition is refused at load");
    println!(
        "quadratic, 1,000 groups:   before {before:>12.3?}   after: refused at load: {refused}"
    );

    // 2. Linear over 50,000 groups, over the per-call limit on this review: refused before it
    //    runs.
    let many = spec(50_000);
    let deny_list = compile(DENY_LIST);
    let bounded_deny_list = MatchConditions::compile([DENY_LIST].into_iter()).expect("loads");
    match bounded(&bounded_deny_list, &many) {
        Match::Failed(error) => println!("deny list, 50,000 groups:  {error}"),
        other => panic!("expected the cost limit error, got {other:?}"),
    }
    let (before, after) = side_by_side(
        51,
        || unbounded(&env, &deny_list, &many),
        || {
            black_box(bounded(&bounded_deny_list, &many));
        },
    );
    println!(
        "deny list, 50,000 groups:  before {before:>12.3?}   after {after:>12.3?} (refused before evaluation)"
    );

    // 3. Ordinary conditions on a review of 20 groups, with and without the cost computation.
    let twenty = spec(20);
    for (name, expression) in [
        ("ordinary (not priced)", ORDINARY),
        ("ordinary (priced)", PRICED),
    ] {
        let program = compile(expression);
        let conditions = MatchConditions::compile([expression].into_iter()).expect("loads");
        let (before, after) = side_by_side(
            20_001,
            || unbounded(&env, &program, &twenty),
            || {
                black_box(bounded(&conditions, &twenty));
            },
        );
        println!("{name:<22}, 20 groups: before {before:>12.3?}   after {after:>12.3?}");
    }
}
