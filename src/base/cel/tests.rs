//! Compiling and checking: the load check's verdicts and types over declared variables, the
//! functions called unsupported, the nesting limit on a small stack, the bracket count, and how
//! errors quote an expression.

use cel::{Context, ExecutionError};

use super::check::UNSUPPORTED_FUNCTIONS;
use super::*;

/// A record, as kube-apiserver declares `kubernetes.UserInfo`.
static PERSON: Object = Object {
    name: "test.Person",
    fields: &[
        ("name", Type::String),
        ("groups", Type::List(&Type::String)),
        (
            "extra",
            Type::Map(&Type::String, &Type::List(&Type::String)),
        ),
    ],
};

/// A record and a `dyn` map, the two shapes callers declare.
static VARIABLES: [Variable; 2] = [
    Variable {
        name: "person",
        declared: Type::Object(&PERSON),
    },
    Variable {
        name: "data",
        declared: Type::Map(&Type::String, &Type::Dyn),
    },
];

/// One `dyn` variable named as the authorization conditions' is, for expressions of any shape.
static REQUEST: [Variable; 1] = [Variable {
    name: "request",
    declared: Type::Dyn,
}];

fn output(expression: &str) -> Type {
    compile(expression, &VARIABLES)
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
        .output
}

fn error(expression: &str) -> String {
    match compile(expression, &VARIABLES) {
        Ok(compiled) => panic!("{expression}: compiled to {}", compiled.output),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_check_knows_the_declared_types() {
    for (expression, expected) in [
        ("person", "test.Person"),
        ("person.name", "string"),
        ("person.groups", "list(string)"),
        ("person.groups[0]", "string"),
        ("person.extra", "map(string, list(string))"),
        ("person.extra['k']", "list(string)"),
        ("person.extra.k", "list(string)"),
        ("person.groups.map(g, g)", "list(dyn)"),
        ("data", "map(string, dyn)"),
        ("data.anything", "dyn"),
        ("data['x'].y.z", "dyn"),
        ("data.x == 1", "bool"),
        ("has(data.x)", "bool"),
        ("bool(data.x)", "bool"),
        ("!data.x", "bool"),
        ("data.x ? true : false", "bool"),
        ("data.x ? 'a' : 1", "dyn"),
        ("person.groups.exists(g, g.startsWith('a'))", "bool"),
        ("person.extra.all(k, k.size() > 1)", "bool"),
        ("data.?x.orValue(false)", "dyn"),
        ("size(data)", "int"),
        ("person.name + 'x'", "string"),
        ("[1, 2]", "list(dyn)"),
        ("{'a': 1}", "map(dyn, dyn)"),
        ("null", "null_type"),
        ("type(data) == map", "bool"),
        // Optionals, as cel-go types them.
        ("data.?x", "optional_type(dyn)"),
        ("data.?x.y", "optional_type(dyn)"),
        ("data.?x.orValue(true)", "dyn"),
        ("data[?'x']['y']", "optional_type(dyn)"),
        ("data[?'x']['y'].orValue(true)", "bool"),
        ("data.x[?'y'].orValue(true)", "dyn"),
        ("person.?name", "optional_type(string)"),
        ("person.?name.orValue('')", "string"),
        ("person.?name.orValue(1)", "dyn"),
        ("person.?extra['k']", "optional_type(list(string))"),
        ("person.?groups.value()", "list(string)"),
        ("person.?groups.hasValue()", "bool"),
    ] {
        assert_eq!(output(expression).to_string(), expected, "{expression}");
    }
}

#[test]
fn the_check_refuses_what_kube_apiserver_refuses() {
    for (expression, expected) in [
        (
            "other.x",
            "compilation failed: undeclared reference to 'other' (the variables are person, data)",
        ),
        (
            "person.groups.exists(g, h == g)",
            "compilation failed: undeclared reference to 'h' (the variables are person, data)",
        ),
        (
            "person.username",
            "compilation failed: undefined field 'username' of test.Person",
        ),
        (
            "person.name.first",
            "compilation failed: type 'string' does not support field selection",
        ),
        (
            "person.?username",
            "compilation failed: undefined field 'username' of test.Person",
        ),
        (
            "person.name.?first",
            "compilation failed: type 'string' does not support field selection",
        ),
        (
            "person.groups.x",
            "compilation failed: type 'list(string)' does not support field selection",
        ),
        (
            "person.groups.exists(g, g.x)",
            "compilation failed: type 'string' does not support field selection",
        ),
        (
            "data.x.matches('(')",
            "compilation failed: invalid regular expression \"(\": error: unclosed group",
        ),
        (
            "data.x.isSorted()",
            "compilation failed: isSorted(), of a Kubernetes CEL library, is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "sets.contains(data.x, data.y)",
            "compilation failed: sets.contains(), of a Kubernetes CEL library, is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)",
        ),
        (
            "math.greatest(1, 2) == 2",
            "compilation failed: undeclared reference to 'math' (the variables are person, data)",
        ),
    ] {
        assert_eq!(error(expression), expected, "{expression}");
    }
    let only = compile("requests.user", &REQUEST).unwrap_err().to_string();
    assert_eq!(
        only,
        "compilation failed: undeclared reference to 'requests' (the only variable is request)"
    );
}

#[test]
fn the_functions_called_unsupported_are_missing_from_cel_rust() {
    for name in UNSUPPORTED_FUNCTIONS {
        for source in [format!("{name}(1)"), format!("'x'.{name}()")] {
            let program = ENV.compile(&source).unwrap();
            let context = Context::with_env(Arc::clone(&ENV));
            assert_eq!(
                program.execute(&context),
                Err(ExecutionError::undeclared_reference(name)),
                "{source}"
            );
        }
    }
}

/// An expression of a given nesting depth.
type Chain = fn(usize) -> String;

/// Expressions nested deeper than the walkers may recurse (select, comparison, concatenation
/// and index chains, nested lists, nested calls), each within the size limit, are refused with
/// the limit named, when compiled on a thread with the smallest stack the proxy gives one (2 MiB,
/// tokio's); one within the limit is judged on its merits.
#[test]
fn deep_expressions_are_refused_not_a_crash() {
    let chains: [(&str, Chain); 6] = [
        ("select", |n| format!("request{}", ".a".repeat(n))),
        ("==", |n| vec!["1"; n + 1].join(" == ")),
        ("+", |n| format!("{} == 0", vec!["1"; n + 1].join(" + "))),
        ("index", |n| {
            format!("request.groups{} == 'x'", "[0]".repeat(n))
        }),
        ("list", |n| {
            format!("{}1{} == []", "[".repeat(n), "]".repeat(n))
        }),
        ("call", |n| {
            format!("{}'a'{} == 'a'", "string(".repeat(n), ")".repeat(n))
        }),
    ];
    let outcomes = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let mut outcomes = Vec::new();
            for (name, chain) in chains {
                for depth in [14_000, 7_500, 1_000, MAX_NESTING_DEPTH + 1] {
                    let expression = chain(depth);
                    if expression.chars().count() > MAX_EXPRESSION_CODE_POINTS {
                        continue;
                    }
                    let refused = match compile(&expression, &REQUEST) {
                        Ok(_) => "compiles".to_owned(),
                        Err(e) => e.to_string(),
                    };
                    outcomes.push((name, depth, refused));
                }
                let within = chain(MAX_NESTING_DEPTH / 2 - 2);
                outcomes.push((
                    name,
                    0,
                    match compile(&within, &REQUEST) {
                        Ok(compiled) => {
                            // The program is walked and dropped on this small stack.
                            cost(compiled.program.expression(), &Sizes::new(Vec::new(), 1.0));
                            "compiles".to_owned()
                        }
                        Err(e) => e.to_string(),
                    },
                ));
            }
            outcomes
        })
        .expect("a thread")
        .join()
        .expect("no stack overflow");
    for (name, depth, outcome) in outcomes {
        if depth == 0 {
            assert!(
                !outcome.contains("nesting depth"),
                "{name} within the limit: {outcome}"
            );
        } else {
            assert!(
                outcome.contains("nesting depth") && outcome.contains("limit of 250"),
                "{name} {depth} deep: {outcome}"
            );
        }
    }
}

/// Brackets inside string literals (quoted, triple-quoted, raw, with escaped quotes) and comments
/// do not nest; brackets outside them do.
#[test]
fn bracket_depth_skips_strings_and_comments() {
    for (expression, depth) in [
        ("request.user == 'a'", 0),
        ("[[1], [2, [3]]] == []", 3),
        ("'((((' == \"[[[[\" && (true)", 1),
        ("'it\\'s ((' == r'\\' && ([1])", 2),
        ("'''(((''' == \"\"\"[[[\"\"\" && {'a': [1]} == {}", 2),
        ("true // (((( [[[[\n&& (true)", 1),
        ("'unclosed ((((", 0),
    ] {
        assert_eq!(super::bracket_depth(expression), depth, "{expression}");
    }
}

#[test]
fn an_error_quotes_a_long_expression_by_its_start() {
    assert_eq!(quoted("claims.sub"), "\"claims.sub\"");
    let long = format!("'{}'", "é".repeat(300));
    assert_eq!(
        quoted(&long),
        format!("\"'{}\"… (302 code points)", "é".repeat(199))
    );
}
