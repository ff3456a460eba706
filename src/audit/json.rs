//! An event as kube-apiserver writes it: the `audit.k8s.io/v1` JSON shape at level `Metadata`,
//! Go's escaping and time format, and truncation to a bounded line.

use std::fmt;
use std::io;
use std::time::SystemTime;

use http::HeaderValue;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use super::event::{
    AuditEvent, AuditId, Authorization, ObjectRef, ReviewsSkipped, Summary, Suppressed,
};
use super::write_utc;
use crate::authn::User;
use crate::authz::API_VERSION;

/// kube-apiserver truncates longer User-Agent values to this many bytes and marks them.
pub(super) const MAX_USER_AGENT: usize = 1024;
pub(super) const USER_AGENT_TRUNCATED: &str = "...TRUNCATED";
/// The mark of a shortened `requestURI`, the same as a shortened User-Agent's.
pub(super) const TRUNCATED: &str = USER_AGENT_TRUNCATED;
/// What truncating a `requestURI` adds besides the mark: the annotation and its key.
pub(super) const TRUNCATION_OVERHEAD: usize =
    r#""audit.k8s.io/truncated":"true","annotations":{},"#.len();

impl Serialize for AuditId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Serialize for AuditEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        EventJson {
            event: self,
            cut: Cut::default(),
        }
        .serialize(serializer)
    }
}

/// What is cut from an event too large for `--audit-log-truncate-max-event-size`, in the order
/// it is tried; every cut is named in an annotation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Cut {
    /// `requestURI` cut to this many bytes, marked `...TRUNCATED`, annotated
    /// `audit.k8s.io/truncated` as kube-apiserver's truncating backend does.
    uri: Option<usize>,
    /// `user.extra` omitted: annotated `kubelet-auth-proxy.io/extra-truncated` with how many
    /// values were.
    extra: bool,
    /// Only the first this many `user.groups` kept: annotated
    /// `kubelet-auth-proxy.io/groups-truncated` with how many of how many.
    groups: Option<usize>,
    /// The User-Agent omitted: annotated `kubelet-auth-proxy.io/user-agent-omitted`.
    user_agent: bool,
    /// Only what identifies the act: audit ID, stage, verb, user name, source, objectRef, code
    /// and times, each string cut to [`MINIMAL_FIELD`] bytes; annotated
    /// `kubelet-auth-proxy.io/minimal`. Fits in any bound the flag allows.
    minimal: bool,
}

/// The longest string (URI, user name, object name or namespace) in an event's minimal form.
/// Four such fields, escaped at six bytes a byte at worst, and the fixed fields fit in 4096
/// bytes, the smallest `--audit-log-truncate-max-event-size`.
pub(super) const MINIMAL_FIELD: usize = 128;

/// An event as written, with `cut` applied.
pub(super) struct EventJson<'a> {
    event: &'a AuditEvent,
    cut: Cut,
}

/// `value` cut to at most `limit` bytes on a character boundary and marked `...TRUNCATED`;
/// unchanged when not longer.
fn shortened(value: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if value.len() <= limit {
        return value.into();
    }
    let mut cut = limit;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut short = String::with_capacity(cut + TRUNCATED.len());
    short.push_str(&value[..cut]);
    short.push_str(TRUNCATED);
    short.into()
}

impl Serialize for EventJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let this = self.event;
        let cut = self.cut;
        let mut event = serializer.serialize_struct("Event", 15)?;
        event.serialize_field("kind", "Event")?;
        event.serialize_field("apiVersion", "audit.k8s.io/v1")?;
        event.serialize_field("level", "Metadata")?;
        event.serialize_field("auditID", &this.id)?;
        event.serialize_field("stage", this.stage.as_str())?;
        let uri = this
            .request_uri
            .path_and_query()
            .map_or("", |pq| pq.as_str());
        let uri_limit = match (cut.minimal, cut.uri) {
            (true, limit) => Some(limit.unwrap_or(MINIMAL_FIELD).min(MINIMAL_FIELD)),
            (false, limit) => limit,
        };
        let uri_cut = uri_limit.filter(|limit| uri.len() > *limit);
        event.serialize_field("requestURI", &shortened(uri, uri_cut.unwrap_or(uri.len())))?;
        event.serialize_field("verb", this.verb)?;
        event.serialize_field(
            "user",
            &UserInfo {
                user: this.user.as_deref(),
                cut,
            },
        )?;
        // Go prints an IPv4-mapped IPv6 address in its IPv4 form.
        event.serialize_field("sourceIPs", &[this.source_ip.to_canonical()])?;
        let user_agent = this.user_agent.as_ref().filter(|ua| !ua.is_empty());
        if let Some(agent) = user_agent.filter(|_| !cut.user_agent && !cut.minimal) {
            event.serialize_field("userAgent", &UserAgent(agent))?;
        }
        if let Some(object) = &this.object_ref {
            if cut.minimal {
                event.serialize_field("objectRef", &MinimalObjectRef(object))?;
            } else {
                event.serialize_field("objectRef", object)?;
            }
        }
        event.serialize_field("responseStatus", &ResponseStatus(this.response_code))?;
        event.serialize_field(
            "requestReceivedTimestamp",
            &MicroTime(this.request_received),
        )?;
        event.serialize_field("stageTimestamp", &MicroTime(this.stage_timestamp))?;
        let user = this.user.as_deref();
        let annotations = Annotations {
            truncated: uri_cut.is_some(),
            authorization: this.authorization.as_ref(),
            minimal: cut.minimal,
            extra_omitted: (cut.extra || cut.minimal)
                .then(|| user.map_or(0, |u| u.extra.values().map(Vec::len).sum::<usize>()))
                .filter(|n| *n > 0),
            groups: user.and_then(|u| {
                let kept = if cut.minimal { Some(0) } else { cut.groups }?;
                (kept < u.groups.len()).then_some((kept, u.groups.len()))
            }),
            user_agent_omitted: (cut.user_agent || cut.minimal) && user_agent.is_some(),
            summary: this.summary.as_deref(),
        };
        if !annotations.is_empty() {
            event.serialize_field("annotations", &annotations)?;
        }
        event.end()
    }
}

/// The event's annotations, keys in Go's (sorted) order: `audit.k8s.io/truncated` first.
pub(super) struct Annotations<'a> {
    truncated: bool,
    authorization: Option<&'a Authorization>,
    /// How many `user.extra` values were omitted.
    extra_omitted: Option<usize>,
    /// Groups kept of how many.
    groups: Option<(usize, usize)>,
    minimal: bool,
    user_agent_omitted: bool,
    summary: Option<&'a Summary>,
}

impl Annotations<'_> {
    fn is_empty(&self) -> bool {
        !self.truncated
            && self.authorization.is_none()
            && self.extra_omitted.is_none()
            && self.groups.is_none()
            && !self.minimal
            && !self.user_agent_omitted
            && self.summary.is_none()
    }
}

impl Serialize for Annotations<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if self.truncated {
            map.serialize_entry("audit.k8s.io/truncated", "true")?;
        }
        if let Some(authorization) = self.authorization {
            if self.minimal {
                authorization.decision(&mut map)?;
            } else {
                authorization.entries(&mut map)?;
            }
        }
        if let Some(omitted) = self.extra_omitted {
            map.serialize_entry(
                "kubelet-auth-proxy.io/extra-truncated",
                &format!("{omitted} values omitted"),
            )?;
        }
        if let Some((kept, of)) = self.groups {
            map.serialize_entry(
                "kubelet-auth-proxy.io/groups-truncated",
                &format!("{kept} of {of} groups kept"),
            )?;
        }
        if self.minimal {
            map.serialize_entry("kubelet-auth-proxy.io/minimal", "true")?;
        }
        match self.summary {
            Some(Summary::Suppressed(suppressed)) => suppressed.entries(&mut map)?,
            Some(Summary::ReviewsSkipped(skipped)) => skipped.entries(&mut map)?,
            None => {}
        }
        if self.user_agent_omitted {
            map.serialize_entry("kubelet-auth-proxy.io/user-agent-omitted", "true")?;
        }
        map.end()
    }
}

/// `authentication/v1` UserInfo, every field `omitempty`, with `cut` applied.
pub(super) struct UserInfo<'a> {
    user: Option<&'a User>,
    cut: Cut,
}

impl Serialize for UserInfo<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut info = serializer.serialize_struct("UserInfo", 4)?;
        if let Some(user) = self.user {
            if self.cut.minimal {
                if !user.name.is_empty() {
                    info.serialize_field("username", &shortened(&user.name, MINIMAL_FIELD))?;
                }
                return info.end();
            }
            if !user.name.is_empty() {
                info.serialize_field("username", &user.name)?;
            }
            if !user.uid.is_empty() {
                info.serialize_field("uid", &user.uid)?;
            }
            let groups =
                &user.groups[..self.cut.groups.unwrap_or(usize::MAX).min(user.groups.len())];
            if !groups.is_empty() {
                info.serialize_field("groups", groups)?;
            }
            if !user.extra.is_empty() && !self.cut.extra {
                info.serialize_field("extra", &user.extra)?;
            }
        }
        info.end()
    }
}

/// An objectRef in an event's minimal form: names cut to [`MINIMAL_FIELD`] bytes.
struct MinimalObjectRef<'a>(&'a ObjectRef);

impl Serialize for MinimalObjectRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let this = self.0;
        let mut object = serializer.serialize_struct("ObjectReference", 5)?;
        object.serialize_field("resource", this.resource)?;
        if let Some(namespace) = this.namespace.as_deref().filter(|n| !n.is_empty()) {
            object.serialize_field("namespace", &shortened(namespace, MINIMAL_FIELD))?;
        }
        if !this.name.is_empty() {
            object.serialize_field("name", &shortened(&this.name, MINIMAL_FIELD))?;
        }
        object.serialize_field("apiVersion", API_VERSION)?;
        if !this.subresource.is_empty() {
            object.serialize_field("subresource", this.subresource)?;
        }
        object.end()
    }
}

/// The User-Agent as kube-apiserver records it: at most 1024 bytes then `...TRUNCATED`; bytes
/// that are not UTF-8 become U+FFFD, as Go's JSON encoder writes them.
pub(super) struct UserAgent<'a>(&'a HeaderValue);

impl Serialize for UserAgent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bytes = self.0.as_bytes();
        if bytes.len() > MAX_USER_AGENT {
            let mut agent = String::from_utf8_lossy(&bytes[..MAX_USER_AGENT]).into_owned();
            agent.push_str(USER_AGENT_TRUNCATED);
            serializer.serialize_str(&agent)
        } else {
            serializer.serialize_str(&String::from_utf8_lossy(bytes))
        }
    }
}

impl Serialize for ObjectRef {
    /// Go's `audit/v1.ObjectReference` field order; empty fields omitted.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut object = serializer.serialize_struct("ObjectReference", 5)?;
        object.serialize_field("resource", self.resource)?;
        if let Some(namespace) = self.namespace.as_deref().filter(|n| !n.is_empty()) {
            object.serialize_field("namespace", namespace)?;
        }
        if !self.name.is_empty() {
            object.serialize_field("name", &*self.name)?;
        }
        object.serialize_field("apiVersion", API_VERSION)?;
        if !self.subresource.is_empty() {
            object.serialize_field("subresource", self.subresource)?;
        }
        object.end()
    }
}

/// `meta/v1.Status` as kube-apiserver records it at level Metadata: the (never omitted) empty
/// list metadata and the code, itself omitted when zero.
pub(super) struct ResponseStatus(u16);

impl Serialize for ResponseStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut status = serializer.serialize_struct("Status", 2)?;
        status.serialize_field("metadata", &EmptyObject)?;
        if self.0 != 0 {
            status.serialize_field("code", &self.0)?;
        }
        status.end()
    }
}

pub(super) struct EmptyObject;

impl Serialize for EmptyObject {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_map(Some(0))?.end()
    }
}

impl Authorization {
    /// The authorization annotations, keys in Go's (sorted) order.
    pub(super) fn entries<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        const DECISION: &str = "authorization.k8s.io/decision";
        const REASON: &str = "authorization.k8s.io/reason";
        match self {
            Authorization::Allow(reason) => {
                map.serialize_entry(DECISION, "allow")?;
                map.serialize_entry(REASON, reason.as_str())
            }
            Authorization::Forbid(reason) => {
                map.serialize_entry(DECISION, "forbid")?;
                map.serialize_entry(REASON, reason.as_str())
            }
            Authorization::Error => map.serialize_entry(REASON, "internal error"),
        }
    }

    /// The decision annotation alone, for an event's minimal form: a reason can be long.
    pub(super) fn decision<M: serde::ser::SerializeMap>(
        &self,
        map: &mut M,
    ) -> Result<(), M::Error> {
        const DECISION: &str = "authorization.k8s.io/decision";
        match self {
            Authorization::Allow(_) => map.serialize_entry(DECISION, "allow"),
            Authorization::Forbid(_) => map.serialize_entry(DECISION, "forbid"),
            Authorization::Error => Ok(()),
        }
    }
}

impl ReviewsSkipped {
    /// A summary event's annotations, keys in sorted order.
    pub(super) fn entries<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry(
            "kubelet-auth-proxy.io/reviews-skipped",
            &self.requests.to_string(),
        )?;
        let reason = match (
            self.own_budget,
            self.requests - self.own_budget.min(self.requests),
        ) {
            (0, _) => "overall_budget",
            (_, 0) => "source_budget",
            _ => "source_budget,overall_budget",
        };
        map.serialize_entry("kubelet-auth-proxy.io/reviews-skipped-reason", reason)?;
        if !self.one_source {
            map.serialize_entry(
                "kubelet-auth-proxy.io/reviews-skipped-source",
                "(sources beyond the table)",
            )?;
        }
        Ok(())
    }
}

impl Suppressed {
    /// A summary event's annotations, keys in sorted order.
    pub(super) fn entries<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        if self.acts_refused > 0 {
            map.serialize_entry(
                "kubelet-auth-proxy.io/acts-refused",
                &self.acts_refused.to_string(),
            )?;
        }
        map.serialize_entry(
            "kubelet-auth-proxy.io/suppressed-bytes",
            &self.bytes.to_string(),
        )?;
        map.serialize_entry(
            "kubelet-auth-proxy.io/suppressed-events",
            &self.events.to_string(),
        )?;
        let identity = match &self.identity {
            Some(name) if name.is_empty() => "(unauthenticated)",
            Some(name) => name.as_str(),
            None => "(identities beyond the table)",
        };
        map.serialize_entry("kubelet-auth-proxy.io/suppressed-identity", identity)?;
        let reason = match (
            self.own_budget,
            self.events - self.own_budget.min(self.events),
        ) {
            (0, 0) => "acts_refused",
            (0, _) => "overall_budget",
            (_, 0) => "budget",
            _ => "budget,overall_budget",
        };
        map.serialize_entry("kubelet-auth-proxy.io/suppressed-reason", reason)?;
        if !self.subresources.is_empty() {
            let mut by_subresource = self.subresources.clone();
            by_subresource.sort_unstable();
            let listed: Vec<String> = by_subresource
                .iter()
                .map(|(subresource, n)| {
                    let subresource = if subresource.is_empty() {
                        "(unmapped)"
                    } else {
                        subresource
                    };
                    format!("{subresource}={n}")
                })
                .collect();
            map.serialize_entry(
                "kubelet-auth-proxy.io/suppressed-subresources",
                &listed.join(","),
            )?;
        }
        Ok(())
    }
}

/// `metav1.MicroTime` as JSON: RFC 3339 in UTC with exactly six fractional digits, truncated (not
/// rounded) as Go's time formatting does, e.g. `2026-11-22T05:16:00.123456Z`.
pub(super) struct MicroTime(pub(super) SystemTime);

impl fmt::Display for MicroTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_utc(f, self.0, ':', 6)?;
        f.write_str("Z")
    }
}

impl Serialize for MicroTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// serde_json's compact output plus the escapes Go's `encoding/json` adds by default (`<`, `>`,
/// `&`, U+2028, U+2029), so a line is byte for byte what kube-apiserver would write, and a log
/// viewer that renders HTML cannot be fed markup through a user name.
pub(super) struct GoJsonFormatter;

impl serde_json::ser::Formatter for GoJsonFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut clean_from = 0;
        for (at, c) in fragment.char_indices() {
            let escape = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[clean_from..at])?;
            writer.write_all(escape.as_bytes())?;
            clean_from = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[clean_from..])
    }
}

/// Appends one event as a JSON line.
pub(super) fn encode_line(event: &AuditEvent, out: &mut Vec<u8>) -> serde_json::Result<()> {
    encode_json(
        &EventJson {
            event,
            cut: Cut::default(),
        },
        out,
    )
}

pub(super) fn encode_json(event: &EventJson<'_>, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, GoJsonFormatter);
    event.serialize(&mut serializer)?;
    out.push(b'\n');
    Ok(())
}

/// The URI is cut no shorter than this before `extra`, groups and the User-Agent are: an exec's
/// command is in its query.
pub(super) const URI_FLOOR: usize = 1024;
/// Room kept for the annotations a cut adds.
const CUT_ANNOTATION_ROOM: usize = 160;

/// Writes `event` into `out` (cleared first) as one line of at most `max_bytes`. A longer event
/// is cut step by step until it fits: its `requestURI` down to [`URI_FLOOR`] (as kube-apiserver's
/// `--audit-log-truncate-max-event-size` does with request bodies), then `user.extra`, then the
/// trailing `user.groups`, then the User-Agent, and last to its minimal form; each cut annotated.
/// An event is never dropped for its size: the only error is a bound below the minimal form's,
/// which configuration refuses ([`MIN_EVENT_BOUND`]).
pub(super) fn encode_bounded(
    event: &AuditEvent,
    max_bytes: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let mut cut = Cut::default();
    let encode = |cut: Cut, out: &mut Vec<u8>| {
        out.clear();
        encode_json(&EventJson { event, cut }, out).map_err(io::Error::other)
    };
    encode(cut, out)?;
    if out.len() <= max_bytes {
        return Ok(());
    }
    let uri_len = event
        .request_uri
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    let excess = out.len() - max_bytes + TRUNCATED.len() + TRUNCATION_OVERHEAD;
    if uri_len > URI_FLOOR {
        // What a request asked for is cut no shorter than the floor while other fields can go.
        cut.uri = Some(uri_len.saturating_sub(excess).max(URI_FLOOR));
        encode(cut, out)?;
        if out.len() <= max_bytes {
            return Ok(());
        }
    }
    let user = event.user.as_deref();
    if user.is_some_and(|u| !u.extra.is_empty()) {
        cut.extra = true;
        encode(cut, out)?;
        if out.len() <= max_bytes {
            return Ok(());
        }
    }
    if let Some(groups) = user.map(|u| &u.groups).filter(|g| !g.is_empty()) {
        // Drop groups from the end until their encoded bytes cover the excess and the annotation.
        let mut over = (out.len() + CUT_ANNOTATION_ROOM).saturating_sub(max_bytes);
        let mut kept = groups.len();
        while kept > 0 && over > 0 {
            kept -= 1;
            over = over.saturating_sub(encoded_len(&groups[kept]) + 1);
        }
        cut.groups = Some(kept);
        encode(cut, out)?;
        if out.len() <= max_bytes {
            return Ok(());
        }
    }
    if event.user_agent.is_some() {
        cut.user_agent = true;
        encode(cut, out)?;
        if out.len() <= max_bytes {
            return Ok(());
        }
    }
    cut.minimal = true;
    encode(cut, out)?;
    if out.len() > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "an event of {} bytes in its minimal form exceeds --audit-log-truncate-max-event-size",
                out.len()
            ),
        ));
    }
    Ok(())
}

/// The smallest `--audit-log-truncate-max-event-size` every event's minimal form fits in.
pub const MIN_EVENT_BOUND: usize = 4096;

/// The bytes of `value` as a JSON string written by [`GoJsonFormatter`].
fn encoded_len(value: &str) -> usize {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, GoJsonFormatter);
    match value.serialize(&mut serializer) {
        Ok(()) => out.len(),
        Err(_) => value.len() * 6 + 2,
    }
}
