//! An event as kube-apiserver writes it: the `audit.k8s.io/v1` JSON shape at level `Metadata`,
//! Go's escaping and time format, and truncation to a bounded line.

use std::fmt;
use std::io;
use std::time::SystemTime;

use http::HeaderValue;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use super::event::{AuditEvent, AuditId, Authorization, ObjectRef};
use super::utc;
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
            uri_limit: None,
        }
        .serialize(serializer)
    }
}

/// An event as written: with `uri_limit`, a longer `requestURI` is cut to that many bytes (on a
/// character boundary), marked `...TRUNCATED`, and the event annotated `audit.k8s.io/truncated`,
/// as kube-apiserver's truncating backend marks the events it shortens.
pub(super) struct EventJson<'a> {
    event: &'a AuditEvent,
    uri_limit: Option<usize>,
}

impl Serialize for EventJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let this = self.event;
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
        let truncated = self.uri_limit.filter(|limit| uri.len() > *limit);
        match truncated {
            Some(limit) => {
                let mut cut = limit;
                while !uri.is_char_boundary(cut) {
                    cut -= 1;
                }
                let mut shortened = String::with_capacity(cut + TRUNCATED.len());
                shortened.push_str(&uri[..cut]);
                shortened.push_str(TRUNCATED);
                event.serialize_field("requestURI", &shortened)?;
            }
            None => event.serialize_field("requestURI", uri)?,
        }
        event.serialize_field("verb", this.verb)?;
        event.serialize_field("user", &UserInfo(this.user.as_deref()))?;
        // Go prints an IPv4-mapped IPv6 address in its IPv4 form.
        event.serialize_field("sourceIPs", &[this.source_ip.to_canonical()])?;
        if let Some(agent) = this.user_agent.as_ref().filter(|ua| !ua.is_empty()) {
            event.serialize_field("userAgent", &UserAgent(agent))?;
        }
        if let Some(object) = &this.object_ref {
            event.serialize_field("objectRef", object)?;
        }
        event.serialize_field("responseStatus", &ResponseStatus(this.response_code))?;
        event.serialize_field(
            "requestReceivedTimestamp",
            &MicroTime(this.request_received),
        )?;
        event.serialize_field("stageTimestamp", &MicroTime(this.stage_timestamp))?;
        if this.authorization.is_some() || truncated.is_some() {
            event.serialize_field(
                "annotations",
                &Annotations {
                    truncated: truncated.is_some(),
                    authorization: this.authorization.as_ref(),
                },
            )?;
        }
        event.end()
    }
}

/// The event's annotations, keys in Go's (sorted) order: `audit.k8s.io/truncated` first.
pub(super) struct Annotations<'a> {
    truncated: bool,
    authorization: Option<&'a Authorization>,
}

impl Serialize for Annotations<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if self.truncated {
            map.serialize_entry("audit.k8s.io/truncated", "true")?;
        }
        if let Some(authorization) = self.authorization {
            authorization.entries(&mut map)?;
        }
        map.end()
    }
}

/// `authentication/v1` UserInfo, every field `omitempty`.
pub(super) struct UserInfo<'a>(Option<&'a User>);

impl Serialize for UserInfo<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut info = serializer.serialize_struct("UserInfo", 4)?;
        if let Some(user) = self.0 {
            if !user.name.is_empty() {
                info.serialize_field("username", &user.name)?;
            }
            if !user.uid.is_empty() {
                info.serialize_field("uid", &user.uid)?;
            }
            if !user.groups.is_empty() {
                info.serialize_field("groups", &user.groups)?;
            }
            if !user.extra.is_empty() {
                info.serialize_field("extra", &user.extra)?;
            }
        }
        info.end()
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
}

/// `metav1.MicroTime` as JSON: RFC 3339 in UTC with exactly six fractional digits, truncated (not
/// rounded) as Go's time formatting does, e.g. `2026-11-22T05:16:00.123456Z`.
pub(super) struct MicroTime(pub(super) SystemTime);

impl fmt::Display for MicroTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = utc(self.0);
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year(),
            t.month(),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.subsec_nanosecond() / 1000
        )
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
            uri_limit: None,
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

/// Writes `event` into `out` (cleared first) as one line of at most `max_bytes`: when the whole
/// event is longer, its `requestURI` is shortened and the event annotated, as kube-apiserver's
/// `--audit-log-truncate-max-event-size` does with request bodies. An event still too long (a
/// user with thousands of groups) is an error: it is dropped and counted, as kube-apiserver does.
pub(super) fn encode_bounded(
    event: &AuditEvent,
    max_bytes: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    out.clear();
    encode_line(event, out).map_err(io::Error::other)?;
    if out.len() <= max_bytes {
        return Ok(());
    }
    let uri_len = event
        .request_uri
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    let excess = out.len() - max_bytes + TRUNCATED.len() + TRUNCATION_OVERHEAD;
    out.clear();
    encode_json(
        &EventJson {
            event,
            uri_limit: Some(uri_len.saturating_sub(excess)),
        },
        out,
    )
    .map_err(io::Error::other)?;
    if out.len() > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "an event of {} bytes exceeds --audit-log-truncate-max-event-size even with its requestURI cut",
                out.len()
            ),
        ));
    }
    Ok(())
}
