//! The cost model: exact prices of small expressions, loops priced once per element and by the
//! total of their elements' lengths, no short-circuit, no NaN, walks linear in the expression,
//! and maps known entry by entry priced by the entry an expression names.

use std::sync::Arc;

use super::super::ENV;
use super::*;

/// The sizes of a variable `request` with a `user` and `groups`, as a record.
fn request(user: &str, groups: &[String]) -> Sizes {
    let longest = groups.iter().map(String::len).max().unwrap_or(0);
    let total: usize = groups.iter().map(String::len).sum();
    let record = Size::Record(Arc::from([
        ("user", Size::Str(user.len() as f64)),
        (
            "groups",
            Size::list_of_strings(groups.len(), longest, total),
        ),
    ]));
    let ceiling = (user.len() + total + groups.len()) as f64;
    Sizes::new(vec![("request", record)], ceiling)
}

fn groups(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("group-{i}")).collect()
}

/// The cost of `expression` for `sizes`.
fn on(expression: &str, sizes: &Sizes) -> u64 {
    let program = ENV.compile(expression).expect("compiles");
    cost(program.expression(), sizes)
}

/// The deny-list condition the end-to-end tests use: linear, 26 per group.
const DENY_LIST: &str =
    "request.groups.all(g, !(g in ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']))";
/// A condition quadratic in the number of groups.
const QUADRATIC: &str = "request.groups.all(g, request.groups.exists_one(h, h == g))";

#[test]
fn identifiers_and_selections_cost_one_literals_nothing() {
    let sizes = request("alice", &groups(3));
    assert_eq!(on("true", &sizes), 0);
    assert_eq!(
        on("has(request.user)", &sizes),
        1,
        "has() is its operand only"
    );
    // request 1, .user 1, == 1 plus 0.1 a byte of the shorter side (5): 3.5, rounded up.
    assert_eq!(on("request.user == 'admin'", &sizes), 4);
    // Anything an identifier names that is not a variable (a type) is a scalar: type() 1,
    // request.user 2, string 1, == 1.1 (the shorter side is 1 long).
    assert_eq!(on("type(request.user) == string", &sizes), 6);
}

#[test]
fn membership_in_a_list_costs_its_length() {
    // request, .groups, and the `in` of 1 plus one per element.
    let sizes = request("alice", &groups(10));
    assert_eq!(on("'system:masters' in request.groups", &sizes), 3 + 10);
}

#[test]
fn a_comprehension_costs_its_loop_once_per_element() {
    // Per element: the loop condition @not_strictly_false(@result) 2, the step
    // `@result && !(g in [...])` 1 + 1 + (1 + 11 + 1 + 10); the range 2 and the result 1.
    for n in [0, 1000, 50_000] {
        assert_eq!(
            on(DENY_LIST, &request("u", &groups(n))),
            3 + 26 * n as u64,
            "{n}"
        );
    }
}

#[test]
fn the_elements_lengths_are_bounded_by_their_total() {
    // On the same number of groups, the loop is priced by the bytes it reads: 100 times the
    // bytes, over 20 times the cost.
    let long: Vec<String> = (0..1000).map(|i| format!("{i:01000}")).collect();
    let short: Vec<String> = (0..1000).map(|i| format!("{i:010}")).collect();
    let expression = "request.groups.exists(g, g.matches('^oidc:'))";
    let long = on(expression, &request("u", &long));
    let short = on(expression, &request("u", &short));
    assert!(long > 20 * short, "{long} {short}");
}

#[test]
fn the_cost_grows_with_the_sizes() {
    let small = on(QUADRATIC, &request("u", &groups(10)));
    let large = on(QUADRATIC, &request("u", &groups(1000)));
    assert!(small < 1000, "{small}");
    assert!(large > PER_CALL_LIMIT, "{large}");
}

#[test]
fn no_short_circuit_is_assumed() {
    // The right side is priced although a false left side would skip it.
    let guarded =
        "request.user == 'nobody' && request.groups.all(g, request.groups.exists_one(h, h == g))";
    let sizes = request("u", &groups(1000));
    assert!(on(guarded, &sizes) > on(QUADRATIC, &sizes));
}

#[test]
fn regular_expressions_from_data_are_priced_by_both_lengths() {
    let pattern_from_data = "request.groups[0].matches(request.user)";
    let short = on(pattern_from_data, &request("a", &groups(1)));
    let long = on(pattern_from_data, &request(&"a".repeat(10_000), &groups(1)));
    assert!(long > 200 * short, "{short} {long}");
}

#[test]
fn an_overflowing_estimate_is_the_largest_cost_never_zero() {
    // Sizes beyond f64 make the estimate infinite; it saturates instead of turning into NaN
    // (which `as u64` would make 0), and no iteration of an empty list costs anything.
    let expression = "request.groups.exists(g, request.groups.exists(h, g == h))";
    let program = ENV.compile(expression).expect("compiles");
    let with_groups = |groups: Size| {
        let record = Size::Record(Arc::from([("groups", groups)]));
        Sizes::new(vec![("request", record)], f64::INFINITY)
    };
    let infinite = with_groups(Size::List {
        count: f64::INFINITY,
        elem: Box::new(Size::Str(f64::INFINITY)),
        total: Some(f64::INFINITY),
    });
    assert_eq!(cost(program.expression(), &infinite), u64::MAX);
    let empty = with_groups(Size::List {
        count: 0.0,
        elem: Box::new(Size::Str(f64::INFINITY)),
        total: Some(f64::INFINITY),
    });
    assert_eq!(
        cost(program.expression(), &empty),
        3,
        "no iteration, not 0 × ∞"
    );
}

#[test]
fn nesting_is_walked_in_time_linear_in_the_expression() {
    // Eight nested loops over the groups: walked once each, not twice per level.
    let mut expression = "true".to_owned();
    for depth in 0..8 {
        expression = format!("request.groups.exists(g{depth}, g{depth} != '' && {expression})");
    }
    let huge = Size::Record(Arc::from([(
        "groups",
        Size::list_of_strings(1 << 20, 1 << 20, 1 << 20),
    )]));
    let huge = Sizes::new(vec![("request", huge)], (1 << 20) as f64);
    assert_eq!(on(&expression, &huge), u64::MAX);
    assert!(on(&expression, &request("u", &groups(2))) < 100_000_000);
}

/// A `data` map known entry by entry: a short string, a nested object (under a name that needs
/// escaping) with 100 groups, and a number; anything the model cannot follow is a million.
fn data() -> Sizes {
    let nested = Size::Entries(Arc::from([(
        "groups".to_owned(),
        Size::list_of_strings(100, 5, 500),
    )]));
    let entries = Size::Entries(Arc::from([
        ("sub".to_owned(), Size::Str(10.0)),
        ("kubernetes.io".to_owned(), nested),
        ("exp".to_owned(), Size::Scalar),
    ]));
    Sizes::new(vec![("data", entries)], 1_000_000.0)
}

#[test]
fn an_entry_is_priced_by_its_own_size_however_it_is_named() {
    let sizes = data();
    let loop_over = |groups: &str| on(&format!("{groups}.exists(g, g == 'admins')"), &sizes);
    let selected = loop_over("data.kubernetes__dot__io.groups");
    assert!(selected > 100 && selected < 1000, "{selected}");
    assert_eq!(loop_over("data['kubernetes.io'].groups"), selected);
    assert_eq!(loop_over("data['kubernetes.io']['groups']"), selected);
    // Absent: the lookup fails, and nothing iterates.
    assert!(loop_over("data.nothere") < 20);
    // A key known only at evaluation may be any entry: as large as anything.
    assert!(loop_over("data[data.sub]") > 1_000_000);
    // Iterating the map: one element per entry, each as large as its largest key or value.
    assert!(on("data.exists(k, k == 'sub')", &sizes) < 30);
    assert!(on("data.exists(k, k.contains('x'))", &sizes) > 100_000);
}
