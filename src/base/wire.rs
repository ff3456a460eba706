//! HTTP and WebSocket protocol knowledge that authentication, authorization and forwarding share:
//! list-valued header parsing, what makes a request an upgrade, the bearer-token WebSocket
//! subprotocol, and the longest path and request head accepted.
//! One definition each, so the authenticator and the header hygiene cannot drift apart.

use http::Version;
use http::header::{CONNECTION, HeaderMap, HeaderName, SEC_WEBSOCKET_PROTOCOL, UPGRADE};

/// The longest raw request path accepted, in bytes: the path gate
/// ([`crate::request::canonical_path`]) refuses longer ones, and the cost model of match
/// conditions ([`crate::authz::match_conditions`]) counts on it. Kubelet paths are short (the
/// longest real ones, `/exec/{ns}/{pod}/{uid}/{container}`, stay under 400 bytes); 8 KiB leaves
/// room for long log file names while bounding the work and memory one request can cost.
pub const MAX_PATH_LEN: usize = 8 * 1024;

/// The most bytes of an HTTP/1.1 request head (request line and headers) the server reads before
/// refusing the request (hyper's default read buffer, set explicitly by
/// [`crate::server::http_server`] so that it cannot change under what counts on it): no header,
/// and so no bearer token, is longer. Authentication's expressions over a token's claims are
/// priced for the largest token this allows.
pub const MAX_REQUEST_HEAD_BYTES: usize = 8192 + 4096 * 100;

/// The most bytes of an HTTP/2 request's header list the server accepts (hyper's default
/// `SETTINGS_MAX_HEADER_LIST_SIZE`, set explicitly by [`crate::server::http_server`]), below
/// [`MAX_REQUEST_HEAD_BYTES`].
pub const MAX_HTTP2_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// The `Sec-WebSocket-Protocol` entry prefix Kubernetes clients use to carry a bearer token on a
/// WebSocket handshake (browsers cannot set `Authorization`); the rest of the entry is the token,
/// unpadded base64url (k8s.io/apiserver v0.33 `pkg/authentication/request/websocket/protocol.go`).
pub const WEBSOCKET_BEARER_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// The elements of a comma-separated list header (`Connection`, `Upgrade`,
/// `Sec-WebSocket-Protocol`) over all its values, trimmed of ASCII whitespace, empty ones
/// skipped. Bytes, not strings: a value with non-ASCII bytes still has its ASCII elements read.
pub fn list_elements<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether `Connection` names `upgrade` (case-insensitively).
pub fn connection_has_upgrade(headers: &HeaderMap) -> bool {
    list_elements(headers, &CONNECTION).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
}

/// Whether `headers` ask for an HTTP/1.1 protocol upgrade (WebSocket or SPDY for exec, attach and
/// portForward): `Connection` names `upgrade` and an `Upgrade` header is present.
///
/// Only HTTP/1.1 has this mechanism; HTTP/2 forbids both headers, so an HTTP/2 request is never
/// an upgrade here.
pub fn is_upgrade_request(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11 && headers.contains_key(UPGRADE) && connection_has_upgrade(headers)
}

/// Go's `wsstream.IsWebSocketRequest`: an upgrade request whose `Upgrade` is `websocket`.
pub fn is_websocket_upgrade(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11
        && connection_has_upgrade(headers)
        && headers
            .get(UPGRADE)
            .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"))
}

/// The entries of `Sec-WebSocket-Protocol`, in order.
pub fn websocket_protocols(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    list_elements(headers, &SEC_WEBSOCKET_PROTOCOL)
}

/// The encoded token of a bearer-token subprotocol entry, matched exactly as Kubernetes'
/// authenticator does (case-sensitive prefix), or `None` for any other protocol.
pub fn bearer_protocol_token(entry: &[u8]) -> Option<&[u8]> {
    entry.strip_prefix(WEBSOCKET_BEARER_PREFIX.as_bytes())
}

/// Whether an entry looks like a bearer-token subprotocol in any letter case: what is stripped
/// before forwarding, wider than [`bearer_protocol_token`] on purpose, so a credential in an
/// unusual spelling does not reach the kubelet either.
pub fn resembles_bearer_protocol(entry: &[u8]) -> bool {
    entry
        .get(..WEBSOCKET_BEARER_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(WEBSOCKET_BEARER_PREFIX.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append((*name).clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn list_elements_span_values_and_skip_empty_ones() {
        let h = headers(&[(&CONNECTION, " keep-alive ,, Upgrade"), (&CONNECTION, "te")]);
        let got: Vec<&[u8]> = list_elements(&h, &CONNECTION).collect();
        assert_eq!(got, [&b"keep-alive"[..], b"Upgrade", b"te"]);
        assert!(connection_has_upgrade(&h));
    }

    #[test]
    fn websocket_upgrades_only_on_http_1_1_with_both_headers() {
        let ws = headers(&[(&CONNECTION, "Upgrade"), (&UPGRADE, " WebSocket ")]);
        assert!(is_websocket_upgrade(Version::HTTP_11, &ws));
        assert!(is_upgrade_request(Version::HTTP_11, &ws));
        assert!(!is_websocket_upgrade(Version::HTTP_2, &ws));
        let spdy = headers(&[(&CONNECTION, "upgrade"), (&UPGRADE, "SPDY/3.1")]);
        assert!(!is_websocket_upgrade(Version::HTTP_11, &spdy));
        assert!(is_upgrade_request(Version::HTTP_11, &spdy));
        let no_connection = headers(&[(&UPGRADE, "websocket")]);
        assert!(!is_websocket_upgrade(Version::HTTP_11, &no_connection));
    }

    #[test]
    fn the_bearer_prefix_is_exact_for_authentication_and_wide_for_stripping() {
        let exact = b"base64url.bearer.authorization.k8s.io.dG9r";
        let shouted = b"Base64URL.Bearer.Authorization.K8s.io.dG9r";
        assert_eq!(bearer_protocol_token(exact), Some(&b"dG9r"[..]));
        assert_eq!(bearer_protocol_token(shouted), None);
        assert!(resembles_bearer_protocol(exact) && resembles_bearer_protocol(shouted));
        assert!(!resembles_bearer_protocol(b"v5.channel.k8s.io"));
    }
}
