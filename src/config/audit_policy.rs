//! `--audit-policy-file`: the audit policy read and validated, and what it would do to acts
//! warned about. Read once at start: a changed file takes effect on restart (or `SIGUSR2`).

use std::sync::Arc;

use http::Method;

use super::error::file_cause;
use super::file::read_text;
use super::flags::ProxyFlags;
use super::warnings::Warning;
use super::{AuthorizationSettings, ConfigError};
use crate::audit::ObjectRef;
use crate::audit::policy::AuditPolicy;
use crate::audit::policy::lint::{ActSample, act_warnings};
use crate::authz::attributes::kubelet_attributes;
use crate::authz::pod_attributes::pod_attributes;
use crate::authz::{POD_RESOURCE, RESOURCE};

const FLAG: &str = "--audit-policy-file";

/// The acts the policy is tried on: each acting path with a POST, and the streams with a GET too
/// (a WebSocket exec is a GET).
const ACTS: [(Method, &str); 8] = [
    (Method::POST, "/exec/default/pod/container"),
    (Method::GET, "/exec/default/pod/container"),
    (Method::POST, "/attach/default/pod/container"),
    (Method::GET, "/attach/default/pod/container"),
    (Method::POST, "/portForward/default/pod"),
    (Method::GET, "/portForward/default/pod"),
    (Method::POST, "/run/default/pod/container"),
    (Method::POST, "/checkpoint/default/pod/container"),
];

/// Reads `--audit-policy-file`, if given, and warns about rules that would omit acts, trying
/// them with the attribute mapping of `authorization` (when it loaded).
pub(super) fn audit_policy(
    flags: &ProxyFlags,
    authorization: Option<&AuthorizationSettings>,
    warnings: &mut Vec<Warning>,
) -> Result<Option<AuditPolicy>, ConfigError> {
    let Some(path) = &flags.audit_policy_file else {
        return Ok(None);
    };
    let text = read_text(FLAG, path)?;
    let policy = AuditPolicy::parse(&text).map_err(|e| file_cause(FLAG, path, e))?;
    if flags.audit_log_path.is_none() {
        warnings.push(Warning::new(
            FLAG,
            "has no effect without --audit-log-path: no audit log is written",
        ));
    }
    if let Some(authorization) = authorization {
        let acts = act_requests(authorization);
        let samples: Vec<ActSample<'_>> = acts
            .iter()
            .map(|(label, verb, object_ref, path)| ActSample {
                label,
                request: crate::audit::policy::PolicyRequest {
                    user: None,
                    verb,
                    object_ref: Some(object_ref),
                    path,
                },
            })
            .collect();
        for warning in act_warnings(&policy, &samples) {
            warnings.push(Warning::new(FLAG, warning));
        }
    }
    Ok(Some(policy))
}

/// The events of [`ACTS`] as the proxy would write them with `authorization`'s mapping: for each,
/// every Node subresource it may be allowed on, and its pod subresource under pod-scoped
/// authorization. Each with its label, verb, object and path.
fn act_requests(
    authorization: &AuthorizationSettings,
) -> Vec<(String, &'static str, ObjectRef, &'static str)> {
    let node: Arc<str> = Arc::from(authorization.node_name.as_str());
    let mut acts = Vec::new();
    for (method, path) in &ACTS {
        let attributes = kubelet_attributes(&authorization.mapping, method, path);
        for subresource in &attributes.subresources {
            acts.push((
                format!(
                    "{} {RESOURCE}/{subresource} ({method} {path})",
                    attributes.verb
                ),
                attributes.verb,
                ObjectRef {
                    resource: RESOURCE,
                    namespace: None,
                    subresource,
                    name: Arc::clone(&node),
                },
                *path,
            ));
        }
        if authorization.mapping.pod_scoped
            && let Some(pod) = pod_attributes(method, path)
        {
            acts.push((
                format!("{} {} ({method} {path})", pod.verb, pod.label),
                pod.verb,
                ObjectRef {
                    resource: POD_RESOURCE,
                    namespace: Some(Arc::from(pod.namespace)),
                    subresource: pod.subresource,
                    name: Arc::from(pod.pod),
                },
                *path,
            ));
        }
    }
    acts
}
