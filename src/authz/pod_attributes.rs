//! Container paths → the pod-level attributes the API server checks for the same operation
//! (`--pod-scoped-authz`): `/containerLogs/{namespace}/{pod}/{container}` is `get pods/log`,
//! `/exec`, `/attach` and `/run` are `create pods/exec` or `pods/attach`, `/portForward` is
//! `create pods/portforward`, each in the pod's namespace on the pod's name.
//!
//! The kubelet authorizes all of these as `nodes/proxy`, so whoever may exec into one pod may
//! exec into every pod on the node. The API server already knows who may exec into which pod
//! (`pods/exec` in the pod's namespace, the permission `kubectl exec` needs): checking that too
//! lets a grant reach one namespace's pods only. The attributes are built from the very path that
//! is forwarded, so a pod-level grant can never open another pod.
//!
//! Routes are the kubelet's (kubernetes v1.36 `pkg/kubelet/server/server.go`
//! `InstallDebuggingHandlers`): the segment counts below are its route templates, with and
//! without the pod UID. `/checkpoint/{namespace}/{pod}/{container}` is left out: the API server
//! has no pod subresource for checkpoints, so no existing permission could be reused.

use http::Method;

use crate::authn::User;
use crate::authz::{Attributes, POD_RESOURCE};
use crate::base::names;

/// One kubelet route with a pod in it.
#[derive(Debug)]
struct PodRoute {
    /// The first path segment, with its slash.
    prefix: &'static str,
    /// How many segments follow it: the route templates with and without `{uid}`.
    segments: &'static [usize],
    /// The `pods` subresource the API server checks for the same operation.
    subresource: &'static str,
    /// Its label in logs, metrics, audit and `explain`: `pods/<subresource>`.
    label: &'static str,
    /// The methods the kubelet routes here, and the verb each is checked with.
    verbs: &'static [(Method, &'static str)],
}

/// `create`, the verb the API server checks for exec, attach and port-forward whichever
/// transport (SPDY `POST` or WebSocket `GET`) carries them.
const CREATE_ON_GET_OR_POST: &[(Method, &str)] =
    &[(Method::GET, "create"), (Method::POST, "create")];

/// The kubelet's routes with a pod in their path. `{namespace}/{pod}` are always the first two
/// segments after the prefix.
static POD_ROUTES: &[PodRoute] = &[
    // /containerLogs/{podNamespace}/{podID}/{containerName}
    PodRoute {
        prefix: "/containerLogs",
        segments: &[3],
        subresource: "log",
        label: "pods/log",
        verbs: &[(Method::GET, "get")],
    },
    // /exec/{podNamespace}/{podID}[/{uid}]/{containerName}
    PodRoute {
        prefix: "/exec",
        segments: &[3, 4],
        subresource: "exec",
        label: "pods/exec",
        verbs: CREATE_ON_GET_OR_POST,
    },
    // /attach/{podNamespace}/{podID}[/{uid}]/{containerName}
    PodRoute {
        prefix: "/attach",
        segments: &[3, 4],
        subresource: "attach",
        label: "pods/attach",
        verbs: CREATE_ON_GET_OR_POST,
    },
    // /portForward/{podNamespace}/{podID}[/{uid}]
    PodRoute {
        prefix: "/portForward",
        segments: &[2, 3],
        subresource: "portforward",
        label: "pods/portforward",
        verbs: CREATE_ON_GET_OR_POST,
    },
    // /run/{podNamespace}/{podID}[/{uid}]/{containerName}: runs a command and returns its
    // output, what exec does; the API server has no `run`.
    PodRoute {
        prefix: "/run",
        segments: &[3, 4],
        subresource: "exec",
        label: "pods/exec",
        verbs: &[(Method::POST, "create")],
    },
];

/// The pod-level attribute set of a request: borrowed from its path, so it names exactly the pod
/// the kubelet will be asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodAttributes<'a> {
    /// The verb the API server would check.
    pub verb: &'static str,
    /// The pod's namespace, from the path.
    pub namespace: &'a str,
    /// The pod's name, from the path.
    pub pod: &'a str,
    /// `log`, `exec`, `attach` or `portforward`.
    pub subresource: &'static str,
    /// `pods/<subresource>`, for logs, metrics, audit and `explain`.
    pub label: &'static str,
}

impl<'a> PodAttributes<'a> {
    /// The authorizer attributes: `verb pods/<subresource>` on the pod, in its namespace.
    pub fn attributes(&self, user: &'a User, path: &'a str) -> Attributes<'a> {
        Attributes {
            user,
            verb: self.verb,
            namespace: self.namespace,
            resource: POD_RESOURCE,
            subresource: self.subresource,
            name: self.pod,
            path,
        }
    }
}

/// The pod-level attributes of `method decoded_path`, or `None` when the path is not one of the
/// kubelet's container routes, the method is not one it routes there, or the namespace or pod
/// segment is not a name the API server could hold (so no pod-level grant can match it).
///
/// `decoded_path` must be a path [`crate::request::canonical_path::check_path`] found canonical, as
/// for [`super::attributes::kubelet_attributes`].
pub fn pod_attributes<'a>(method: &Method, decoded_path: &'a str) -> Option<PodAttributes<'a>> {
    POD_ROUTES.iter().find_map(|route| {
        let rest = decoded_path.strip_prefix(route.prefix)?.strip_prefix('/')?;
        let (_, verb) = route.verbs.iter().find(|(m, _)| m == method)?;
        let segments: Vec<&str> = rest.split('/').collect();
        if !route.segments.contains(&segments.len()) || segments.iter().any(|s| s.is_empty()) {
            return None;
        }
        let (namespace, pod) = (segments[0], segments[1]);
        (names::is_dns1123_label(namespace) && names::is_dns1123_subdomain(pod)).then_some(
            PodAttributes {
                verb,
                namespace,
                pod,
                subresource: route.subresource,
                label: route.label,
            },
        )
    })
}

/// Every `pods/<subresource>` label a request can be asked about, for tools that check policies
/// (`explain`'s lint).
pub fn pod_subresources() -> impl Iterator<Item = (&'static str, &'static [(Method, &'static str)])>
{
    POD_ROUTES
        .iter()
        .map(|route| (route.subresource, route.verbs))
}

#[cfg(test)]
mod tests;
