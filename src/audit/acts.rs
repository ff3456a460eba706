//! Which requests *act*: run code in a container, open a stream into one, or change something on
//! the node. Their audit events are the evidence an operator looks for after an incident, so the
//! audit log treats them apart: never suppressed by a flood budget, never omitted by a policy
//! file, cut rather than dropped when too large, and refused before the upgrade when they cannot
//! be written.
//!
//! A request acts when its method is anything but `GET` or `HEAD` (the kubelet's `/run`,
//! `/checkpoint` and any future write), or when its path is below `/exec`, `/attach`,
//! `/portForward`, `/run` or `/checkpoint`, whatever the method: a WebSocket exec is a `GET`.

use http::Method;

use crate::authz::attributes::is_subpath;

/// The kubelet paths that act whatever the method.
const ACTING_PATHS: [&str; 5] = ["/exec", "/attach", "/portForward", "/run", "/checkpoint"];

/// Whether a request with `method` on `path` acts. `path` must be the decoded, canonical path the
/// request was authorized on ([`crate::request::canonical_path`]), so that no spelling of an exec
/// path escapes.
pub fn is_act(method: &Method, path: &str) -> bool {
    (method != Method::GET && method != Method::HEAD)
        || ACTING_PATHS.iter().any(|prefix| is_subpath(path, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_writes_act_reads_do_not() {
        for path in [
            "/exec/ns/pod/ctr",
            "/attach/ns/pod/ctr",
            "/portForward/ns/pod",
            "/run/ns/pod/ctr",
            "/checkpoint/ns/pod/ctr",
            "/exec",
        ] {
            assert!(is_act(&Method::GET, path), "GET {path}");
            assert!(is_act(&Method::POST, path), "POST {path}");
        }
        for path in [
            "/healthz",
            "/stats/summary",
            "/containerLogs/ns/pod/ctr",
            "/execx",
        ] {
            assert!(!is_act(&Method::GET, path), "GET {path}");
            assert!(!is_act(&Method::HEAD, path), "HEAD {path}");
            assert!(is_act(&Method::POST, path), "POST {path}");
            assert!(is_act(&Method::DELETE, path), "DELETE {path}");
        }
    }
}
