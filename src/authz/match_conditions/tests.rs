//! Compiling, checking and evaluating match conditions: the validation errors of kube-apiserver,
//! the load-time check's verdicts, the `request` value's shape, the order rule (a false condition
//! wins over an error), and the examples of the Kubernetes authorization documentation on the
//! reviews the kubelet sends.

use std::collections::BTreeMap;

use k8s_openapi::api::authorization::v1::NonResourceAttributes;

use super::*;
use crate::authn::User;
use crate::authz::Attributes;
use crate::authz::webhook::review_spec;
use crate::base::cel::MAX_EXPRESSION_CODE_POINTS;

fn compiled(expressions: &[&str]) -> MatchConditions {
    MatchConditions::compile(expressions.iter().copied())
        .unwrap_or_else(|e| panic!("{expressions:?}: {e}"))
}

fn compile_error(expression: &str) -> CompileError {
    match MatchConditions::compile([expression].into_iter()) {
        Err(ConditionsError::Invalid { source, .. }) => source,
        other => panic!("{expression}: expected a compile error, got {other:?}"),
    }
}

/// The spec the kubelet sends for `user` asking `verb nodes/subresource` on node-a.
fn kubelet_spec(user: &User, verb: &str, subresource: &str) -> SubjectAccessReviewSpec {
    review_spec(&Attributes {
        user,
        verb,
        namespace: "",
        resource: "nodes",
        subresource,
        name: "node-a",
        path: "/",
    })
}

fn user(name: &str, uid: &str, groups: &[&str]) -> User {
    User {
        name: name.to_owned(),
        uid: uid.to_owned(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        extra: BTreeMap::new(),
    }
}

/// Each condition's result in order, and the outcome.
fn evaluate(conditions: &MatchConditions, spec: &SubjectAccessReviewSpec) -> (Vec<String>, Match) {
    let mut results = Vec::new();
    let outcome = conditions.evaluate(spec, |trace| {
        results.push(match trace.result {
            ConditionResult::True => "true".to_owned(),
            ConditionResult::False => "false".to_owned(),
            ConditionResult::Error(e) => format!("error: {}", e.cause()),
            ConditionResult::NotEvaluated => "not evaluated".to_owned(),
        });
    });
    (results, outcome)
}

/// Whether the single condition `expression` is true on `spec` (panics on an error).
fn holds(expression: &str, spec: &SubjectAccessReviewSpec) -> bool {
    match evaluate(&compiled(&[expression]), spec).1 {
        Match::Matched => true,
        Match::Skipped => false,
        Match::Failed(e) => panic!("{expression}: {e}"),
    }
}

#[test]
fn validation_follows_kube_apiserver() {
    let many: Vec<String> = (0..=MAX_CONDITIONS).map(|i| format!("{i} > 0")).collect();
    let err = MatchConditions::compile(many.iter().map(String::as_str)).unwrap_err();
    assert!(matches!(err, ConditionsError::TooMany(65)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "webhook.matchConditions: must have at most 64 items, has 65"
    );
    assert_eq!(
        MatchConditions::compile(many[..MAX_CONDITIONS].iter().map(String::as_str))
            .unwrap()
            .expressions()
            .count(),
        64
    );

    for blank in ["", "  \t"] {
        let err = MatchConditions::compile(["true", blank].into_iter()).unwrap_err();
        assert!(
            matches!(err, ConditionsError::Empty { index: 1 }),
            "{err:?}"
        );
    }
    let err = MatchConditions::compile(["true", "false", "true"].into_iter()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "webhook.matchConditions[2].expression \"true\" duplicates an earlier one"
    );

    // The length limit counts code points, not bytes: 100,000 two-byte characters pass.
    let at_limit = format!("'{}' != ''", "é".repeat(MAX_EXPRESSION_CODE_POINTS - 8));
    assert_eq!(at_limit.chars().count(), MAX_EXPRESSION_CODE_POINTS);
    compiled(&[&at_limit]);
    let over = at_limit.replacen('é', "éé", 1);
    assert_eq!(
        compile_error(&over).to_string(),
        "expression code point size exceeds limit: size: 100001, limit 100000"
    );

    assert!(
        MatchConditions::compile(std::iter::empty())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_compile_error_names_the_expression_on_one_line() {
    let err = MatchConditions::compile(["true", "request.user =="].into_iter()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "webhook.matchConditions[1].expression \"request.user ==\": compilation failed: 1:16: Syntax error:"
        ),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    assert!(
        matches!(
            &err,
            ConditionsError::Invalid {
                index: 1,
                source: CompileError::Cel(base_cel::CompileError::Syntax(_)),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn the_load_check_refuses_what_kube_apiserver_refuses() {
    let cases = [
        // Only `request` is declared.
        (
            "object.metadata.name == 'x'",
            "compilation failed: undeclared reference to 'object' (the only variable is request)",
        ),
        (
            "request.groups.exists(g, h == g)",
            "compilation failed: undeclared reference to 'h' (the only variable is request)",
        ),
        (
            "params.allowed",
            "compilation failed: undeclared reference to 'params' (the only variable is request)",
        ),
        // Fields `request` does not declare: a common mistake is the UserInfo shape.
        (
            "!request.userInfo.username.startsWith('system:')",
            "compilation failed: undefined field 'userInfo' of kubernetes.SubjectAccessReviewSpec",
        ),
        (
            "has(request.resourceAttributes.resourceName)",
            "compilation failed: undefined field 'resourceName' of kubernetes.ResourceAttributes",
        ),
        (
            "request.nonResourceAttributes.url == '/'",
            "compilation failed: undefined field 'url' of kubernetes.NonResourceAttributes",
        ),
        (
            "request.user.name == 'alice'",
            "compilation failed: type 'string' does not support field selection",
        ),
        // Results that cannot be a bool.
        ("request.user", "must evaluate to bool but got string"),
        ("size(request.groups)", "must evaluate to bool but got int"),
        (
            "request.resourceAttributes",
            "must evaluate to bool but got kubernetes.ResourceAttributes",
        ),
        (
            "request.extra['k']",
            "must evaluate to bool but got list(string)",
        ),
        ("'a' + request.uid", "must evaluate to bool but got string"),
        // A malformed regular expression literal.
        (
            "request.user.matches('system:(node')",
            "compilation failed: invalid regular expression \"system:(node\": error: unclosed group",
        ),
        // Kubernetes' own libraries, which cel-rust lacks.
        (
            "isIP(request.user)",
            "compilation failed: isIP(), of a Kubernetes CEL library, is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "request.groups.isSorted()",
            "compilation failed: isSorted(), of a Kubernetes CEL library, is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "sets.contains(request.groups, ['system:masters'])",
            "compilation failed: sets.contains(), of a Kubernetes CEL library, is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "request.extra.all(k, v, size(v) == 1)",
            "compilation failed: all() with 3 arguments (two-variable comprehensions) is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "duration('1s') < duration('2s')",
            "compilation failed: duration(), of a Kubernetes CEL library, is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "math.greatest(1, 2) == 2",
            "compilation failed: undeclared reference to 'math' (the only variable is request)",
        ),
    ];
    for (expression, expected) in cases {
        assert_eq!(
            compile_error(expression).to_string(),
            expected,
            "{expression}"
        );
    }
}

#[test]
fn the_load_check_accepts_what_kube_apiserver_accepts() {
    compiled(&[
        "has(request.resourceAttributes) && request.resourceAttributes.resource == 'nodes'",
        "!('system:nodes' in request.groups)",
        "request.user.startsWith('system:serviceaccount:')",
        "request.groups.exists(g, g.startsWith('oidc:')) || request.user.contains('@')",
        "'authentication.kubernetes.io/pod-name' in request.extra",
        "request.extra['k'].exists(v, v == 'x')",
        "request.extra.exists(k, k.startsWith('example.com/'))",
        "has(request.nonResourceAttributes) && request.nonResourceAttributes.path == '/healthz'",
        "has(request.resourceAttributes.fieldSelector) || has(request.resourceAttributes.labelSelector)",
        "request.user.matches('^system:node:[a-z0-9.-]+$')",
        "request.user.lowerAscii().split(':').size() == 3",
        "request.?uid.orValue('') == ''",
        "type(request.user) == string",
        "request.groups.map(g, g.size()).all(n, n > 0)",
        "request.groups.filter(g, g == 'x').size() == 0",
        "request.groups.exists_one(g, g == 'system:masters')",
        "strings.quote(request.user) != ''",
        "request.user in ['alice', 'bob'] ? true : request.uid != ''",
        "{'a': request.user}['a'] == request.user",
        "true",
    ]);
}

#[test]
fn request_has_the_shape_kube_apiserver_gives_it() {
    let anonymous = User::anonymous();
    let spec = kubelet_spec(&anonymous, "", "healthz");
    // Every user field is there, empty or not; so are the empty resource attributes.
    for expression in [
        "request.user == 'system:anonymous'",
        "request.uid == ''",
        "request.groups == ['system:unauthenticated']",
        "request.extra == {}",
        "has(request.resourceAttributes)",
        "request.resourceAttributes.verb == ''",
        "request.resourceAttributes.namespace == '' && request.resourceAttributes.group == ''",
        "request.resourceAttributes.version == 'v1'",
        "request.resourceAttributes.resource == 'nodes'",
        "request.resourceAttributes.subresource == 'healthz'",
        "request.resourceAttributes.name == 'node-a'",
        "!has(request.nonResourceAttributes)",
        "!has(request.resourceAttributes.fieldSelector)",
    ] {
        assert!(holds(expression, &spec), "{expression}");
    }
    // Reading an absent field is an error.
    let (results, outcome) = evaluate(
        &compiled(&["request.nonResourceAttributes.path == '/healthz'"]),
        &spec,
    );
    assert_eq!(results, ["error: No such key: nonResourceAttributes"]);
    assert!(matches!(outcome, Match::Failed(_)));

    let mut with_extra = user("alice", "u-1", &[]);
    with_extra
        .extra
        .insert("example.com/team".into(), vec!["a".into(), "b".into()]);
    let spec = kubelet_spec(&with_extra, "get", "proxy");
    for expression in [
        "request.groups == []",
        "request.extra['example.com/team'] == ['a', 'b']",
        "request.uid == 'u-1'",
    ] {
        assert!(holds(expression, &spec), "{expression}");
    }

    // A review about a path (never the kubelet's, but part of the spec).
    let path_review = SubjectAccessReviewSpec {
        non_resource_attributes: Some(NonResourceAttributes {
            path: Some("/healthz".into()),
            verb: Some("get".into()),
        }),
        user: Some("alice".into()),
        ..SubjectAccessReviewSpec::default()
    };
    for expression in [
        "request.nonResourceAttributes.path == '/healthz'",
        "request.nonResourceAttributes.verb == 'get'",
        "!has(request.resourceAttributes)",
        "request.groups == [] && request.extra == {} && request.uid == ''",
    ] {
        assert!(holds(expression, &path_review), "{expression}");
    }
}

#[test]
fn the_first_false_skips_the_webhook_and_wins_over_errors() {
    let node = user(
        "system:node:node-a",
        "",
        &["system:nodes", "system:authenticated"],
    );
    let spec = kubelet_spec(&node, "get", "pods");
    let error = "request.nonResourceAttributes.path == '/'";
    let not_bool = "true ? request.user : false";

    // An error before the false one is evaluated, but the false one decides: skipped.
    let (results, outcome) = evaluate(
        &compiled(&[error, "!('system:nodes' in request.groups)", "true"]),
        &spec,
    );
    assert_eq!(
        results,
        [
            "error: No such key: nonResourceAttributes",
            "false",
            "not evaluated"
        ]
    );
    assert!(matches!(outcome, Match::Skipped), "{outcome:?}");

    // A false one first: the rest are not evaluated.
    let (results, outcome) = evaluate(&compiled(&["false", error]), &spec);
    assert_eq!(results, ["false", "not evaluated"]);
    assert!(matches!(outcome, Match::Skipped));

    // No false one: every error, aggregated as kube-apiserver does.
    let (results, outcome) = evaluate(&compiled(&[error, "true", not_bool]), &spec);
    assert_eq!(
        results,
        [
            "error: No such key: nonResourceAttributes",
            "true",
            "error: eval result type should be bool but got string"
        ]
    );
    let Match::Failed(failure) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        failure.to_string(),
        "[cel evaluation error: expression 'request.nonResourceAttributes.path == '/'' resulted in \
         error: No such key: nonResourceAttributes, cel evaluation error: expression 'true ? \
         request.user : false' eval result type should be bool but got string]"
    );
    let (_, outcome) = evaluate(&compiled(&[not_bool]), &spec);
    let Match::Failed(failure) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        failure.to_string(),
        "cel evaluation error: expression 'true ? request.user : false' eval result type should \
         be bool but got string"
    );

    // All true, or none at all: the webhook is asked.
    let (results, outcome) = evaluate(&compiled(&["true", "request.user != ''"]), &spec);
    assert_eq!(results, ["true", "true"]);
    assert!(matches!(outcome, Match::Matched));
    let (results, outcome) = evaluate(&MatchConditions::default(), &spec);
    assert!(results.is_empty());
    assert!(matches!(outcome, Match::Matched));
}

#[test]
fn the_kubernetes_documentation_examples_on_kubelet_reviews() {
    let node = user(
        "system:node:node-a",
        "",
        &["system:nodes", "system:authenticated"],
    );
    let agent = user(
        "system:serviceaccount:monitoring:agent",
        "8d3c",
        &["system:serviceaccounts", "system:authenticated"],
    );

    // Skip the webhook for the nodes.
    let not_nodes = "!('system:nodes' in request.groups)";
    assert!(!holds(not_nodes, &kubelet_spec(&node, "get", "pods")));
    assert!(holds(not_nodes, &kubelet_spec(&agent, "get", "pods")));

    // Only for nodes/proxy.
    let only_proxy = compiled(&[
        "has(request.resourceAttributes)",
        "request.resourceAttributes.resource == 'nodes'",
        "request.resourceAttributes.subresource == 'proxy'",
    ]);
    let (results, outcome) = evaluate(&only_proxy, &kubelet_spec(&agent, "get", "pods"));
    assert_eq!(results, ["true", "true", "false"]);
    assert!(matches!(outcome, Match::Skipped));
    let (results, outcome) = evaluate(&only_proxy, &kubelet_spec(&agent, "get", "proxy"));
    assert_eq!(results, ["true", "true", "true"]);
    assert!(matches!(outcome, Match::Matched));

    // Only for service accounts.
    let accounts = "request.user.startsWith('system:serviceaccount:')";
    assert!(holds(accounts, &kubelet_spec(&agent, "create", "exec")));
    assert!(!holds(accounts, &kubelet_spec(&node, "create", "exec")));
}

#[test]
fn equal_conditions_are_equal_and_debug_shows_the_expressions() {
    let a = compiled(&["true", "request.user != ''"]);
    assert_eq!(a, compiled(&["true", "request.user != ''"]));
    assert_ne!(a, compiled(&["request.user != ''", "true"]));
    assert_eq!(format!("{a:?}"), r#"["true", "request.user != ''"]"#);
}

/// The pod-level set of `--pod-scoped-authz` is a namespaced review: conditions see its
/// namespace, resource and pod name, and can keep the webhook to some namespaces.
#[test]
fn conditions_see_the_pod_level_set() {
    let agent = user("system:serviceaccount:logging:shipper", "", &[]);
    let pod = review_spec(&Attributes {
        user: &agent,
        verb: "get",
        namespace: "team-a",
        resource: "pods",
        subresource: "log",
        name: "web-0",
        path: "/containerLogs/team-a/web-0/app",
    });
    let team_a = "request.resourceAttributes.namespace == 'team-a'";
    assert!(holds(team_a, &pod));
    assert!(!holds(team_a, &kubelet_spec(&agent, "get", "proxy")));
    assert!(holds(
        "request.resourceAttributes.resource == 'pods' && request.resourceAttributes.name == 'web-0'",
        &pod
    ));
}

#[test]
fn a_condition_whose_worst_case_passes_the_static_limit_is_refused_at_load() {
    // kube-apiserver would load it (it estimates no cost for these) and stop it on every
    // review with many groups; refused here, naming its cost and the limit.
    let quadratic = "request.groups.all(g, request.groups.exists(h, h == g))";
    let error = compile_error(quadratic);
    assert!(
        matches!(error, CompileError::Cost { cost, .. } if cost > STATIC_ESTIMATED_COST_LIMIT),
        "{error:?}"
    );
    let message = MatchConditions::compile([quadratic].into_iter())
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("webhook.matchConditions[0].expression"),
        "{message}"
    );
    assert!(message.contains("estimated cost "), "{message}");
    assert!(message.contains("exceeds the limit 10000000"), "{message}");
}

#[test]
fn a_condition_over_the_per_call_limit_on_a_review_is_an_error_not_evaluated() {
    let deny_list =
        "request.groups.all(g, !(g in ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']))";
    let conditions = compiled(&[deny_list]);
    let few: Vec<String> = (0..1000).map(|i| format!("g{i}")).collect();
    let few: Vec<&str> = few.iter().map(String::as_str).collect();
    let (results, outcome) = evaluate(
        &conditions,
        &kubelet_spec(&user("u", "", &few), "get", "proxy"),
    );
    assert_eq!(results, ["true"]);
    assert!(matches!(outcome, Match::Matched));

    let many: Vec<String> = (0..50_000).map(|i| format!("g{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let (results, outcome) = evaluate(
        &conditions,
        &kubelet_spec(&user("u", "", &many), "get", "proxy"),
    );
    assert_eq!(
        results,
        ["error: operation cancelled: actual cost limit exceeded (cost 1300003, limit 1000000)"]
    );
    let Match::Failed(error) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        error.to_string(),
        format!(
            "cel evaluation error: expression '{deny_list}' resulted in error: operation \
             cancelled: actual cost limit exceeded (cost 1300003, limit 1000000)"
        )
    );
}

#[test]
fn a_false_condition_before_one_over_the_limit_skips_the_webhook() {
    let many: Vec<String> = (0..50_000).map(|i| format!("g{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let conditions = compiled(&[
        "request.user == 'someone-else'",
        "request.groups.all(g, !(g in ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']))",
    ]);
    let (results, outcome) = evaluate(
        &conditions,
        &kubelet_spec(&user("u", "", &many), "get", "proxy"),
    );
    assert_eq!(results, ["false", "not evaluated"]);
    assert!(matches!(outcome, Match::Skipped));
}

/// An error about a long expression quotes its start and says how long it is, on one line.
#[test]
fn an_error_quotes_a_long_expression_by_its_start() {
    let expression = format!("request.user == '{}' &&", "x".repeat(5_000));
    let err = MatchConditions::compile([expression.as_str()].into_iter()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("… (5021 code points): compilation failed"),
        "{text}"
    );
    assert!(text.len() < 600 && !text.contains('\n'), "{text}");
}
