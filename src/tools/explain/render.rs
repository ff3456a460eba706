//! The two renderings of an [`Explanation`]: a JSON document for scripts and lines for people.

use std::fmt::{self, Write as _};

use super::{Answer, AuthorizerAnswer, Explanation, PathVerdict, WebhookStep};
use crate::request::outcome::Outcome;

/// The JSON document (pretty-printed).
pub fn render_json(explanation: &Explanation) -> String {
    // Only strings, numbers, booleans, maps with string keys and lists: serializing cannot fail.
    serde_json::to_string_pretty(explanation).unwrap_or_default()
}

/// The explanation for people, one fact per line.
pub fn render_text(e: &Explanation) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_text(e, &mut out);
    out
}

fn write_text(e: &Explanation, out: &mut String) -> fmt::Result {
    let user = &e.request.user;
    writeln!(
        out,
        "request:     {} {}",
        e.request.method,
        printable(&e.request.path)
    )?;
    writeln!(out, "user:        {}", printable(&user.username))?;
    if !user.uid.is_empty() {
        writeln!(out, "uid:         {}", printable(&user.uid))?;
    }
    if !user.groups.is_empty() {
        writeln!(out, "groups:      {}", printable(&user.groups.join(", ")))?;
    }
    for (key, values) in &user.extra {
        writeln!(
            out,
            "extra:       {}={}",
            printable(key),
            printable(&values.join(","))
        )?;
    }
    writeln!(out, "node:        {}", printable(&e.node_name))?;
    writeln!(out, "authorizers: {}", e.authorizers.join(", "))?;
    if let Some(rbac) = &e.rbac {
        let age = rbac
            .policy_age_seconds
            .map_or_else(String::new, |age| format!(", policy built {age:.1}s ago"));
        let contact: Vec<String> = rbac
            .last_contact_seconds
            .iter()
            .map(|(kind, since)| match since {
                Some(since) => format!("{kind} {since:.1}s ago"),
                None => format!("{kind} never"),
            })
            .collect();
        writeln!(
            out,
            "rbac:        {}{age}; API server last heard: {}",
            rbac.state,
            contact.join(", ")
        )?;
    }
    match &e.path {
        PathVerdict::Canonical { decoded } => {
            writeln!(out, "path:        canonical ({})", printable(decoded))?;
        }
        PathVerdict::Redirect { location } => writeln!(
            out,
            "path:        not canonical: redirected to {} before authentication",
            printable(location)
        )?,
        PathVerdict::Rejected { reason } => {
            writeln!(out, "path:        refused before authentication: {reason}")?;
        }
    }
    if let Some(verb) = e.verb {
        if verb.is_empty() {
            writeln!(
                out,
                "verb:        \"\" ({} maps to no verb; only a \"*\" verb rule matches)",
                e.request.method
            )?;
        } else {
            writeln!(out, "verb:        {verb}")?;
        }
        let mut tried: Vec<String> = e
            .subresources
            .iter()
            .map(|s| format!("nodes/{s}"))
            .collect();
        if let Some(pod) = &e.pod_attributes {
            tried.push(format!(
                "{} {} on pod {}/{} (--pod-scoped-authz)",
                pod.verb, pod.resource, pod.namespace, pod.name
            ));
        }
        writeln!(out, "attributes:  {} (in order)", tried.join(", "))?;
    }
    let sets = e.subresources.len() + usize::from(e.pod_attributes.is_some());
    for (index, trial) in e.attributes.iter().enumerate() {
        let then = if index + 1 < sets {
            "the next attribute set is tried"
        } else {
            "no attribute set left"
        };
        let decided = match (trial.decision, trial.decided_by) {
            (Answer::Allow, Some(by)) => format!("allowed by {by}"),
            (Answer::Deny, Some(by)) => format!("denied by {by}; {then}"),
            (Answer::Error, _) => "error: no further attribute set is tried".to_owned(),
            _ => format!("no authorizer allowed; {then}"),
        };
        match e
            .pod_attributes
            .as_ref()
            .filter(|p| p.resource == trial.subresource)
        {
            Some(pod) => writeln!(
                out,
                "  {} {} {}/{}: {decided}",
                pod.verb, pod.resource, pod.namespace, pod.name
            )?,
            None => writeln!(
                out,
                "  {} nodes/{}: {decided}",
                e.verb.unwrap_or_default(),
                trial.subresource
            )?,
        }
        for answer in &trial.answers {
            let reason = if answer.reason.is_empty() && answer.answer != Answer::NotAsked {
                "(no reason given)".to_owned()
            } else {
                printable(&answer.reason)
            };
            writeln!(
                out,
                "    {:<12} {:<10} {reason}",
                answer.authorizer,
                answer.answer.to_string()
            )
            .map(|_| ())?;
            write_conditions(answer, out)?;
        }
    }
    let result = &e.result;
    match (result.outcome, result.status) {
        (Outcome::Allowed, _) => writeln!(
            out,
            "result:      allowed: forwarded to the kubelet, which answers"
        )?,
        (outcome, Some(status)) => {
            let what = match outcome {
                Outcome::Redirected => "redirected",
                Outcome::BadRequest => "refused (bad path)",
                Outcome::Forbidden => "forbidden",
                Outcome::AuthorizationError => "authorization error",
                other => other.as_str(),
            };
            writeln!(out, "result:      {status} {what}")?;
            for (name, value) in &result.headers {
                writeln!(out, "  {name}: {}", printable(value))?;
            }
            writeln!(
                out,
                "  body: {:?}",
                result.body.as_deref().unwrap_or_default()
            )?;
        }
        (_, None) => {}
    }
    Ok(())
}

/// A Webhook authorizer's match conditions, one per line with its result, then what they made of
/// the webhook.
fn write_conditions(answer: &AuthorizerAnswer, out: &mut String) -> fmt::Result {
    for condition in &answer.match_conditions {
        writeln!(
            out,
            "      condition {:<13} {}",
            condition.result.to_string(),
            printable(&condition.expression)
        )?;
        if let Some(error) = &condition.error {
            writeln!(out, "        error: {}", printable(error))?;
        }
    }
    let Some(step) = answer.webhook else {
        return Ok(());
    };
    let step = match step {
        WebhookStep::Called => "called: every condition is true",
        WebhookStep::Skipped => "skipped: a condition is false (no opinion)",
        WebhookStep::NotCalled => {
            "not called: a condition could not be evaluated (the failurePolicy answers)"
        }
    };
    writeln!(out, "      webhook {step}")
}

/// `s` with control characters escaped, so a name or an API server's reason cannot rewrite the
/// terminal or fake lines of the output.
pub(super) fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
