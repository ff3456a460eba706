//! Header hygiene between the caller and the kubelet: hop-by-hop headers, client-supplied
//! credentials and client-supplied identity are removed on the way up, hop-by-hop headers on the
//! way down, and our own identity headers are set only when configured. Pure functions, no I/O.

use http::header::{
    AUTHORIZATION, CONNECTION, HeaderMap, HeaderName, HeaderValue, PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};

use crate::authn::User;
use crate::wire;

/// `X-Remote-User`: the authenticated user name, as Kubernetes' requestheader authenticator reads it.
pub const X_REMOTE_USER: HeaderName = HeaderName::from_static("x-remote-user");
/// `X-Remote-Uid`: the user's UID (sent only when non-empty).
pub const X_REMOTE_UID: HeaderName = HeaderName::from_static("x-remote-uid");
/// `X-Remote-Group`: one header per group, in the user's group order.
pub const X_REMOTE_GROUP: HeaderName = HeaderName::from_static("x-remote-group");
/// Prefix of the `X-Remote-Extra-<key>` headers (lowercase, as `http` stores names).
pub const X_REMOTE_EXTRA_PREFIX: &str = "x-remote-extra-";

/// Prefixes of header names that carry an identity the kubelet (or anything that trusts a front
/// proxy) could believe: `X-Remote-*` (requestheader authentication) and `Impersonate-*`.
/// A caller must never be able to send them through us. Names are compared with `_` read as `-`
/// (and case folded, as `http` stores names lowercase), because some servers and CGI-style
/// gateways read `X_Remote_User` as `X-Remote-User`.
const IDENTITY_PREFIXES: [&str; 2] = ["x-remote-", "impersonate-"];

/// Headers that ask a server to treat the request as another method than the one authorized
/// (frameworks honour them); the kubelet must see the method that was authorized, only that.
const METHOD_OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Hop-by-hop headers (RFC 9110 §7.6.1 plus the legacy `Keep-Alive` and `Proxy-Connection`):
/// they describe one connection, never the end-to-end message, so a proxy must not forward them.
/// `Connection` and `Upgrade` are handled separately because an upgrade keeps them.
const HOP_BY_HOP: [HeaderName; 7] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    PROXY_AUTHORIZATION,
    PROXY_AUTHENTICATE,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
];

/// Why identity headers could not be set: a user attribute that no header value can carry
/// faithfully. Names the header, never the value (the value may be sensitive and goes to logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the user's {header} cannot be sent as a header value")]
pub struct IdentityHeaderError {
    /// The header the value was meant for, e.g. `X-Remote-Group`.
    pub header: &'static str,
}

/// Prepares caller headers for the kubelet.
///
/// Removes every hop-by-hop header and every header named in `Connection`, except that an
/// upgrade request keeps `Upgrade` and gets exactly `Connection: Upgrade`; removes
/// `Authorization`, every `X-Remote-*` and `Impersonate-*` header in any spelling with `_` for
/// `-`, bearer-token entries of `Sec-WebSocket-Protocol`, and method-override headers, so no
/// client-supplied credential, identity or other method reaches the kubelet. Identity headers,
/// when wanted, are added afterwards by [`set_identity_headers`].
pub fn sanitize_request_headers(headers: &mut HeaderMap, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    headers.remove(AUTHORIZATION);
    strip_identity_headers(headers);
    for name in METHOD_OVERRIDES {
        headers.remove(name);
    }
    strip_websocket_bearer_tokens(headers);
}

/// Whether an HTTP/1.1 upgrade request may be upgraded: only an exec, attach or portForward
/// handshake (the kubelet upgrades nothing else) asking for WebSocket or SPDY/3.1 (what kubectl
/// and the API server speak). Any other `Upgrade` is removed and the request forwarded as a plain
/// one, so no tunnel can open past the proxy's authorization on another path or protocol.
pub fn may_upgrade(path: &str, headers: &HeaderMap) -> bool {
    const STREAMING_PREFIXES: [&str; 3] = ["/exec/", "/attach/", "/portForward/"];
    const PROTOCOLS: [&[u8]; 2] = [b"websocket", b"SPDY/3.1"];
    let streaming = STREAMING_PREFIXES.iter().any(|p| path.starts_with(p));
    let mut offered = wire::list_elements(headers, &UPGRADE);
    let protocol_known = match (offered.next(), offered.next()) {
        (Some(protocol), None) => PROTOCOLS.iter().any(|p| protocol.eq_ignore_ascii_case(p)),
        _ => false,
    };
    streaming && protocol_known
}

/// Prepares kubelet response headers for the caller: removes every hop-by-hop header and every
/// header named in `Connection`, except that a `101 Switching Protocols` answer to an upgrade
/// (`switched`) keeps `Upgrade` and gets exactly `Connection: Upgrade`.
pub fn sanitize_response_headers(headers: &mut HeaderMap, switched: bool) {
    strip_hop_by_hop(headers, switched);
}

/// Sets `X-Remote-User`, `X-Remote-Uid` (when non-empty), one `X-Remote-Group` per group and one
/// `X-Remote-Extra-<escaped key>` per extra value, replacing any header of those names.
///
/// Call it only after [`sanitize_request_headers`], which removed every caller-supplied
/// `X-Remote-*` header. Fails, instead of sending something else, when a value cannot travel as a
/// header value exactly: control characters are not allowed in a header, and leading or trailing
/// whitespace would be trimmed by the receiver, silently changing the identity.
pub fn set_identity_headers(
    headers: &mut HeaderMap,
    user: &User,
) -> Result<(), IdentityHeaderError> {
    headers.insert(X_REMOTE_USER, identity_value(&user.name, "X-Remote-User")?);
    if !user.uid.is_empty() {
        headers.insert(X_REMOTE_UID, identity_value(&user.uid, "X-Remote-Uid")?);
    }
    for group in &user.groups {
        headers.append(X_REMOTE_GROUP, identity_value(group, "X-Remote-Group")?);
    }
    for (key, values) in &user.extra {
        if values.is_empty() {
            continue;
        }
        let name = extra_header_name(key)?;
        for value in values {
            headers.append(name.clone(), identity_value(value, "X-Remote-Extra-*")?);
        }
    }
    Ok(())
}

/// Percent-encodes an extra key for an `X-Remote-Extra-` header name, so that Kubernetes'
/// requestheader authenticator, which lowercases the name suffix and then `url.PathUnescape`s it,
/// gets the key back exactly.
///
/// Like client-go, every byte that is not an HTTP token character, and `%` itself, becomes `%XX`.
/// Unlike client-go, ASCII capitals are escaped too: the receiver lowercases the name before
/// unescaping, so escaping is the only way a capital in a key survives.
pub fn escape_extra_key(key: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(key.len());
    for &b in key.as_bytes() {
        if is_token_byte(b) && b != b'%' && !b.is_ascii_uppercase() {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

/// The header name `x-remote-extra-<escaped key>`.
fn extra_header_name(key: &str) -> Result<HeaderName, IdentityHeaderError> {
    let mut name = String::with_capacity(X_REMOTE_EXTRA_PREFIX.len() + key.len());
    name.push_str(X_REMOTE_EXTRA_PREFIX);
    name.push_str(&escape_extra_key(key));
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| IdentityHeaderError {
        header: "X-Remote-Extra-*",
    })
}

/// A header value carrying `value` byte for byte (UTF-8 included, as Go's HTTP stack passes it),
/// or an error when the receiver could not read the same string back.
fn identity_value(value: &str, header: &'static str) -> Result<HeaderValue, IdentityHeaderError> {
    let trimmed_by_receiver = value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']);
    if trimmed_by_receiver {
        return Err(IdentityHeaderError { header });
    }
    HeaderValue::from_bytes(value.as_bytes()).map_err(|_| IdentityHeaderError { header })
}

/// RFC 9110 `tchar`: the bytes allowed in a header name.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Removes hop-by-hop headers; with `keep_upgrade`, keeps `Upgrade` and sets `Connection: Upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Names listed in `Connection` are hop-by-hop too; they must be read before it is removed.
    // Allocates only when the header is present (HTTP/1.x; HTTP/2 forbids it).
    if headers.contains_key(CONNECTION) {
        let named: Vec<HeaderName> = wire::list_elements(headers, &CONNECTION)
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .filter(|n| !(keep_upgrade && n == UPGRADE))
            .collect();
        for name in named {
            headers.remove(name);
        }
        headers.remove(CONNECTION);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    } else {
        headers.remove(UPGRADE);
    }
}

/// Removes every header whose name starts with one of [`IDENTITY_PREFIXES`], reading `_` as `-`.
/// Names in `http` are lowercase, so this is case-insensitive on the wire.
fn strip_identity_headers(headers: &mut HeaderMap) {
    let is_identity = |n: &HeaderName| {
        let name = n.as_str().as_bytes();
        IDENTITY_PREFIXES.iter().any(|prefix| {
            name.len() >= prefix.len()
                && name
                    .iter()
                    .zip(prefix.bytes())
                    .all(|(&c, p)| c == p || (c == b'_' && p == b'-'))
        })
    };
    if !headers.keys().any(is_identity) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|n| is_identity(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Drops bearer-token entries from `Sec-WebSocket-Protocol`, keeping the other protocols in
/// order (one joined header), and the header itself when nothing else is left.
fn strip_websocket_bearer_tokens(headers: &mut HeaderMap) {
    if !wire::list_elements(headers, &SEC_WEBSOCKET_PROTOCOL).any(wire::resembles_bearer_protocol) {
        return;
    }
    let kept: Vec<&[u8]> = wire::list_elements(headers, &SEC_WEBSOCKET_PROTOCOL)
        .filter(|t| !wire::resembles_bearer_protocol(t))
        .collect();
    let joined = kept.join(&b", "[..]);
    // The kept tokens come from valid header values, so the joined bytes are valid too; should
    // that ever fail, dropping the header is the safe outcome.
    let value = (!joined.is_empty())
        .then(|| HeaderValue::from_bytes(&joined).ok())
        .flatten();
    match value {
        Some(v) => {
            headers.insert(SEC_WEBSOCKET_PROTOCOL, v);
        }
        None => {
            headers.remove(SEC_WEBSOCKET_PROTOCOL);
        }
    }
}

#[cfg(test)]
mod tests {
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
        let cases: [(&str, bool, Pairs, Pairs); 3] = [
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
}
