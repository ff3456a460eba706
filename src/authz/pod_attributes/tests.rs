//! The container routes as data: each row of the kubelet's route table, and what is not one.

use super::*;

/// The pod-level attributes expected: verb, namespace, pod, label.
type Expected = Option<(&'static str, &'static str, &'static str, &'static str)>;

/// `(method, path, expected)`.
const CASES: &[(&str, &str, Expected)] = &[
    (
        "GET",
        "/containerLogs/team-a/web-0/nginx",
        Some(("get", "team-a", "web-0", "pods/log")),
    ),
    ("POST", "/containerLogs/team-a/web-0/nginx", None),
    ("GET", "/containerLogs/team-a/web-0", None),
    ("GET", "/containerLogs/team-a/web-0/nginx/extra", None),
    (
        "GET",
        "/exec/team-a/web-0/nginx",
        Some(("create", "team-a", "web-0", "pods/exec")),
    ),
    (
        "POST",
        "/exec/team-a/web-0/nginx",
        Some(("create", "team-a", "web-0", "pods/exec")),
    ),
    (
        "POST",
        "/exec/team-a/web-0/4f9c2b1e-0000-4000-8000-000000000001/nginx",
        Some(("create", "team-a", "web-0", "pods/exec")),
    ),
    ("PUT", "/exec/team-a/web-0/nginx", None),
    ("DELETE", "/exec/team-a/web-0/nginx", None),
    ("GET", "/exec/team-a/web-0", None),
    ("GET", "/exec/team-a/web-0/a/b/c", None),
    (
        "GET",
        "/attach/team-a/web-0/nginx",
        Some(("create", "team-a", "web-0", "pods/attach")),
    ),
    (
        "POST",
        "/portForward/team-a/web-0",
        Some(("create", "team-a", "web-0", "pods/portforward")),
    ),
    (
        "GET",
        "/portForward/team-a/web-0/4f9c2b1e",
        Some(("create", "team-a", "web-0", "pods/portforward")),
    ),
    ("GET", "/portForward/team-a", None),
    (
        "POST",
        "/run/team-a/web-0/nginx",
        Some(("create", "team-a", "web-0", "pods/exec")),
    ),
    ("GET", "/run/team-a/web-0/nginx", None),
    // Pod names are subdomains: dots allowed; namespaces are labels: no dots.
    (
        "GET",
        "/exec/team-a/web.v2-0/nginx",
        Some(("create", "team-a", "web.v2-0", "pods/exec")),
    ),
    ("GET", "/exec/team.a/web-0/nginx", None),
    // Names the API server could not hold: no pod-level attributes at all.
    ("GET", "/exec/Team-A/web-0/nginx", None),
    ("GET", "/exec/team-a/*/nginx", None),
    ("GET", "/exec/-team/web-0/nginx", None),
    ("GET", "/exec/team-a/web-/nginx", None),
    ("GET", "/exec/team-a/web..0/nginx", None),
    ("GET", "/exec/team-a/web 0/nginx", None),
    ("GET", "/exec//web-0/nginx", None),
    ("GET", "/exec/team-a/web-0/nginx/", None),
    // Prefixes are whole segments.
    ("GET", "/execute/team-a/web-0/nginx", None),
    ("GET", "/exec", None),
    ("GET", "/checkpoint/team-a/web-0/nginx", None),
    ("GET", "/pods", None),
    ("GET", "/stats/summary", None),
];

#[test]
fn container_routes_map_to_the_api_servers_pod_attributes() {
    for (method, path, want) in CASES {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let got = pod_attributes(&method, path).map(|a| (a.verb, a.namespace, a.pod, a.label));
        assert_eq!(got, *want, "{method} {path}");
        if let Some(attrs) = pod_attributes(&method, path) {
            assert_eq!(attrs.label, format!("pods/{}", attrs.subresource));
        }
    }
}

#[test]
fn names_longer_than_the_api_server_allows_have_no_pod_attributes() {
    let namespace = "n".repeat(64);
    assert_eq!(
        pod_attributes(&Method::GET, &format!("/exec/{namespace}/p/c")),
        None
    );
    assert!(pod_attributes(&Method::GET, &format!("/exec/{}/p/c", &namespace[1..])).is_some());
    let pod = [
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(62),
    ]
    .join(".");
    assert_eq!(pod.len(), 254);
    assert_eq!(
        pod_attributes(&Method::GET, &format!("/exec/ns/{pod}/c")),
        None
    );
    assert!(pod_attributes(&Method::GET, &format!("/exec/ns/{}/c", &pod[1..])).is_some());
}
