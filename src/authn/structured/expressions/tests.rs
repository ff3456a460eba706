//! Compiling and evaluating authentication expressions as kube-apiserver v1.36 does: the
//! declared variables, the bool check at load, the claims' JSON as CEL values (numbers, nested
//! objects and their escaped names, lists, null), the user's fields, the cost limit, and
//! `selects`.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::base::cel::MAX_EXPRESSION_CODE_POINTS;

fn compiled(expression: &str, scope: Scope, returns: Returns) -> Expression {
    compile(expression, scope, returns).unwrap_or_else(|e| panic!("{expression}: {e}"))
}

fn compile_error(expression: &str, scope: Scope, returns: Returns) -> String {
    match compile(expression, scope, returns) {
        Ok(compiled) => panic!("{expression}: compiled ({compiled:?})"),
        Err(e) => e.to_string(),
    }
}

/// The payload of a service account token, as in kube-apiserver's own tests, with a few more
/// claims.
fn payload() -> Map<String, serde_json::Value> {
    let claims = json!({
        "aud": ["https://kubernetes.default.svc"],
        "exp": 1700081020,
        "iat": 1700077413,
        "ratio": 1.5,
        "big": 12345678901234567890u64,
        "iss": "https://kubernetes.default.svc",
        "sub": "system:serviceaccount:kube-system:coredns",
        "email": "coredns@example.com",
        "email_verified": true,
        "nothing": null,
        "kubernetes.io": {
            "namespace": "kube-system",
            "pod": {"name": "coredns-69cbfb9798-jv9gn", "uid": "778a530c"},
            "warnafter": 1700081020
        },
        "groups": ["system:serviceaccounts", "dev"],
        "mixed": ["a", 1, null, ["b"], {"c": "d"}, true],
        "data": [{"groups.io": "x"}],
        "__foo__": "unreachable"
    });
    match claims {
        serde_json::Value::Object(claims) => claims,
        _ => unreachable!("a JSON object literal"),
    }
}

/// The result of `expression` over `claims`.
fn on_claims(expression: &str, claims: &Map<String, serde_json::Value>) -> Result<Output, String> {
    compiled(expression, Scope::Claims, Returns::Any)
        .evaluate(&Input::claims(claims))
        .map_err(|e| e.to_string())
}

/// Whether the bool `expression` holds over `claims` (panics on anything else).
fn holds(expression: &str, claims: &Map<String, serde_json::Value>) -> bool {
    match compiled(expression, Scope::Claims, Returns::Bool).evaluate(&Input::claims(claims)) {
        Ok(Output::Bool(b)) => b,
        other => panic!("{expression}: {other:?}"),
    }
}

fn string(s: &str) -> Output {
    Output::String(s.to_owned())
}

#[test]
fn an_expression_sees_only_its_scope_s_variable() {
    let cases = [
        (
            "foo",
            Scope::Claims,
            "compilation failed: undeclared reference to 'foo' (the only variable is claims)",
        ),
        (
            "user.username == ''",
            Scope::Claims,
            "compilation failed: undeclared reference to 'user' (the only variable is claims)",
        ),
        (
            "claims.sub == ''",
            Scope::User,
            "compilation failed: undeclared reference to 'claims' (the only variable is user)",
        ),
        (
            "request.user",
            Scope::User,
            "compilation failed: undeclared reference to 'request' (the only variable is user)",
        ),
    ];
    for (expression, scope, expected) in cases {
        assert_eq!(
            compile_error(expression, scope, Returns::Any),
            expected,
            "{expression}"
        );
    }
    // `claims.anything` is dyn: any field, at any depth.
    compiled("claims.a.b.c", Scope::Claims, Returns::Any);
    compiled("claims['a'][0].b", Scope::Claims, Returns::Any);
}

#[test]
fn user_has_the_fields_kube_apiserver_declares() {
    for expression in [
        "user.username",
        "user.uid",
        "user.groups",
        "user.extra",
        "user.extra['k']",
        "user.groups[0]",
    ] {
        compiled(expression, Scope::User, Returns::Any);
    }
    assert_eq!(
        compile_error("user.name", Scope::User, Returns::Any),
        "compilation failed: undefined field 'name' of kubernetes.UserInfo"
    );
    assert_eq!(
        compile_error("has(user.email)", Scope::User, Returns::Bool),
        "compilation failed: undefined field 'email' of kubernetes.UserInfo"
    );
    assert_eq!(
        compile_error("user.username.first", Scope::User, Returns::Any),
        "compilation failed: type 'string' does not support field selection"
    );
    assert_eq!(
        compile_error(
            "user.groups.exists(g, g.name == 'x')",
            Scope::User,
            Returns::Bool
        ),
        "compilation failed: type 'string' does not support field selection"
    );
}

#[test]
fn a_bool_expression_must_be_typed_bool_at_load() {
    for refused in [
        "claims.admin",
        "claims.?admin.orValue(false)",
        "claims.groups",
        "user.username",
        "1",
    ] {
        let scope = if refused.starts_with("user") {
            Scope::User
        } else {
            Scope::Claims
        };
        assert_eq!(
            compile_error(refused, scope, Returns::Bool),
            "must evaluate to bool",
            "{refused}"
        );
        // A mapping may return anything.
        compiled(refused, scope, Returns::Any);
    }
    for accepted in [
        "claims.admin == true",
        "has(claims.admin)",
        "!claims.admin",
        "bool(claims.admin)",
        "claims.admin && claims.other",
        "'admin' in claims.groups",
        "claims.groups.exists(g, g == 'admin')",
        "claims.admin ? true : false",
    ] {
        compiled(accepted, Scope::Claims, Returns::Bool);
    }
    compiled("user.username.startsWith('x')", Scope::User, Returns::Bool);
}

#[test]
fn the_limits_and_unsupported_functions_are_the_match_conditions_ones() {
    let long = format!("claims.sub == '{}'", "x".repeat(MAX_EXPRESSION_CODE_POINTS));
    assert!(
        compile_error(&long, Scope::Claims, Returns::Bool)
            .starts_with("expression code point size exceeds limit")
    );
    let deep = format!("{}claims.sub{} == ''", "(".repeat(300), ")".repeat(300));
    assert!(compile_error(&deep, Scope::Claims, Returns::Bool).contains("nesting depth"));
    assert_eq!(
        compile_error("isURL(claims.iss)", Scope::Claims, Returns::Bool),
        "compilation failed: isURL(), of a Kubernetes CEL library, is not supported by this \
         proxy's CEL (see docs/COMPATIBILITY.md)"
    );
    assert!(
        compile_error("claims.sub ==", Scope::Claims, Returns::Any)
            .starts_with("compilation failed: 1:")
    );
}

#[test]
fn every_json_number_is_a_double() {
    let claims = payload();
    assert_eq!(
        on_claims("claims.exp", &claims),
        Ok(Output::Other("double".into()))
    );
    for expression in [
        "type(claims.exp) == double",
        "type(claims.ratio) == double",
        "type(claims.big) == double",
        // Numbers compare across types.
        "claims.exp == 1700081020",
        "claims.exp > 1700000000",
        "claims.ratio == 1.5",
        "string(int(claims.kubernetes__dot__io.warnafter)) == '1700081020'",
    ] {
        assert!(holds(expression, &claims), "{expression}");
    }
    // cel-rust writes a double without an exponent (cel-go: `1.70008102e+09`).
    assert_eq!(
        on_claims("string(claims.exp)", &claims),
        Ok(string("1700081020"))
    );
    // Arithmetic does not mix types: a double claim plus an int is an error.
    let error = on_claims("claims.exp + 1", &claims).unwrap_err();
    assert!(
        error.starts_with("expression 'claims.exp + 1' resulted in error: "),
        "{error}"
    );
}

#[test]
fn nested_objects_are_maps_selected_by_escaped_names() {
    let claims = payload();
    for (expression, expected) in [
        (
            "claims.kubernetes__dot__io.namespace",
            string("kube-system"),
        ),
        (
            "claims['kubernetes.io']['pod']['name']",
            string("coredns-69cbfb9798-jv9gn"),
        ),
        ("claims.kubernetes__dot__io.pod.uid", string("778a530c")),
        ("claims.data[0].groups__dot__io", string("x")),
        ("claims.kubernetes__dot__io", Output::Other("map".into())),
        ("claims", Output::Other("map".into())),
    ] {
        assert_eq!(on_claims(expression, &claims), Ok(expected), "{expression}");
    }
    for expression in [
        "has(claims.kubernetes__dot__io.pod.uid)",
        "!has(claims.kubernetes__dot__io.pod.ip)",
        "claims[?'kubernetes.io']['pod']['ip'].orValue(true)",
        "claims.kubernetes__dot__io.pod == {'name': 'coredns-69cbfb9798-jv9gn', 'uid': '778a530c'}",
        "size(claims.kubernetes__dot__io) == 3",
        "claims.kubernetes__dot__io.exists(k, k == 'pod')",
        "'pod' in claims.kubernetes__dot__io",
        // `in` takes a nested map's keys as written.
        "!('groups__dot__io' in claims.data[0])",
        // A claim is found under its unescaped name only; an invalid escape finds nothing.
        "'kubernetes__dot__io' in claims",
        "!has(claims.__foo__)",
        "!('__foo__' in claims)",
        "size(claims) == 15",
        // Iterating a list yields its objects with escapes read (kube-apiserver's do not).
        "claims.data.exists(d, has(d.groups__dot__io))",
        // `claims` equals only itself.
        "claims == claims",
        "!(claims == {})",
    ] {
        assert!(holds(expression, &claims), "{expression}");
    }
    assert_eq!(
        on_claims("claims.absent", &claims),
        Err("expression 'claims.absent' resulted in error: No such key: absent".to_owned())
    );
    assert!(on_claims("claims['__foo__']", &claims).is_err());
}

#[test]
fn iterating_the_claims_yields_their_values() {
    // kube-apiserver's lazy map hands a comprehension each claim's value, not its name.
    let claims = payload();
    assert!(holds(
        "claims.exists(v, v == 'system:serviceaccount:kube-system:coredns')",
        &claims
    ));
    assert!(!holds("claims.exists(v, v == 'sub')", &claims));
}

#[test]
fn lists_keep_their_elements_and_only_strings_are_strings() {
    let claims = payload();
    assert_eq!(
        on_claims("claims.groups", &claims),
        Ok(Output::List(vec![
            Some("system:serviceaccounts".to_owned()),
            Some("dev".to_owned())
        ]))
    );
    assert_eq!(
        on_claims("claims.mixed", &claims),
        Ok(Output::List(vec![
            Some("a".to_owned()),
            None,
            None,
            None,
            None,
            None
        ]))
    );
    assert_eq!(
        on_claims("claims.groups.map(g, 'oidc:' + g)", &claims),
        Ok(Output::List(vec![
            Some("oidc:system:serviceaccounts".to_owned()),
            Some("oidc:dev".to_owned())
        ]))
    );
    assert_eq!(on_claims("[]", &claims), Ok(Output::List(Vec::new())));
    for expression in [
        "claims.groups == ['system:serviceaccounts', 'dev']",
        "['system:serviceaccounts', 'dev'] == claims.groups",
        "'dev' in claims.groups",
        "claims.mixed[3] == ['b']",
        "claims.mixed[4].c == 'd'",
    ] {
        assert!(holds(expression, &claims), "{expression}");
    }
}

#[test]
fn null_is_null() {
    let claims = payload();
    assert_eq!(on_claims("claims.nothing", &claims), Ok(Output::Null));
    assert_eq!(on_claims("null", &claims), Ok(Output::Null));
    assert!(holds("claims.nothing == null", &claims));
    assert!(holds("has(claims.nothing)", &claims));
    assert_eq!(
        on_claims("claims.email_verified", &claims),
        Ok(Output::Bool(true))
    );
    assert_eq!(on_claims("1u", &claims), Ok(Output::Other("uint".into())));
}

#[test]
fn the_user_has_all_four_fields_even_empty() {
    let empty = User::default();
    let input = Input::user(&empty);
    for expression in [
        "user.username == ''",
        "user.uid == ''",
        "user.groups == []",
        "user.extra == {}",
        "size(user.extra) == 0",
    ] {
        let result = compiled(expression, Scope::User, Returns::Bool).evaluate(&input);
        assert_eq!(result.ok(), Some(Output::Bool(true)), "{expression}");
    }

    let mut extra = BTreeMap::new();
    extra.insert(
        "example.com/node-name".to_owned(),
        vec!["127.0.0.1".to_owned()],
    );
    let alice = User {
        name: "oidc:alice".into(),
        uid: "u-1".into(),
        groups: vec!["dev".into(), "ops".into()],
        extra,
    };
    let input = Input::user(&alice);
    for expression in [
        "user.username.startsWith('oidc:')",
        "user.uid == 'u-1'",
        "'ops' in user.groups && user.groups.size() == 2",
        "user.extra['example.com/node-name'][0] == '127.0.0.1'",
        "user.extra.example__dot__com__slash__node__dash__name == ['127.0.0.1']",
        "has(user.extra.example__dot__com__slash__node__dash__name)",
        "!has(user.extra.example__dot__com)",
        "user.extra[?'missing'].orValue([]) == []",
    ] {
        let result = compiled(expression, Scope::User, Returns::Bool).evaluate(&input);
        assert_eq!(result.ok(), Some(Output::Bool(true)), "{expression}");
    }
    // An expression over the claims finds no claims in a user.
    let error = compiled("claims.sub", Scope::Claims, Returns::Any)
        .evaluate(&input)
        .unwrap_err();
    assert!(matches!(error, EvaluationError::Failed { .. }), "{error}");
}

#[test]
fn an_evaluation_over_the_per_call_limit_is_an_error_not_run() {
    let quadratic = "claims.groups.all(g, claims.groups.exists_one(h, h == g))";
    let expression = compiled(quadratic, Scope::Claims, Returns::Bool);
    let mut claims = payload();
    assert_eq!(
        expression.evaluate(&Input::claims(&claims)).ok(),
        Some(Output::Bool(true))
    );
    let many: Vec<serde_json::Value> = (0..2000).map(|i| json!(format!("g{i}"))).collect();
    claims.insert("groups".to_owned(), serde_json::Value::Array(many));
    let error = expression.evaluate(&Input::claims(&claims)).unwrap_err();
    let EvaluationError::CostLimit { cost, .. } = &error else {
        panic!("{error}");
    };
    assert!(*cost > PER_CALL_LIMIT, "{cost}");
    assert_eq!(
        error.to_string(),
        format!(
            "expression '{quadratic}' resulted in error: operation cancelled: actual cost limit \
             exceeded (cost {cost}, limit 1000000)"
        )
    );

    // The same over a user's groups.
    let user = User {
        groups: (0..2000).map(|i| format!("g{i}")).collect(),
        ..User::default()
    };
    let quadratic = "user.groups.all(g, user.groups.exists_one(h, h == g))";
    let error = compiled(quadratic, Scope::User, Returns::Bool)
        .evaluate(&Input::user(&user))
        .unwrap_err();
    assert!(
        matches!(error, EvaluationError::CostLimit { .. }),
        "{error}"
    );
}

#[test]
fn only_expressions_that_could_pass_the_limit_are_priced() {
    let claims = payload();
    let input = Input::claims(&claims);
    // Whatever the token, these cost little: the input is not measured.
    for cheap in [
        "claims.sub",
        "claims.email_verified == true",
        "'system:serviceaccounts:' + claims.kubernetes__dot__io.namespace",
    ] {
        let expression = compiled(cheap, Scope::Claims, Returns::Any);
        assert!(expression.0.estimate <= PER_CALL_LIMIT, "{cheap}");
        expression.evaluate(&input).unwrap();
    }
    assert!(input.sizes.get().is_none());
    // A loop over a claim could pass it on the largest token: measured once, then reused.
    let looping = compiled(
        "claims.groups.exists(g, g == 'dev')",
        Scope::Claims,
        Returns::Bool,
    );
    assert!(looping.0.estimate > PER_CALL_LIMIT);
    assert_eq!(looping.evaluate(&input).ok(), Some(Output::Bool(true)));
    let measured: *const Sizes = input.sizes.get().expect("measured");
    assert_eq!(looping.evaluate(&input).ok(), Some(Output::Bool(true)));
    assert!(std::ptr::eq(measured, input.sizes.get().expect("measured")));

    // Over a user, only an expression whose cost grows with the user is priced.
    let cheap = compiled(
        "user.username.startsWith('oidc:')",
        Scope::User,
        Returns::Bool,
    );
    assert!(cheap.0.estimate <= PER_CALL_LIMIT);
    let looping = compiled("'dev' in user.groups", Scope::User, Returns::Bool);
    assert!(looping.0.estimate > PER_CALL_LIMIT);
}

#[test]
fn selects_finds_a_field_selected_on_the_identifier() {
    for (expression, expected) in [
        ("claims.email", true),
        ("has(claims.email)", true),
        ("claims.?email.orValue('')", true),
        ("claims.email_verified ? claims.email : ''", true),
        ("[claims.sub].exists(s, s == claims.email)", true),
        ("{'k': claims.email}.k", true),
        ("claims.email.lowerAscii()", true),
        ("size(claims.email) > 0", true),
        ("claims['email']", false),
        ("claims.email_verified", false),
        ("claims.profile.email", false),
        ("claims.sub", false),
    ] {
        let compiled = compiled(expression, Scope::Claims, Returns::Any);
        assert_eq!(
            compiled.selects("claims", "email"),
            expected,
            "{expression}"
        );
    }
    let compiled = compiled("claims.email", Scope::Claims, Returns::Any);
    assert!(!compiled.selects("", "email"));
    assert!(!compiled.selects("claims", ""));
    assert!(!compiled.selects("user", "email"));
}

#[test]
fn an_expression_is_shared_and_shows_its_text() {
    let expression = compiled("claims.sub", Scope::Claims, Returns::Any);
    let copy = expression.clone();
    assert!(Arc::ptr_eq(&expression.0, &copy.0));
    assert_eq!(copy.text(), "claims.sub");
    assert_eq!(format!("{expression:?}"), r#"Expression("claims.sub")"#);
}

#[test]
fn an_input_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>(_: &T) {}
    let claims = payload();
    shared(&Input::claims(&claims));
    shared(&compiled("claims.sub", Scope::Claims, Returns::Any));
}
