//! Path safety against a model of the kubelet's router (kubernetes v1.33
//! `pkg/kubelet/server/server.go` and Go's `net/http` `ServeMux`): Go decodes the path,
//! `ServeMux` redirects unclean paths and routes clean ones by longest prefix. For every path the
//! proxy forwards, the handler the kubelet reaches must need exactly the subresources authorized.

use std::collections::BTreeSet;

use http::Method;
use kubelet_auth_proxy::authz::attributes::{AttributeMapping, kubelet_attributes};
use kubelet_auth_proxy::request::canonical_path::{PathCheck, check_path};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Where the kubelet's `ServeMux` sends a decoded path.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// 301 to the cleaned path (or to a subtree root's slash form), before any authorization.
    Redirect(String),
    /// 404 before any authorization: no pattern matches.
    NotFound,
    /// A registered handler, behind the auth filter.
    Handler(&'static Pattern),
}

/// A pattern the kubelet registers, with the `nodes/<subresource>` its auth filter checks for
/// every path the pattern serves: `fine` only with `KubeletFineGrainedAuthz`, then `coarse`.
#[derive(Debug, PartialEq, Eq)]
struct Pattern {
    pattern: &'static str,
    fine: Option<&'static str>,
    coarse: &'static str,
}

const fn p(pattern: &'static str, fine: Option<&'static str>, coarse: &'static str) -> Pattern {
    Pattern {
        pattern,
        fine,
        coarse,
    }
}

/// The kubelet 1.33 secure port with every optional handler on (kubernetes v1.33
/// `pkg/kubelet/server/server.go` `InstallDefaultHandlers`, `InstallDebuggingHandlers`). go-restful
/// registers a web service root `/x` as both `/x` and `/x/`; a root ending in `/` only as itself.
/// Plain `Handle` registrations are exact unless they end in `/`.
static PATTERNS: &[Pattern] = &[
    p("/healthz", Some("healthz"), "proxy"),
    p("/healthz/", Some("healthz"), "proxy"),
    p("/pods", Some("pods"), "proxy"),
    p("/pods/", Some("pods"), "proxy"),
    p("/stats/", None, "stats"),
    p("/metrics", None, "metrics"),
    p("/metrics/cadvisor", None, "metrics"),
    p("/metrics/resource", None, "metrics"),
    p("/metrics/probes", None, "metrics"),
    p("/metrics/slis", None, "metrics"),
    p("/run", None, "proxy"),
    p("/run/", None, "proxy"),
    p("/exec", None, "proxy"),
    p("/exec/", None, "proxy"),
    p("/attach", None, "proxy"),
    p("/attach/", None, "proxy"),
    p("/portForward", None, "proxy"),
    p("/portForward/", None, "proxy"),
    p("/containerLogs", None, "proxy"),
    p("/containerLogs/", None, "proxy"),
    p("/configz", Some("configz"), "proxy"),
    p("/runningpods/", Some("pods"), "proxy"),
    p("/checkpoint", None, "checkpoint"),
    p("/checkpoint/", None, "checkpoint"),
    p("/statusz", Some("statusz"), "proxy"),
    p("/flagz", None, "proxy"),
    p("/logs", None, "log"),
    p("/logs/", None, "log"),
    p("/debug/pprof/", None, "proxy"),
    p("/debug/flags/v", None, "proxy"),
];

/// Go's `url.PathUnescape`-style decoding of `r.URL.Path`: every `%XX` becomes its byte, `%2F`
/// included; a bad escape is a 400 from Go's server (`None`).
fn go_decode(raw: &str) -> Option<Vec<u8>> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Go's `path.Clean` on a rooted path.
fn go_path_clean(path: &str) -> String {
    let mut stack: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                stack.pop();
            }
            _ => stack.push(segment),
        }
    }
    format!("/{}", stack.join("/"))
}

/// `net/http`'s `cleanPath`: `path.Clean`, keeping a trailing slash.
fn go_clean_path(path: &str) -> String {
    if path.is_empty() {
        return "/".to_owned();
    }
    let rooted = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let mut cleaned = go_path_clean(&rooted);
    if rooted.ends_with('/') && cleaned != "/" {
        cleaned.push('/');
    }
    cleaned
}

/// `ServeMux`: unclean paths redirect; then an exact pattern, else the longest subtree pattern
/// (`/x/`) that is a prefix; `/x` with only `/x/` registered redirects to `/x/`.
fn kubelet_route(decoded: &str) -> Route {
    let cleaned = go_clean_path(decoded);
    if cleaned != decoded {
        return Route::Redirect(cleaned);
    }
    if let Some(exact) = PATTERNS.iter().find(|p| p.pattern == decoded) {
        return Route::Handler(exact);
    }
    let subtree = PATTERNS
        .iter()
        .filter(|p| p.pattern.ends_with('/') && decoded.starts_with(p.pattern))
        .max_by_key(|p| p.pattern.len());
    if let Some(subtree) = subtree {
        return Route::Handler(subtree);
    }
    let with_slash = format!("{decoded}/");
    if PATTERNS.iter().any(|p| p.pattern == with_slash) {
        return Route::Redirect(with_slash);
    }
    Route::NotFound
}

fn mappings() -> [AttributeMapping; 2] {
    [
        AttributeMapping::default(),
        AttributeMapping {
            fine_grained: false,
            ..AttributeMapping::default()
        },
    ]
}

/// The property, for one raw path: a forwarded path is clean as the kubelet decodes it, the
/// proxy's decoded form is the kubelet's, and when it reaches a handler the proxy asked about
/// exactly the subresources that handler's auth filter checks. A redirect's location leads where
/// the kubelet's own redirect would.
fn check(raw: &str) -> Result<(), TestCaseError> {
    match check_path(raw) {
        PathCheck::Canonical { decoded } => {
            let go = go_decode(raw);
            prop_assert_eq!(
                go.as_deref(),
                Some(decoded.as_bytes()),
                "{:?}: Go decodes differently",
                raw
            );
            let route = kubelet_route(&decoded);
            if let Route::Redirect(to) = &route {
                prop_assert!(
                    format!("{decoded}/") == *to,
                    "{:?}: forwarded but the kubelet cleans it to {:?}",
                    raw,
                    to
                );
            }
            if let Route::Handler(pattern) = route {
                for mapping in mappings() {
                    let asked: BTreeSet<&str> =
                        kubelet_attributes(&mapping, &Method::GET, &decoded)
                            .subresources
                            .iter()
                            .collect();
                    let needed: BTreeSet<&str> = mapping
                        .fine_grained
                        .then_some(pattern.fine)
                        .flatten()
                        .into_iter()
                        .chain([pattern.coarse])
                        .collect();
                    prop_assert_eq!(
                        &asked,
                        &needed,
                        "{:?} routes to {} (fine-grained {})",
                        raw,
                        pattern.pattern,
                        mapping.fine_grained
                    );
                }
            }
        }
        PathCheck::Redirect { location } => {
            prop_assert!(
                location.starts_with('/') && !location.starts_with("//"),
                "{:?}: redirect leaves the host: {:?}",
                raw,
                location
            );
            let followed = check_path(&location);
            let PathCheck::Canonical { decoded: target } = followed else {
                return Err(TestCaseError::fail(format!(
                    "{raw:?}: redirect to {location:?} is not canonical: {followed:?}"
                )));
            };
            let go = go_decode(raw).map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            prop_assert_eq!(
                go.map(|decoded| go_clean_path(&decoded)),
                Some(target.into_owned()),
                "{:?}: the redirect differs from the kubelet's",
                raw
            );
        }
        PathCheck::Reject(_) => {}
    }
    Ok(())
}

/// Pieces of hostile paths: kubelet roots, dot segments in every spelling, escaped and doubled
/// slashes and percents, `;` parameters, backslashes, NUL, non-ASCII and unicode escapes.
const ATOMS: &[&str] = &[
    "stats",
    "summary",
    "exec",
    "pods",
    "healthz",
    "metrics",
    "cadvisor",
    "logs",
    "runningpods",
    "checkpoint",
    "configz",
    "statusz",
    "flagz",
    "debug",
    "pprof",
    "containerLogs",
    "portForward",
    "attach",
    "run",
    "ns",
    "pod",
    "ctr",
    "",
    ".",
    "..",
    "...",
    "%2e",
    "%2E",
    "%2e%2e",
    ".%2e",
    "%2E.",
    "%2f",
    "%2F",
    "..%2f",
    "%2f..%2f",
    "%25",
    "%252e",
    "%252f",
    "%25%32%65",
    ";",
    "..;",
    "exec;x",
    "%3b",
    "\\",
    "%5c",
    "..%5c",
    "%00",
    "\0",
    "%0a",
    "%7f",
    "%c3%a9",
    "é",
    "%u002e",
    "%e2%80%a5",
    "%ef%bc%8f",
    "%c0%ae",
    "%c0%af",
    "%61",
    "st%61ts",
    "%7e",
    "~",
    "%zz",
    "%4",
    "%",
    "?",
    "#",
    " ",
    "%20",
];

fn structured_path() -> impl Strategy<Value = String> {
    let segments = prop::collection::vec(
        (
            prop::sample::select(ATOMS),
            prop::sample::select(&["/", "/", "/", "//"][..]),
        ),
        0..10,
    );
    (any::<bool>(), segments, any::<bool>()).prop_map(|(rooted, segments, trailing)| {
        let mut path = String::from(if rooted { "/" } else { "" });
        for (i, (atom, separator)) in segments.iter().enumerate() {
            if i > 0 {
                path.push_str(separator);
            }
            path.push_str(atom);
        }
        if trailing {
            path.push('/');
        }
        path
    })
}

fn character_soup() -> impl Strategy<Value = String> {
    "/[/.%2eEfF05aAcC;:sx~\\\\\u{0}é]{0,48}"
}

fn long_path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(&["/stats", "/exec", "/pods", "/logs", ""][..]),
        prop::sample::select(&["/a", "/..", "/.", "//", "/%2e%2e", "/%41", "/x;y"][..]),
        1usize..3000,
    )
        .prop_map(|(root, piece, n)| format!("{root}{}", piece.repeat(n)))
}

fn run(name: &str, cases: u32, strategy: impl Strategy<Value = String>) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, |raw| check(&raw)) {
        panic!("{name}: {e}");
    }
}

#[test]
fn forwarded_structured_paths_reach_only_authorized_handlers() {
    run("structured", 20_000, structured_path());
}

#[test]
fn forwarded_character_soup_reaches_only_authorized_handlers() {
    run("character soup", 20_000, character_soup());
}

#[test]
fn forwarded_long_paths_reach_only_authorized_handlers() {
    run("long", 500, long_path());
}

#[test]
fn known_attack_strings_never_reach_an_unauthorized_handler() {
    let exec = "/exec/ns/pod/ctr";
    // (raw path, what the proxy does with it: forward, redirect to a location, or reject with 400)
    let table: &[(&str, &str)] = &[
        ("/stats/../exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/stats/%2e%2e/exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/stats/%2E%2E/exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/stats/.%2e/exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/stats%2f..%2fexec/ns/pod/ctr", "reject"),
        ("/stats%2F..%2Fexec/ns/pod/ctr", "reject"),
        ("/stats/..%2fexec/ns/pod/ctr", "reject"),
        ("/stats/%252e%252e/exec/ns/pod/ctr", "forward"),
        ("//exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/exec/./ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/exec/%2e/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/stats/..;/exec/ns/pod/ctr", "forward"),
        ("/stats;/../exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("/stats/..\\exec/ns/pod/ctr", "reject"),
        ("/stats/..%5cexec/ns/pod/ctr", "forward"),
        ("/stats/%00/../exec/ns/pod/ctr", "reject"),
        ("/stats/%c0%ae%c0%ae/exec/ns/pod/ctr", "reject"),
        ("/stats/%u002e%u002e/exec/ns/pod/ctr", "reject"),
        ("/stats/\u{2025}/exec/ns/pod/ctr", "reject"),
        ("/st%61ts/../exec/ns/pod/ctr", "redirect /exec/ns/pod/ctr"),
        ("exec/ns/pod/ctr", "reject"),
        ("*", "reject"),
        ("", "reject"),
        (exec, "forward"),
    ];
    for (raw, want) in table {
        let got = match check_path(raw) {
            PathCheck::Canonical { .. } => "forward".to_owned(),
            PathCheck::Redirect { location } => format!("redirect {location}"),
            PathCheck::Reject(_) => "reject".to_owned(),
        };
        assert_eq!(&got, want, "{raw:?}");
        check(raw).unwrap_or_else(|e| panic!("{raw:?}: {e}"));
    }
    // The forwarded look-alikes stay inside `/stats/` for the kubelet, and are checked as stats.
    for raw in [
        "/stats/%252e%252e/exec/ns/pod/ctr",
        "/stats/..;/exec/ns/pod/ctr",
    ] {
        let PathCheck::Canonical { decoded } = check_path(raw) else {
            unreachable!("checked above");
        };
        assert_eq!(
            kubelet_route(&decoded),
            Route::Handler(&PATTERNS[4]),
            "{raw:?}"
        );
    }
}

#[test]
fn the_model_routes_like_the_kubelet() {
    // The model itself, on paths whose kubelet behaviour Go's `path.Clean` and `ServeMux` fix.
    assert_eq!(
        kubelet_route("/stats/../exec/a"),
        Route::Redirect("/exec/a".into())
    );
    assert_eq!(kubelet_route("//exec/a"), Route::Redirect("/exec/a".into()));
    assert_eq!(kubelet_route("/stats"), Route::Redirect("/stats/".into()));
    assert_eq!(kubelet_route("/foo"), Route::NotFound);
    assert_eq!(kubelet_route("/metrics/foo"), Route::NotFound);
    assert_eq!(kubelet_route("/podsx"), Route::NotFound);
    let handler = |path| match kubelet_route(path) {
        Route::Handler(pattern) => pattern.pattern,
        other => panic!("{path}: {other:?}"),
    };
    assert_eq!(handler("/exec/a/b/c"), "/exec/");
    assert_eq!(handler("/stats/summary"), "/stats/");
    assert_eq!(handler("/debug/pprof/heap"), "/debug/pprof/");
    assert_eq!(handler("/metrics/cadvisor"), "/metrics/cadvisor");
    assert_eq!(handler("/pods"), "/pods");
    assert_eq!(go_clean_path("/a/b/../../../c/"), "/c/");
    assert_eq!(go_decode("/a%2Fb%25").as_deref(), Some(&b"/a/b%"[..]));
    assert_eq!(go_decode("/a%zz"), None);
}
