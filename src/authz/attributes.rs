//! Kubelet request → authorizer attributes: the HTTP method gives the verb and the percent-decoded
//! path gives the ordered list of `nodes/<subresource>` names, as the kubelet's auth filter does
//! (kubernetes v1.33 `pkg/kubelet/server/auth.go` `GetRequestAttributes` and `isSubpath`; the cases
//! it must match are `tests/data/kubelet-vectors.json`). The path mapping is data: a new kubelet
//! path is one row in a table.

use std::fmt;
use std::slice;

use http::Method;

use crate::authn::User;
use crate::authz::Attributes;

/// The Kubernetes verb for an HTTP method, compared exactly as the kubelet does.
///
/// Only the five upper-case methods map; everything else (`HEAD`, `OPTIONS`, `CONNECT`, a
/// lower-case
/// `get`, …) is the empty verb, which RBAC only matches with a `*` verb rule. Mapping `HEAD` to
/// `get` (as the upstream docs claim) would grant more than the kubelet does.
pub fn verb_for_method(method: &Method) -> &'static str {
    if method == Method::GET {
        "get"
    } else if method == Method::POST {
        "create"
    } else if method == Method::PUT {
        "update"
    } else if method == Method::PATCH {
        "patch"
    } else if method == Method::DELETE {
        "delete"
    } else {
        ""
    }
}

/// Every verb the kubelet ever asks about: [`verb_for_method`] of each method it maps. For tools
/// that check policies against what the kubelet asks (`explain`).
pub fn kubelet_verbs() -> [&'static str; 5] {
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
    ]
    .map(|method| verb_for_method(&method))
}

/// The kubelet's `isSubpath`: `subpath` is `path` or lies below it on a segment boundary.
///
/// One trailing `/` of `path` is ignored, so `/stats/` matches `/stats` and `/stats/summary` but
/// not `/statsx`. The comparison is byte-exact and case-sensitive, and nothing is cleaned: callers
/// must only pass paths that [`crate::request::canonical_path`] accepted, or `..` segments could
/// walk out.
pub fn is_subpath(subpath: &str, path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    match subpath.strip_prefix(path) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// One row of a path table: requests below `prefix` are checked against `nodes/<subresource>`.
#[derive(Debug)]
struct PathRule {
    prefix: &'static str,
    subresource: &'static str,
}

/// One kubelet version's two-step path mapping, copied whole so each table reads as that version's
/// source. Step 1 (fine-grained, optional) yields at most one entry, step 2 always exactly one; in
/// each, the first matching row wins. In every table `/logs/` maps to the singular `log`, and
/// `/checkpoint/` is mapped whether or not the kubelet's checkpoint gate is on.
#[derive(Debug)]
struct PathTable {
    /// Checked only with `KubeletFineGrainedAuthz`; its prefixes never overlap `coarse`.
    fine_grained: &'static [PathRule],
    /// Always checked; a path matching no row is [`FALLBACK_SUBRESOURCE`].
    coarse: &'static [PathRule],
}

const fn rule(prefix: &'static str, subresource: &'static str) -> PathRule {
    PathRule {
        prefix,
        subresource,
    }
}

/// The subresource of every path no table row claims (exec, containerLogs, pprof, …).
const FALLBACK_SUBRESOURCE: &str = "proxy";

/// The kubelet of 1.33–1.35 (read in source): `/statusz` is fine-grained with a `proxy`
/// fallback, `/flagz` is plain `proxy`. `/runningpods/` is lower-case, as the kubelet registers it.
static KUBELET_1_33: PathTable = PathTable {
    fine_grained: &[
        rule("/pods", "pods"),
        rule("/healthz", "healthz"),
        rule("/configz", "configz"),
        rule("/statusz", "statusz"),
        rule("/runningpods/", "pods"),
    ],
    coarse: &[
        rule("/stats/", "stats"),
        rule("/metrics", "metrics"),
        rule("/logs/", "log"),
        rule("/checkpoint/", "checkpoint"),
    ],
};

/// Recent kubelet master (reported, not read in source): `/statusz` → `statusz` and `/flagz` →
/// `configz` in step 2, so they are checked whatever the gate and without a `proxy` fallback.
static KUBELET_STANDALONE_STATUSZ_FLAGZ: PathTable = PathTable {
    fine_grained: &[
        rule("/pods", "pods"),
        rule("/healthz", "healthz"),
        rule("/configz", "configz"),
        rule("/runningpods/", "pods"),
    ],
    coarse: &[
        rule("/stats/", "stats"),
        rule("/metrics", "metrics"),
        rule("/logs/", "log"),
        rule("/checkpoint/", "checkpoint"),
        rule("/statusz", "statusz"),
        rule("/flagz", "configz"),
    ],
};

/// Paths that run code in or open a stream into a container. With
/// [`AttributeMapping::exec_requires_create`] they need verb `create` whatever the method.
static CREATE_ONLY_PREFIXES: &[&str] = &["/exec", "/attach", "/portForward", "/run"];

fn first_match(rules: &'static [PathRule], path: &str) -> Option<&'static str> {
    rules
        .iter()
        .find(|rule| is_subpath(path, rule.prefix))
        .map(|rule| rule.subresource)
}

/// How requests map to attributes: which kubelet behaviour to reproduce, and where to be stricter.
///
/// Chosen once at start-up; [`kubelet_attributes`] only reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttributeMapping {
    /// The kubelet's `KubeletFineGrainedAuthz` gate: check `nodes/pods`, `nodes/healthz`,
    /// `nodes/configz` (and, per table, `nodes/statusz`) before falling back to `nodes/proxy`.
    /// Off reproduces kubelets without the gate (before 1.32, or with it off), where those paths
    /// need `nodes/proxy` only.
    pub fine_grained: bool,
    /// Use the path table of recent kubelet master: `/statusz` needs `nodes/statusz` and `/flagz`
    /// needs `nodes/configz`, with no `nodes/proxy` fallback and regardless of `fine_grained`.
    /// Off uses the 1.33–1.35 table, which was read in the kubelet's source.
    pub standalone_statusz_flagz: bool,
    /// Give requests to `/exec`, `/attach`, `/portForward` and `/run` (and below) verb `create`
    /// whatever the HTTP method. The kubelet authorizes a WebSocket handshake (a `GET`) as `get`,
    /// so `get nodes/proxy`, a read permission, would be enough to run commands in any container.
    /// Off reproduces the kubelet exactly.
    pub exec_requires_create: bool,
    /// After the kubelet's own sets, also ask about the pod a container path names, with the
    /// attributes the API server checks for the same operation (`get pods/log`,
    /// `create pods/exec`, … in the pod's namespace): see [`super::pod_attributes`]. Off by
    /// default: it lets namespace-scoped grants (`edit`, `admin`) reach the kubelet.
    pub pod_scoped: bool,
}

impl Default for AttributeMapping {
    /// The proxy's defaults: fine-grained checks on, the source-verified path table, and
    /// `create` for exec-like paths.
    fn default() -> Self {
        Self {
            fine_grained: true,
            standalone_statusz_flagz: false,
            exec_requires_create: true,
            pod_scoped: false,
        }
    }
}

impl AttributeMapping {
    /// Every subresource a request can be asked about under this mapping, each once, in table
    /// order (the fallback last). For tools that check policies against what the kubelet asks.
    pub fn subresources(&self) -> Vec<&'static str> {
        let table = self.table();
        let fine_grained: &[PathRule] = if self.fine_grained {
            table.fine_grained
        } else {
            &[]
        };
        let mut all = Vec::new();
        for rule in fine_grained.iter().chain(table.coarse) {
            if !all.contains(&rule.subresource) {
                all.push(rule.subresource);
            }
        }
        if !all.contains(&FALLBACK_SUBRESOURCE) {
            all.push(FALLBACK_SUBRESOURCE);
        }
        all
    }

    fn table(&self) -> &'static PathTable {
        if self.standalone_statusz_flagz {
            &KUBELET_STANDALONE_STATUSZ_FLAGZ
        } else {
            &KUBELET_1_33
        }
    }
}

/// The subresources of one request, in the order they are tried: one or two names, without heap
/// allocation. Authorization asks about each in turn and stops at the first `Allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subresources(SubresourceList);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubresourceList {
    One([&'static str; 1]),
    Two([&'static str; 2]),
}

impl Subresources {
    /// The names in the order they are tried.
    pub fn as_slice(&self) -> &[&'static str] {
        match &self.0 {
            SubresourceList::One(names) => names,
            SubresourceList::Two(names) => names,
        }
    }

    /// Iterates the names in the order they are tried.
    pub fn iter(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.as_slice().iter().copied()
    }
}

impl<'a> IntoIterator for &'a Subresources {
    type Item = &'a &'static str;
    type IntoIter = slice::Iter<'a, &'static str>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl fmt::Display for Subresources {
    /// Go's `%v` of a string slice, `[proxy]` or `[pods proxy]`, as the kubelet's 403 body shows
    /// it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, name) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(name)?;
        }
        f.write_str("]")
    }
}

/// What a request asks to do, before the caller and node are attached: the verb and the
/// subresources to try, all `'static` so computing it never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletAttributes {
    /// The Kubernetes verb; empty for methods the kubelet does not map.
    pub verb: &'static str,
    /// The `nodes/<subresource>` names to try, in order.
    pub subresources: Subresources,
}

impl KubeletAttributes {
    /// The authorizer attributes to check, in order: one per subresource, the same user, verb,
    /// node name and path in each. `path` must be the decoded path these attributes came from.
    pub fn attributes<'a>(
        &'a self,
        user: &'a User,
        node_name: &'a str,
        path: &'a str,
    ) -> impl Iterator<Item = Attributes<'a>> + 'a {
        self.subresources
            .iter()
            .map(move |subresource| Attributes::node(user, self.verb, subresource, node_name, path))
    }
}

/// Maps a request to its verb and ordered subresources, as the kubelet's `GetRequestAttributes`.
///
/// `decoded_path` is the percent-decoded path without query (Go's `r.URL.Path`), and must come from
/// a path [`crate::request::canonical_path::check_path`] found canonical: the mapping does no
/// cleaning of its own, so it is only sound when the kubelet will route the same path.
pub fn kubelet_attributes(
    mapping: &AttributeMapping,
    method: &Method,
    decoded_path: &str,
) -> KubeletAttributes {
    let table = mapping.table();
    let coarse = first_match(table.coarse, decoded_path).unwrap_or(FALLBACK_SUBRESOURCE);
    let fine = if mapping.fine_grained {
        first_match(table.fine_grained, decoded_path)
    } else {
        None
    };
    let subresources = match fine {
        Some(fine) => Subresources(SubresourceList::Two([fine, coarse])),
        None => Subresources(SubresourceList::One([coarse])),
    };
    let verb = if mapping.exec_requires_create
        && CREATE_ONLY_PREFIXES
            .iter()
            .any(|prefix| is_subpath(decoded_path, prefix))
    {
        "create"
    } else {
        verb_for_method(method)
    };
    KubeletAttributes { verb, subresources }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::{AttributeCase, KUBELET_VECTORS, cases};
    use serde::Deserialize;

    /// Every subresource a vector asks about is in its mapping's list, together the lists are
    /// exactly the subresources of the vectors, and the verbs are exactly those any vector asks.
    #[test]
    fn subresources_and_verbs_are_those_the_vectors_ask() {
        use std::collections::BTreeSet;
        let mut all_seen = BTreeSet::new();
        let mut verbs = BTreeSet::new();
        for (row, vector) in attribute_vectors() {
            let listed = vector.mapping.subresources();
            for subresource in &vector.subresources {
                assert!(
                    listed.contains(&subresource.as_str()),
                    "{row}: not in {listed:?}"
                );
            }
            all_seen.extend(vector.subresources);
            if !vector.verb.is_empty() {
                verbs.insert(vector.verb);
            }
        }
        let all_listed: BTreeSet<String> =
            [(false, false), (false, true), (true, false), (true, true)]
                .into_iter()
                .flat_map(|(fine, standalone)| kubelet(fine, standalone).subresources())
                .map(str::to_owned)
                .collect();
        assert_eq!(all_listed, all_seen);
        let listed: BTreeSet<String> = kubelet_verbs().iter().map(|v| v.to_string()).collect();
        assert_eq!(listed, verbs);
    }

    fn kubelet(fine_grained: bool, standalone_statusz_flagz: bool) -> AttributeMapping {
        AttributeMapping {
            fine_grained,
            standalone_statusz_flagz,
            exec_requires_create: false,
            pod_scoped: false,
        }
    }

    /// An [`AttributeCase`] ready to run: the method parsed, the gate and table as a mapping.
    struct AttributeVector {
        method: Method,
        path: String,
        mapping: AttributeMapping,
        verb: String,
        subresources: Vec<String>,
    }

    fn attribute_vectors() -> Vec<(String, AttributeVector)> {
        cases::<AttributeCase>(KUBELET_VECTORS, "kubeletAttributes")
            .into_iter()
            .map(|case| {
                let shown = format!("{case:?}");
                let vector = AttributeVector {
                    method: Method::from_bytes(case.method.as_bytes())
                        .unwrap_or_else(|e| panic!("{shown}: {e}")),
                    path: case.path,
                    mapping: kubelet(case.fine_grained_authz, case.standalone_statusz_flagz),
                    verb: case.verb,
                    subresources: case.subresources,
                };
                (shown, vector)
            })
            .collect()
    }

    /// One `isSubpath` case.
    #[derive(Deserialize)]
    struct SubpathCase {
        subpath: String,
        path: String,
        matches: bool,
    }

    #[test]
    fn is_subpath_matches_the_kubelet_vectors() {
        for case in cases::<SubpathCase>(KUBELET_VECTORS, "isSubpath") {
            assert_eq!(
                is_subpath(&case.subpath, &case.path),
                case.matches,
                "isSubpath({:?}, {:?})",
                case.subpath,
                case.path
            );
        }
    }
    #[test]
    fn kubelet_attributes_match_the_kubelet_vectors() {
        for (row, v) in attribute_vectors() {
            let got = kubelet_attributes(&v.mapping, &v.method, &v.path);
            assert_eq!(got.verb, v.verb, "verb for vector {row}");
            assert_eq!(got.subresources.as_slice(), v.subresources, "vector {row}");
        }
    }

    #[test]
    fn exec_requires_create_changes_only_the_verb_of_exec_like_paths() {
        for (row, v) in attribute_vectors() {
            let mapping = AttributeMapping {
                exec_requires_create: true,
                ..v.mapping
            };
            let got = kubelet_attributes(&mapping, &v.method, &v.path);
            let exec_like = ["/exec/", "/attach/", "/portForward/", "/run/"]
                .iter()
                .any(|p| v.path.starts_with(p));
            let verb = if exec_like { "create" } else { v.verb.as_str() };
            assert_eq!(got.verb, verb, "verb for vector {row}");
            assert_eq!(got.subresources.as_slice(), v.subresources, "vector {row}");
        }
    }

    #[test]
    fn exec_requires_create_makes_any_method_create() {
        let mapping = AttributeMapping::default();
        let methods = [Method::GET, Method::HEAD, Method::PUT, Method::OPTIONS];
        let paths = [
            "/exec/default/pod/ctr",
            "/attach/default/pod/ctr",
            "/portForward/default/pod",
            "/run/default/pod/ctr",
            "/exec",
            "/exec/",
            "/run/default/pod/uid/ctr",
        ];
        for method in &methods {
            for path in paths {
                let got = kubelet_attributes(&mapping, method, path);
                assert_eq!(got.verb, "create", "{method} {path}");
                assert_eq!(got.subresources.as_slice(), ["proxy"], "{method} {path}");
            }
        }
    }

    #[test]
    fn exec_requires_create_is_segment_exact_and_case_sensitive() {
        let mapping = AttributeMapping::default();
        for path in [
            "/execx",
            "/execx/default/pod/ctr",
            "/Exec/default/pod/ctr",
            "/portforward/default/pod",
            "/running/x",
            "/containerLogs/default/pod/ctr",
            "/pods/exec",
        ] {
            let got = kubelet_attributes(&mapping, &Method::GET, path);
            assert_eq!(got.verb, "get", "{path}");
        }
    }

    #[test]
    fn default_mapping_is_fine_grained_and_hardened() {
        let mapping = AttributeMapping::default();
        let pods = kubelet_attributes(&mapping, &Method::GET, "/pods");
        assert_eq!(pods.subresources.as_slice(), ["pods", "proxy"]);
        let statusz = kubelet_attributes(&mapping, &Method::GET, "/statusz");
        assert_eq!(statusz.subresources.as_slice(), ["statusz", "proxy"]);
        let exec = kubelet_attributes(&mapping, &Method::GET, "/exec/ns/pod/ctr");
        assert_eq!(exec.verb, "create");
    }

    #[test]
    fn standalone_statusz_flagz_is_not_gated() {
        let mapping = kubelet(false, true);
        let statusz = kubelet_attributes(&mapping, &Method::GET, "/statusz");
        assert_eq!(statusz.subresources.as_slice(), ["statusz"]);
        let flagz = kubelet_attributes(&mapping, &Method::GET, "/flagz/x");
        assert_eq!(flagz.subresources.as_slice(), ["configz"]);
        let pods = kubelet_attributes(&mapping, &Method::GET, "/pods");
        assert_eq!(pods.subresources.as_slice(), ["proxy"]);
    }

    #[test]
    fn fine_grained_rows_always_fall_back_to_proxy() {
        for table in [&KUBELET_1_33, &KUBELET_STANDALONE_STATUSZ_FLAGZ] {
            for fine in table.fine_grained {
                let below = format!("{}/x", fine.prefix.trim_end_matches('/'));
                for path in [fine.prefix, below.as_str()] {
                    assert_eq!(first_match(table.coarse, path), None, "{path}");
                }
            }
        }
    }

    #[test]
    fn verbs_are_exact_and_case_sensitive() {
        let cases = [
            ("GET", "get"),
            ("POST", "create"),
            ("PUT", "update"),
            ("PATCH", "patch"),
            ("DELETE", "delete"),
            ("HEAD", ""),
            ("OPTIONS", ""),
            ("CONNECT", ""),
            ("TRACE", ""),
            ("PROPFIND", ""),
            ("get", ""),
            ("Post", ""),
        ];
        for (method, verb) in cases {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(verb_for_method(&method), verb, "{method}");
        }
    }

    #[test]
    fn subresources_display_like_go_string_slices() {
        let mapping = kubelet(true, false);
        let one = kubelet_attributes(&mapping, &Method::GET, "/exec/a/b/c").subresources;
        let two = kubelet_attributes(&mapping, &Method::GET, "/pods").subresources;
        assert_eq!(one.to_string(), "[proxy]");
        assert_eq!(two.to_string(), "[pods proxy]");
        assert_eq!(
            (&two).into_iter().copied().collect::<Vec<_>>(),
            ["pods", "proxy"]
        );
        assert_eq!(two.iter().collect::<Vec<_>>(), ["pods", "proxy"]);
    }

    #[test]
    fn attributes_carry_request_fields_in_order() {
        let user = User::anonymous();
        let kubelet_attrs = kubelet_attributes(&kubelet(true, false), &Method::HEAD, "/healthz");
        let attrs: Vec<_> = kubelet_attrs.attributes(&user, "n1", "/healthz").collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].subresource, "healthz");
        assert_eq!(attrs[1].subresource, "proxy");
        for a in &attrs {
            assert_eq!(a.verb, "");
            assert_eq!(a.name, "n1");
            assert_eq!(a.path, "/healthz");
            assert_eq!(a.user.name, user.name);
        }
    }
}
