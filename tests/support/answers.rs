//! The proxy's refusals as the kubelet words them, asserted in one place: the 401, the 403 naming
//! the user, verb and subresources asked, and the 500 of an authorization that failed.

use http::StatusCode;

use super::client::Reply;

/// The body of the kubelet's 403 for `user` asking `verb` on the subresources `subresources`
/// (space-separated, in the order they were tried).
pub fn forbidden_body(user: &str, verb: &str, subresources: &str) -> String {
    format!(
        "Forbidden (user={user}, verb={verb}, resource=nodes, subresource(s)=[{subresources}])\n"
    )
}

/// Asserts the kubelet's 403 for `user`, `verb` and `subresources`, as plain text.
pub fn assert_forbidden(reply: &Reply, user: &str, verb: &str, subresources: &str) {
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    assert_eq!(reply.text(), forbidden_body(user, verb, subresources));
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
}

/// Asserts the kubelet's 401 (`what` names the case in a failure).
pub fn assert_unauthorized(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        StatusCode::UNAUTHORIZED,
        "{what}: {}",
        reply.text()
    );
    assert_eq!(reply.text(), "Unauthorized", "{what}");
}

/// Asserts the kubelet's 500 for an authorization of `user`, `verb` and `subresource` that could
/// not be decided (the API server failed, a match condition errored).
pub fn assert_authorization_error(reply: &Reply, user: &str, verb: &str, subresource: &str) {
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    assert_eq!(
        reply.text(),
        format!(
            "Authorization error (user={user}, verb={verb}, resource=nodes, subresource={subresource})"
        )
    );
}
