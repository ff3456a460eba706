//! The cost of conditions over `request`: exact prices of small expressions, the worst case of
//! the usual conditions within the load limit and of quadratic ones far beyond it, and the cost
//! on a review growing with the review's sizes.

use super::*;
use crate::base::cel::{ENV, PER_CALL_LIMIT, STATIC_ESTIMATED_COST_LIMIT, cost};

/// The worst-case cost of `expression`, as estimated at load.
fn estimate(expression: &str) -> u64 {
    let program = ENV.compile(expression).expect("compiles");
    cost(program.expression(), worst_case())
}

/// The cost of `expression` on `spec`, as computed before evaluating it.
fn on(expression: &str, spec: &SubjectAccessReviewSpec) -> u64 {
    let program = ENV.compile(expression).expect("compiles");
    cost(program.expression(), &of(spec))
}

fn with_groups(groups: impl IntoIterator<Item = String>) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        user: Some("alice".to_owned()),
        groups: Some(groups.into_iter().collect()),
        ..SubjectAccessReviewSpec::default()
    }
}

fn groups(n: usize) -> SubjectAccessReviewSpec {
    with_groups((0..n).map(|i| format!("group-{i}")))
}

/// The deny-list condition the end-to-end tests use: linear, 26 per group.
const DENY_LIST: &str =
    "request.groups.all(g, !(g in ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']))";
/// A condition quadratic in the number of groups.
const QUADRATIC: &str = "request.groups.all(g, request.groups.exists_one(h, h == g))";

#[test]
fn identifiers_and_selections_cost_one_literals_nothing() {
    assert_eq!(estimate("true"), 0);
    assert_eq!(
        estimate("has(request.user)"),
        1,
        "has() is its operand only"
    );
    // request 1, .user 1, == 1 plus 0.1 a byte of the shorter side (5): 3.5, rounded up.
    assert_eq!(estimate("request.user == 'admin'"), 4);
    assert_eq!(on("request.user == 'admin'", &groups(0)), 4);
}

#[test]
fn membership_in_a_list_costs_its_length() {
    let max_groups = (MAX_RESPONSE_BYTES / MIN_LIST_ELEMENT_BYTES) as u64;
    // request, .groups, and the `in` of 1 plus one per element.
    assert_eq!(
        estimate("'system:masters' in request.groups"),
        3 + max_groups
    );
    assert_eq!(
        on("'system:masters' in request.groups", &groups(10)),
        3 + 10
    );
}

#[test]
fn a_comprehension_costs_its_loop_once_per_element() {
    // Per element: the loop condition @not_strictly_false(@result) 2, the step
    // `@result && !(g in [...])` 1 + 1 + (1 + 11 + 1 + 10); the range 2 and the result 1.
    assert_eq!(on(DENY_LIST, &groups(0)), 3);
    assert_eq!(on(DENY_LIST, &groups(1000)), 3 + 26 * 1000);
    assert_eq!(on(DENY_LIST, &groups(50_000)), 3 + 26 * 50_000);
}

#[test]
fn usual_conditions_load_within_the_limit() {
    for expression in [
        "request.user == 'system:kube-controller-manager'",
        "'system:masters' in request.groups",
        "request.groups.exists(g, g.startsWith('oidc:'))",
        "request.groups.exists(g, g.matches('^oidc:[a-z]+$'))",
        "request.groups.map(g, g.lowerAscii()).exists(x, x == 'admins')",
        "request.groups.filter(g, g.endsWith(':admins')).size() > 0",
        "!('example.com/scopes' in request.extra) || request.extra['example.com/scopes'].exists(s, s == 'nodes')",
        "request.resourceAttributes.verb in ['get', 'list', 'watch'] && request.resourceAttributes.name.matches('^node-[0-9]+$')",
        "request.user.split(':').size() == 4",
        DENY_LIST,
    ] {
        let estimate = estimate(expression);
        assert!(
            estimate <= STATIC_ESTIMATED_COST_LIMIT,
            "{expression}: {estimate}"
        );
    }
}

#[test]
fn the_elements_lengths_are_bounded_by_their_total() {
    // Each group read through `matches` costs by its length; the lengths add up to at most the
    // TokenReview answer, so the estimate is not the number of groups times the longest one.
    let linear = estimate("request.groups.exists(g, g.matches('^oidc:'))");
    assert!(linear < 3_000_000, "{linear}");
    // On a review, the loop is priced by the bytes it reads: 100 times the bytes, over 20 times the cost.
    let long = with_groups((0..1000).map(|i| format!("{i:01000}")));
    let short = with_groups((0..1000).map(|i| format!("{i:010}")));
    let expression = "request.groups.exists(g, g.matches('^oidc:'))";
    let (long, short) = (on(expression, &long), on(expression, &short));
    assert!(long > 20 * short, "{long} {short}");
}

#[test]
fn quadratic_conditions_are_beyond_the_load_limit() {
    for expression in [
        QUADRATIC,
        "request.groups.exists(g, request.groups.exists(h, g != h && g.startsWith(h)))",
        "request.groups.exists(g, request.user.matches(g))",
        "request.groups.exists(g, request.user.contains(g))",
        "request.extra.all(k, request.extra[k].all(v, v in request.groups))",
        "request.user.replace('', request.uid).size() > 0",
    ] {
        let estimate = estimate(expression);
        assert!(
            estimate > STATIC_ESTIMATED_COST_LIMIT,
            "{expression}: {estimate}"
        );
    }
}

#[test]
fn the_cost_on_a_review_grows_with_its_sizes() {
    let small = on(QUADRATIC, &groups(10));
    let large = on(QUADRATIC, &groups(1000));
    assert!(small < 1000, "{small}");
    assert!(large > PER_CALL_LIMIT, "{large}");
    assert!(large <= estimate(QUADRATIC));
}

#[test]
fn no_short_circuit_is_assumed() {
    // The right side is priced although a false left side would skip it.
    let guarded =
        "request.user == 'nobody' && request.groups.all(g, request.groups.exists_one(h, h == g))";
    assert!(on(guarded, &groups(1000)) > on(QUADRATIC, &groups(1000)));
}

#[test]
fn regular_expressions_from_request_data_are_priced_by_both_lengths() {
    let pattern_from_request = "request.resourceAttributes.name.matches(request.user)";
    let mut spec = groups(0);
    spec.resource_attributes = Some(Default::default());
    let short = on(pattern_from_request, &spec);
    spec.user = Some("a".repeat(10_000));
    let long = on(pattern_from_request, &spec);
    assert!(long > 200 * short, "{short} {long}");
}
