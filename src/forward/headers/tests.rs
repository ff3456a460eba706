//! Header hygiene tests: tables of headers in, headers out, in both directions.

use super::*;
use http::Version;
use std::collections::BTreeMap;

/// A header list in a test table.
type Pairs = &'static [(&'static str, &'static str)];

fn map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// Header names and values as sorted `(name, value)` pairs, for whole-map comparisons.
fn pairs(h: &HeaderMap) -> Vec<(String, String)> {
    let mut v: Vec<_> = h
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    v.sort();
    v
}

fn expect(p: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = p
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

#[test]
fn only_exec_attach_and_port_forward_with_websocket_or_spdy_may_upgrade() {
    let upgrade = |value: &str| map(&[("connection", "Upgrade"), ("upgrade", value)]);
    for path in [
        "/exec/ns/pod/ctr",
        "/attach/ns/pod/ctr",
        "/portForward/ns/pod",
    ] {
        for protocol in ["websocket", "WebSocket", "SPDY/3.1", "spdy/3.1"] {
            assert!(may_upgrade(path, &upgrade(protocol)), "{path} {protocol}");
        }
        for protocol in ["h2c", "websocket, h2c", "SPDY/3", "TLS/1.0", ""] {
            assert!(
                !may_upgrade(path, &upgrade(protocol)),
                "{path} {protocol:?}"
            );
        }
    }
    for path in [
        "/pods",
        "/run/ns/pod/ctr",
        "/containerLogs/ns/pod/ctr",
        "/exec",
        "/execx/ns/pod/ctr",
        "/portforward/ns/pod",
    ] {
        assert!(!may_upgrade(path, &upgrade("websocket")), "{path}");
    }
}

#[test]
fn request_hygiene_table() {
    struct Case {
        name: &'static str,
        upgrade: bool,
        input: Pairs,
        output: Pairs,
    }
    let cases = [
        Case {
            name: "end-to-end headers pass",
            upgrade: false,
            input: &[
                ("accept", "application/json"),
                ("user-agent", "kubectl"),
                ("content-length", "3"),
            ],
            output: &[
                ("accept", "application/json"),
                ("user-agent", "kubectl"),
                ("content-length", "3"),
            ],
        },
        Case {
            name: "fixed hop-by-hop list removed",
            upgrade: false,
            input: &[
                ("keep-alive", "timeout=5"),
                ("proxy-connection", "keep-alive"),
                ("proxy-authorization", "Basic eDp5"),
                ("proxy-authenticate", "Basic"),
                ("te", "trailers"),
                ("trailer", "x-checksum"),
                ("transfer-encoding", "chunked"),
                ("upgrade", "websocket"),
                ("accept", "*/*"),
            ],
            output: &[("accept", "*/*")],
        },
        Case {
            name: "Connection and the headers it names removed, case-insensitively",
            upgrade: false,
            input: &[
                ("connection", "keep-alive, X-Private"),
                ("connection", " x-other ,,"),
                ("x-private", "1"),
                ("x-other", "2"),
                ("x-kept", "3"),
            ],
            output: &[("x-kept", "3")],
        },
        Case {
            name: "identity lookalikes with _ for - and method overrides removed",
            upgrade: false,
            input: &[
                ("x_remote_user", "system:admin"),
                ("x-remote_group", "system:masters"),
                ("x_remote-extra-scopes", "all"),
                ("impersonate_user", "system:admin"),
                ("impersonate-extra_scopes", "all"),
                ("x-http-method-override", "DELETE"),
                ("x-http-method", "PUT"),
                ("x-method-override", "POST"),
                ("x-remoteuser", "kept: not an identity header"),
                ("x_remote", "kept: no prefix match"),
            ],
            output: &[
                ("x-remoteuser", "kept: not an identity header"),
                ("x_remote", "kept: no prefix match"),
            ],
        },
        Case {
            name: "credentials and client identity removed",
            upgrade: false,
            input: &[
                ("authorization", "Bearer secret"),
                ("x-remote-user", "system:admin"),
                ("x-remote-group", "system:masters"),
                ("x-remote-extra-scopes", "all"),
                ("x-remote-uid", "0"),
                ("x-remote-anything", "x"),
                ("impersonate-user", "system:admin"),
                ("impersonate-group", "system:masters"),
                ("impersonate-uid", "0"),
                ("impersonate-extra-scopes", "all"),
                ("x-remotely", "kept: not the x-remote- prefix"),
                ("accept", "*/*"),
            ],
            output: &[
                ("x-remotely", "kept: not the x-remote- prefix"),
                ("accept", "*/*"),
            ],
        },
        Case {
            name: "upgrade keeps Upgrade and exactly Connection: Upgrade",
            upgrade: true,
            input: &[
                ("connection", "Upgrade, HTTP2-Settings, keep-alive"),
                ("http2-settings", "AAA"),
                ("upgrade", "SPDY/3.1"),
                ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ],
            output: &[
                ("connection", "Upgrade"),
                ("upgrade", "SPDY/3.1"),
                ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ],
        },
        Case {
            name: "upgrade still loses credentials and other hop-by-hop headers",
            upgrade: true,
            input: &[
                ("connection", "upgrade"),
                ("upgrade", "websocket"),
                ("authorization", "Bearer secret"),
                ("impersonate-user", "root"),
                ("transfer-encoding", "chunked"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ],
            output: &[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ],
        },
        Case {
            name: "WebSocket bearer token entry removed, other protocols kept in order",
            upgrade: true,
            input: &[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                (
                    "sec-websocket-protocol",
                    "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.c2VjcmV0",
                ),
                ("sec-websocket-protocol", "v4.channel.k8s.io"),
            ],
            output: &[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                (
                    "sec-websocket-protocol",
                    "v5.channel.k8s.io, v4.channel.k8s.io",
                ),
            ],
        },
        Case {
            name: "WebSocket protocol header dropped when only a token was in it",
            upgrade: false,
            input: &[(
                "sec-websocket-protocol",
                "Base64Url.Bearer.Authorization.K8s.Io.c2VjcmV0",
            )],
            output: &[],
        },
        Case {
            name: "WebSocket protocols without a token untouched",
            upgrade: false,
            input: &[(
                "sec-websocket-protocol",
                "v5.channel.k8s.io,  v4.channel.k8s.io",
            )],
            output: &[(
                "sec-websocket-protocol",
                "v5.channel.k8s.io,  v4.channel.k8s.io",
            )],
        },
    ];
    for case in cases {
        let mut h = map(case.input);
        sanitize_request_headers(&mut h, case.upgrade);
        assert_eq!(pairs(&h), expect(case.output), "{}", case.name);
    }
}

#[test]
fn response_hygiene_table() {
    let cases: [(&str, bool, Pairs, Pairs); 4] = [
        (
            "Connection: keep-alive and Keep-Alive, as nginx and older servers send them, go",
            false,
            &[
                ("connection", "Keep-Alive"),
                ("keep-alive", "timeout=5"),
                ("content-length", "3"),
            ],
            &[("content-length", "3")],
        ),
        (
            "ordinary response loses hop-by-hop headers, even Upgrade",
            false,
            &[
                ("connection", "close, x-conn"),
                ("x-conn", "1"),
                ("transfer-encoding", "chunked"),
                ("keep-alive", "timeout=5"),
                ("upgrade", "h2c"),
                ("proxy-authenticate", "Basic"),
                ("content-type", "text/plain"),
            ],
            &[("content-type", "text/plain")],
        ),
        (
            "101 keeps Upgrade and Connection: Upgrade",
            true,
            &[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            ],
            &[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            ],
        ),
        (
            "responses keep end-to-end headers named like identity headers",
            false,
            &[("x-remote-user", "kept"), ("www-authenticate", "Bearer")],
            &[("x-remote-user", "kept"), ("www-authenticate", "Bearer")],
        ),
    ];
    for (name, switched, input, output) in cases {
        let mut h = map(input);
        sanitize_response_headers(&mut h, switched);
        assert_eq!(pairs(&h), expect(output), "{name}");
    }
}

#[test]
fn upgrade_detection() {
    let ws = map(&[
        ("connection", "keep-alive, Upgrade"),
        ("upgrade", "websocket"),
    ]);
    assert!(wire::is_upgrade_request(Version::HTTP_11, &ws));
    assert!(
        !wire::is_upgrade_request(Version::HTTP_2, &ws),
        "HTTP/2 has no upgrades"
    );
    assert!(!wire::is_upgrade_request(Version::HTTP_10, &ws));
    let no_upgrade_header = map(&[("connection", "upgrade")]);
    assert!(!wire::is_upgrade_request(
        Version::HTTP_11,
        &no_upgrade_header
    ));
    let not_named = map(&[("connection", "keep-alive"), ("upgrade", "SPDY/3.1")]);
    assert!(!wire::is_upgrade_request(Version::HTTP_11, &not_named));
    let spdy = map(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]);
    assert!(wire::is_upgrade_request(Version::HTTP_11, &spdy));
}

#[test]
fn identity_headers_set_in_order_and_replace_nothing_else() {
    let mut extra = BTreeMap::new();
    extra.insert(
        "scopes".to_owned(),
        vec!["view".to_owned(), "edit".to_owned()],
    );
    extra.insert("empty".to_owned(), vec![]);
    let user = User {
        name: "alice@example.com".into(),
        uid: "1234".into(),
        groups: vec!["devs".into(), "system:authenticated".into(), "a,b".into()],
        extra,
    };
    let mut h = map(&[("accept", "*/*")]);
    set_identity_headers(&mut h, &user).unwrap();
    let values =
        |n: &str| -> Vec<&str> { h.get_all(n).iter().map(|v| v.to_str().unwrap()).collect() };
    assert_eq!(values("x-remote-user"), ["alice@example.com"]);
    assert_eq!(values("x-remote-uid"), ["1234"]);
    assert_eq!(
        values("x-remote-group"),
        ["devs", "system:authenticated", "a,b"]
    );
    assert_eq!(values("x-remote-extra-scopes"), ["view", "edit"]);
    assert_eq!(values("accept"), ["*/*"]);
    assert!(!h.contains_key("x-remote-extra-empty"));
}

#[test]
fn identity_headers_omit_empty_uid_and_carry_utf8() {
    let user = User {
        name: "zoë".into(),
        ..User::default()
    };
    let mut h = HeaderMap::new();
    set_identity_headers(&mut h, &user).unwrap();
    assert_eq!(h["x-remote-user"].as_bytes(), "zoë".as_bytes());
    assert!(!h.contains_key("x-remote-uid"));
    assert!(!h.contains_key("x-remote-group"));
}

#[test]
fn identity_values_that_cannot_travel_are_errors() {
    let bad = |f: fn(&mut User)| {
        let mut user = User {
            name: "alice".into(),
            ..User::default()
        };
        f(&mut user);
        set_identity_headers(&mut HeaderMap::new(), &user).unwrap_err()
    };
    assert_eq!(bad(|u| u.name = "al\nice".into()).header, "X-Remote-User");
    assert_eq!(
        bad(|u| u.name = " system:admin".into()).header,
        "X-Remote-User"
    );
    assert_eq!(bad(|u| u.uid = "1\r\n".into()).header, "X-Remote-Uid");
    assert_eq!(
        bad(|u| u.groups = vec!["ok".into(), "g\0".into()]).header,
        "X-Remote-Group"
    );
    assert_eq!(
        bad(|u| u.groups = vec!["trailing\t".into()]).header,
        "X-Remote-Group"
    );
    assert_eq!(
        bad(|u| {
            u.extra.insert("k".into(), vec!["v\x7f".into()]);
        })
        .header,
        "X-Remote-Extra-*"
    );
    let err = bad(|u| u.name = "secret\nvalue".into());
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// Go's `url.PathUnescape` after `strings.ToLower`, as Kubernetes' requestheader
/// authenticator applies it to the header name suffix.
fn kubernetes_unescape(suffix: &str) -> Vec<u8> {
    let lower = suffix.to_ascii_lowercase();
    let b = lower.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn extra_keys_round_trip_through_the_requestheader_authenticator() {
    let table = [
        ("scopes", "scopes"),
        (
            "authentication.kubernetes.io/credential-id",
            "authentication.kubernetes.io%2Fcredential-id",
        ),
        ("100%", "100%25"),
        ("a b", "a%20b"),
        ("Key", "%4Bey"),
        ("é", "%C3%A9"),
        ("x!#$&'*+-.^_`|~", "x!#$&'*+-.^_`|~"),
        ("", ""),
    ];
    for (key, escaped) in table {
        assert_eq!(escape_extra_key(key), escaped, "{key}");
        let mut h = HeaderMap::new();
        let user = User {
            name: "u".into(),
            extra: BTreeMap::from([(key.to_owned(), vec!["v".to_owned()])]),
            ..User::default()
        };
        set_identity_headers(&mut h, &user).unwrap();
        let name = h
            .keys()
            .find(|n| n.as_str().starts_with(X_REMOTE_EXTRA_PREFIX))
            .unwrap();
        let suffix = &name.as_str()[X_REMOTE_EXTRA_PREFIX.len()..];
        assert_eq!(kubernetes_unescape(suffix), key.as_bytes(), "{key}");
    }
}

/// The shortcut that skips hygiene when no header needs it must never skip a header that does:
/// every name the hygiene acts on, alone or beside ordinary headers, in requests and responses,
/// comes out exactly as the full routine leaves it.
#[test]
fn skipping_hygiene_when_nothing_needs_it_changes_no_outcome() {
    let names = [
        "connection",
        "upgrade",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "authorization",
        "sec-websocket-protocol",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-remote-user",
        "x_remote_group",
        "impersonate-user",
        "impersonate_extra-scopes",
        "x-conn",
        "accept",
        "user-agent",
    ];
    let values = [
        "x-conn",
        "base64url.bearer.authorization.k8s.io.dG9rZW4, v4.channel.k8s.io",
        "1",
    ];
    for name in names {
        for value in values {
            for upgrade in [false, true] {
                let input = map(&[("accept", "*/*"), (name, value), ("x-conn", "kept?")]);
                type Sanitize = fn(&mut HeaderMap, bool);
                let sides: [(&str, Sanitize, Sanitize); 2] = [
                    ("request", sanitize_request_headers, strip_request_headers),
                    ("response", sanitize_response_headers, strip_hop_by_hop),
                ];
                for (side, sanitize, strip) in sides {
                    let (mut fast, mut full) = (input.clone(), input.clone());
                    sanitize(&mut fast, upgrade);
                    strip(&mut full, upgrade);
                    assert_eq!(
                        pairs(&fast),
                        pairs(&full),
                        "{side} {name}: {value} {upgrade}"
                    );
                }
            }
        }
    }
}
