//! The SubjectAccessReview side of the stand-in API server: the spec a test's rules decide on,
//! their verdicts, and SubjectAccessReview's REST storage (validation, the `status` it fills).

use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::{Map, Value, json};

use super::Shared;
use super::serve::{decode, status_json};

/// A SubjectAccessReview's `spec`, parsed for the rules to decide on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessReview {
    /// `spec.user`.
    pub user: String,
    /// `spec.uid`.
    pub uid: String,
    /// `spec.groups`.
    pub groups: Vec<String>,
    /// `spec.extra`.
    pub extra: BTreeMap<String, Vec<String>>,
    /// `resourceAttributes.verb` ("" when omitted).
    pub verb: String,
    /// `resourceAttributes.namespace` ("" when omitted).
    pub namespace: String,
    /// `resourceAttributes.resource`.
    pub resource: String,
    /// `resourceAttributes.subresource`.
    pub subresource: String,
    /// `resourceAttributes.name`.
    pub name: String,
}

impl AccessReview {
    fn parse(spec: &Value) -> AccessReview {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let list = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|items| items.iter().map(text).collect())
                .unwrap_or_default()
        };
        let attributes = &spec["resourceAttributes"];
        AccessReview {
            user: text(&spec["user"]),
            uid: text(&spec["uid"]),
            groups: list(&spec["groups"]),
            extra: spec["extra"]
                .as_object()
                .map(|extra| extra.iter().map(|(k, v)| (k.clone(), list(v))).collect())
                .unwrap_or_default(),
            verb: text(&attributes["verb"]),
            namespace: text(&attributes["namespace"]),
            resource: text(&attributes["resource"]),
            subresource: text(&attributes["subresource"]),
            name: text(&attributes["name"]),
        }
    }
}

/// A SubjectAccessReview's `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `status.allowed`.
    pub allowed: bool,
    /// `status.denied` (omitted when false).
    pub denied: bool,
    /// `status.reason` (omitted when empty).
    pub reason: String,
}

impl Verdict {
    /// Allowed, with RBAC's kind of reason.
    pub fn allow() -> Verdict {
        Verdict {
            allowed: true,
            denied: false,
            reason: "RBAC: allowed by the stand-in's rules".to_owned(),
        }
    }

    /// Explicitly denied.
    pub fn deny() -> Verdict {
        Verdict {
            allowed: false,
            denied: true,
            reason: "denied by the stand-in's rules".to_owned(),
        }
    }

    /// Neither allowed nor denied.
    pub fn no_opinion() -> Verdict {
        Verdict {
            allowed: false,
            denied: false,
            reason: String::new(),
        }
    }

    /// [`Verdict::allow`] when `allowed`, else [`Verdict::no_opinion`]: the rule of a stand-in
    /// that allows some callers and leaves the rest to the next authorizer.
    pub fn allow_when(allowed: bool) -> Verdict {
        if allowed {
            Verdict::allow()
        } else {
            Verdict::no_opinion()
        }
    }

    /// Both allowed and denied: a response the webhook authorizer must treat as an error.
    pub fn allowed_and_denied() -> Verdict {
        Verdict {
            allowed: true,
            denied: true,
            reason: "contradictory".to_owned(),
        }
    }

    fn status_json(&self) -> Value {
        let mut status = Map::new();
        status.insert("allowed".into(), json!(self.allowed));
        if self.denied {
            status.insert("denied".into(), json!(true));
        }
        if !self.reason.is_empty() {
            status.insert("reason".into(), json!(self.reason));
        }
        Value::Object(status)
    }
}

/// SubjectAccessReview's REST storage: the spec is validated as the API server validates it,
/// then decided by the test's rules.
pub(super) fn review_access(body: &[u8], shared: &Shared) -> (StatusCode, Value) {
    let review = match decode(body, "SubjectAccessReview", "authorization.k8s.io/v1") {
        Ok(review) => review,
        Err(error) => return error,
    };
    let spec = review["spec"].clone();
    let rules = shared.lock().rules.clone();
    let has_resource = spec.get("resourceAttributes").is_some();
    let has_non_resource = spec.get("nonResourceAttributes").is_some();
    let parsed = AccessReview::parse(&spec);
    let problem = if has_resource == has_non_resource {
        Some(
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of \
             nonResourceAttributes or resourceAttributes must be specified",
        )
    } else if parsed.user.is_empty() && parsed.groups.is_empty() {
        Some("spec.user: Invalid value: \"\": at least one of user or group must be specified")
    } else {
        None
    };
    if let Some(problem) = problem {
        return status_json(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {problem}"),
            Some(json!({"group": "authorization.k8s.io", "kind": "SubjectAccessReview"})),
        );
    }
    let verdict = rules(&parsed);
    (
        StatusCode::CREATED,
        json!({
            "kind": "SubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": verdict.status_json(),
        }),
    )
}
