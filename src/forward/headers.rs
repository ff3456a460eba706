//! Header hygiene between the caller and the kubelet: hop-by-hop headers, client-supplied
//! credentials and client-supplied identity are removed on the way up, hop-by-hop headers on the
//! way down, and our own identity headers are set only when configured. Pure functions, no I/O.

use http::header::{
    AUTHORIZATION, CONNECTION, HeaderMap, HeaderName, HeaderValue, PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};

use crate::authn::User;
use crate::base::wire;

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
/// `Connection` and `Upgrade` are handled separately because an upgrade keeps them. A `static`,
/// not a `const`: a `const` array is built anew (and dropped) at every use, which cost seven
/// header names per header compared, on every request and response.
static HOP_BY_HOP: [HeaderName; 7] = [
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
    if upgrade || headers.keys().any(removed_from_requests) {
        strip_request_headers(headers, upgrade);
    }
}

/// [`sanitize_request_headers`] without the check that there is anything to do.
fn strip_request_headers(headers: &mut HeaderMap, upgrade: bool) {
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
    if switched || headers.keys().any(is_hop_by_hop) {
        strip_hop_by_hop(headers, switched);
    }
}

/// Whether [`sanitize_request_headers`] removes or rewrites a header of this name (or, for
/// `Connection`, of the names it lists). Most requests carry none, and one pass comparing names
/// costs far less than looking each one up to remove it (measured under callgrind: the
/// removals were about 4,000 instructions per forwarded request).
fn removed_from_requests(name: &HeaderName) -> bool {
    is_hop_by_hop(name)
        || name == AUTHORIZATION
        || name == SEC_WEBSOCKET_PROTOCOL
        || METHOD_OVERRIDES.contains(&name.as_str())
        || is_identity_header(name)
}

/// `Connection`, `Upgrade` and the [`HOP_BY_HOP`] headers.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION || name == UPGRADE || HOP_BY_HOP.contains(name)
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
            // `keep-alive`, the usual option, names a header removed below anyway.
            .filter(|t| !t.eq_ignore_ascii_case(b"keep-alive"))
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .filter(|n| !(keep_upgrade && n == UPGRADE))
            .collect();
        for name in named {
            headers.remove(name);
        }
        headers.remove(CONNECTION);
    }
    // Only the names present are looked up again to be removed (a response usually carries
    // one, `Connection: keep-alive`, handled above); allocates only when there is one.
    let present: Vec<HeaderName> = headers
        .keys()
        .filter(|n| HOP_BY_HOP.contains(n) || (!keep_upgrade && *n == UPGRADE))
        .cloned()
        .collect();
    for name in present {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    }
}

/// Removes every header whose name starts with one of [`IDENTITY_PREFIXES`], reading `_` as `-`.
/// Names in `http` are lowercase, so this is case-insensitive on the wire.
fn strip_identity_headers(headers: &mut HeaderMap) {
    if !headers.keys().any(is_identity_header) {
        return;
    }
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_identity_header(n))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Whether the name starts with one of [`IDENTITY_PREFIXES`], reading `_` as `-`.
fn is_identity_header(name: &HeaderName) -> bool {
    let name = name.as_str().as_bytes();
    IDENTITY_PREFIXES.iter().any(|prefix| {
        name.len() >= prefix.len()
            && name
                .iter()
                .zip(prefix.bytes())
                .all(|(&c, p)| c == p || (c == b'_' && p == b'-'))
    })
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
mod tests;
