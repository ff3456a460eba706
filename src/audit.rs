//! The audit log: one `audit.k8s.io/v1` Event per kubelet API request, at level `Metadata`, in the
//! JSON shape kube-apiserver writes, so existing audit pipelines parse it unchanged. Events are
//! queued on the request path and written by one background thread; a full queue drops, never waits.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Uri};
use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::Offset;
use prometheus_client::metrics::counter::Counter;
use ring::rand::{SecureRandom, SystemRandom};
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};
use tokio::sync::{mpsc, watch};
use uuid::{Builder, Uuid};

use crate::authn::User;
use crate::authz::{API_VERSION, RESOURCE, Reason};

pub mod refusals;

/// Events waiting for the writer. Beyond this the writer is far behind and events are dropped
/// (and counted) rather than slowing requests or growing memory without bound.
const QUEUE_CAPACITY: usize = 8192;
/// Pending bytes that trigger a write even while more events are queued; otherwise the writer
/// writes when the queue is empty.
const BATCH_BYTES: usize = 64 * 1024;
/// lumberjack's megabyte, the unit of `--audit-log-maxsize`.
const MEGABYTE: u64 = 1024 * 1024;
/// kube-apiserver truncates longer User-Agent values to this many bytes and marks them.
const MAX_USER_AGENT: usize = 1024;
const USER_AGENT_TRUNCATED: &str = "...TRUNCATED";
/// The mark of a shortened `requestURI`, the same as a shortened User-Agent's.
const TRUNCATED: &str = USER_AGENT_TRUNCATED;
/// What truncating a `requestURI` adds besides the mark: the annotation and its key.
const TRUNCATION_OVERHEAD: usize = r#""audit.k8s.io/truncated":"true","annotations":{},"#.len();
/// At most one log line per this interval about lost events, however many are lost.
const LOSS_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// Mode of a new audit log file: it names every caller, so only its owner reads it.
const NEW_FILE_MODE: u32 = 0o600;
/// Tries at a free backup name, one millisecond apart, before a rotation gives up.
const BACKUP_NAME_TRIES: u32 = 1000;

/// The system random number generator failed. The caller should refuse the request: without it
/// TLS itself is unsafe, and an event without a unique ID cannot be correlated.
#[derive(Debug, thiserror::Error)]
#[error("the system random number generator failed")]
pub struct AuditIdError;

/// A request's audit ID: a random UUID version 4, as kube-apiserver's, so tools that correlate the
/// stages of one request by `auditID` work unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuditId(Uuid);

impl AuditId {
    /// A fresh random ID from the operating system's generator (ring's, the project's one source
    /// of randomness); `uuid` sets the version and variant bits.
    pub fn random() -> Result<AuditId, AuditIdError> {
        let mut bytes = [0u8; 16];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| AuditIdError)?;
        Ok(AuditId(Builder::from_random_bytes(bytes).into_uuid()))
    }
}

impl fmt::Display for AuditId {
    /// Lowercase hex in 8-4-4-4-12 groups, as Go's `uuid.New().String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl Serialize for AuditId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The stage of request handling an event describes. An ordinary request has one event at
/// `ResponseComplete`; an upgraded stream (exec, attach, port-forward) also has one at
/// `ResponseStarted` when the stream starts, so a long session is visible while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The response headers were sent and the stream is open.
    ResponseStarted,
    /// The response is finished (for a stream: the stream ended).
    ResponseComplete,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
        }
    }
}

/// The object a request touched: always the proxy's Node, `nodes/<subresource>` in `v1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// The subresource that was authorized, or the first one asked for when none was.
    pub subresource: &'static str,
    /// The Node name (`--node-name`), shared so the request path never copies it.
    pub name: Arc<str>,
}

/// What authorization concluded, written as kube-apiserver's `authorization.k8s.io/decision` and
/// `authorization.k8s.io/reason` annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    /// Allowed: decision `allow` with the authorizer's reason.
    Allow(Reason),
    /// Refused (403): decision `forbid` with the reason.
    Forbid(Reason),
    /// An authorizer failed (500): no decision, reason `internal error`, as kube-apiserver writes.
    Error,
}

/// One audit record, built on the request path from data the request already holds: shared
/// pointers and cheap clones only, no formatting. It carries no header but User-Agent, so neither
/// a token nor an `Authorization` header can reach the log.
///
/// Serializes as kube-apiserver's `audit.k8s.io/v1` Event at level `Metadata`: same field names,
/// order, `omitempty` behaviour and string escaping.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// Shared by every stage of one request.
    pub id: AuditId,
    /// Which stage this event records.
    pub stage: Stage,
    /// The request's path and query as received (`requestURI`).
    pub request_uri: Uri,
    /// The Kubernetes verb (`get`, `create`, …); empty when the method maps to none.
    pub verb: &'static str,
    /// The authenticated caller; `None` before (or without) authentication, written `"user":{}`.
    pub user: Option<Arc<User>>,
    /// The peer address of the connection (`sourceIPs`); client-supplied forwarding headers are
    /// not trusted.
    pub source_ip: IpAddr,
    /// The User-Agent header, if any; truncated to 1024 bytes when written, as kube-apiserver does.
    pub user_agent: Option<HeaderValue>,
    /// The Node subresource, once the path was mapped.
    pub object_ref: Option<ObjectRef>,
    /// The HTTP status sent to the client (`responseStatus.code`); 101 for a started upgrade.
    pub response_code: u16,
    /// When the request arrived.
    pub request_received: SystemTime,
    /// When this stage was reached.
    pub stage_timestamp: SystemTime,
    /// The authorization outcome; `None` when the request was not authorized at all (401, 301, 400).
    pub authorization: Option<Authorization>,
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
struct EventJson<'a> {
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
struct Annotations<'a> {
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
struct UserInfo<'a>(Option<&'a User>);

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
struct UserAgent<'a>(&'a HeaderValue);

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
        let mut object = serializer.serialize_struct("ObjectReference", 4)?;
        object.serialize_field("resource", RESOURCE)?;
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
struct ResponseStatus(u16);

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

struct EmptyObject;

impl Serialize for EmptyObject {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_map(Some(0))?.end()
    }
}

impl Authorization {
    /// The authorization annotations, keys in Go's (sorted) order.
    fn entries<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        const DECISION: &str = "authorization.k8s.io/decision";
        const REASON: &str = "authorization.k8s.io/reason";
        match self {
            Authorization::Allow(reason) => {
                map.serialize_entry(DECISION, "allow")?;
                map.serialize_entry(REASON, reason_text(reason))
            }
            Authorization::Forbid(reason) => {
                map.serialize_entry(DECISION, "forbid")?;
                map.serialize_entry(REASON, reason_text(reason))
            }
            Authorization::Error => map.serialize_entry(REASON, "internal error"),
        }
    }
}

/// The text of a reason, borrowed: the annotation is written without building a string.
fn reason_text(reason: &Reason) -> &str {
    match reason {
        Reason::Static(text) => text,
        Reason::Shared(text) => text,
    }
}

/// `time` as a date and time of day in UTC. Go's formatting is proleptic Gregorian whatever the
/// year; so is jiff's within its range (years -9999 to 9999), and a clock outside it is written as
/// the nearest bound rather than failing the event.
fn utc(time: SystemTime) -> DateTime {
    let (seconds, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (
            i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            after.subsec_nanos() as i32,
        ),
        Err(before) => {
            let before = before.duration();
            (
                i64::try_from(before.as_secs()).map_or(i64::MIN, |s| -s),
                -(before.subsec_nanos() as i32),
            )
        }
    };
    let timestamp = Timestamp::new(seconds, nanos).unwrap_or(if seconds < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    });
    Offset::UTC.to_datetime(timestamp)
}

/// `metav1.MicroTime` as JSON: RFC 3339 in UTC with exactly six fractional digits, truncated (not
/// rounded) as Go's time formatting does, e.g. `2026-11-22T05:16:00.123456Z`.
struct MicroTime(SystemTime);

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
struct GoJsonFormatter;

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
fn encode_line(event: &AuditEvent, out: &mut Vec<u8>) -> serde_json::Result<()> {
    encode_json(
        &EventJson {
            event,
            uri_limit: None,
        },
        out,
    )
}

fn encode_json(event: &EventJson<'_>, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, GoJsonFormatter);
    event.serialize(&mut serializer)?;
    out.push(b'\n');
    Ok(())
}

/// Writes `event` into `out` (cleared first) as one line of at most `max_bytes`: when the whole
/// event is longer, its `requestURI` is shortened and the event annotated, as kube-apiserver's
/// `--audit-log-truncate-max-event-size` does with request bodies. An event still too long (a
/// user with thousands of groups) is an error: it is dropped and counted, as kube-apiserver does.
fn encode_bounded(event: &AuditEvent, max_bytes: usize, out: &mut Vec<u8>) -> io::Result<()> {
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

/// Where audit events go (`--audit-log-path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// Standard output (`-`), for a log collector that reads the container's output. Each batch
    /// of whole lines is written under the stdout lock, so lines never interleave with other
    /// output of the process.
    Stdout,
    /// A file, created with mode 0600 when missing, appended to when present, rotated as
    /// [`Rotation`] says.
    File(PathBuf),
}

impl AuditTarget {
    /// The target named by `--audit-log-path`: `-` is standard output, anything else a file.
    pub fn from_flag(value: PathBuf) -> AuditTarget {
        if value.as_os_str() == "-" {
            AuditTarget::Stdout
        } else {
            AuditTarget::File(value)
        }
    }
}

/// Checks, without creating, opening or removing anything, that an audit log could be kept at
/// `path`: its directory exists, and the path itself, when present, is not a directory. For
/// commands that only validate (`check-config`, `explain`).
pub fn check_file_target(path: &Path) -> io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if !fs::metadata(directory)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", directory.display()),
        ));
    }
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Size-based rotation of a file target with kube-apiserver's (lumberjack's) semantics: before a
/// line would take the file past `max_size_mb` MiB, the file is renamed to
/// `<stem>-<UTC time as 2006-01-02T15-04-05.000>.<ext>` and a new one started with the old one's
/// mode; then only the newest `max_backups` backups are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rotation {
    /// `--audit-log-maxsize`; 0 never rotates.
    pub max_size_mb: u64,
    /// `--audit-log-maxbackup`; 0 keeps every backup.
    pub max_backups: u32,
}

/// How the audit log is written: rotation, and the largest event (`None`: no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuditOptions {
    /// When the file is rotated and how many backups are kept.
    pub rotation: Rotation,
    /// `--audit-log-truncate-max-event-size` when `--audit-log-truncate-enabled`.
    pub max_event_size: Option<usize>,
}

/// A message to the writer thread.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "queue slots hold events anyway; boxing would cost an allocation per request"
)]
enum Message {
    Event(AuditEvent),
    /// Write what is queued, then stop: sent by [`AuditLog::close`].
    Close,
}

/// The audit log's handle: cheap to clone, one per request handler if need be.
///
/// [`record`](AuditLog::record) only puts the event in a bounded queue; one writer thread drains
/// it, serializes and writes in batches. The thread stops, after writing everything queued, when
/// [`close`](AuditLog::close) is called or every clone is dropped. Events the queue cannot take,
/// and events a write fails to store, are counted in the `dropped` counter given to
/// [`open`](AuditLog::open) and reported in the process log at most once per 10 seconds.
#[derive(Debug, Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<Message>,
    dropped: Counter,
    /// False since the last write (or open, or rotation) failed, true again after one succeeds.
    healthy: Arc<AtomicBool>,
    /// Never sent on: the writer thread drops its sender when it ends, which wakes `close`.
    writer_done: watch::Receiver<()>,
}

impl AuditLog {
    /// Opens the target and starts the writer thread. A file is opened (and created) now, so a bad
    /// `--audit-log-path` fails at start-up; excess backups are removed at once.
    pub fn open(
        target: AuditTarget,
        options: AuditOptions,
        dropped: Counter,
    ) -> io::Result<AuditLog> {
        let sink = match target {
            AuditTarget::Stdout => Sink::Stream(Box::new(io::stdout())),
            AuditTarget::File(path) => Sink::File(RotatingFile::open(path, options.rotation)?),
        };
        AuditLog::start(sink, QUEUE_CAPACITY, options.max_event_size, dropped)
    }

    fn start(
        sink: Sink,
        capacity: usize,
        max_event_size: Option<usize>,
        dropped: Counter,
    ) -> io::Result<AuditLog> {
        let (queue, receiver) = mpsc::channel(capacity);
        let (done, writer_done) = watch::channel(());
        let healthy = Arc::new(AtomicBool::new(true));
        let writer = Writer {
            sink,
            line: Vec::with_capacity(1024),
            max_event_size,
            batch: Batch {
                bytes: Vec::with_capacity(BATCH_BYTES),
                events: 0,
                healthy: Arc::clone(&healthy),
            },
            losses: Losses::new(dropped.clone()),
        };
        // A thread, not an async task: every write, rename and directory listing is a blocking
        // file-system call, and a thread keeps them off the runtime's workers.
        std::thread::Builder::new()
            .name("audit-writer".to_owned())
            .spawn(move || {
                writer.run(receiver);
                drop(done);
            })?;
        Ok(AuditLog {
            queue,
            dropped,
            healthy,
            writer_done,
        })
    }

    /// Whether an event recorded now would be written: the queue has room and the last write
    /// succeeded. What exec, attach and portForward check first when they must be audited
    /// (`--audit-log-require-for-streams`).
    pub fn is_writable(&self) -> bool {
        self.healthy.load(Ordering::Acquire) && self.queue.capacity() > 0
    }

    /// Queues one event. Never blocks and never fails the request: when the queue is full (or the
    /// log is closed) the event is dropped and counted.
    pub fn record(&self, event: AuditEvent) {
        if self.queue.try_send(Message::Event(event)).is_err() {
            self.dropped.inc();
        }
    }

    /// For graceful shutdown: writes every event queued so far, stops the writer and resolves
    /// when it has finished. Events recorded afterwards, through any clone, are dropped and
    /// counted.
    pub fn close(self) -> impl Future<Output = ()> + Send + 'static {
        let AuditLog {
            queue,
            mut writer_done,
            ..
        } = self;
        async move {
            // Fails only when the writer has already stopped, which is what we wait for anyway.
            let _ = queue.send(Message::Close).await;
            drop(queue);
            while writer_done.changed().await.is_ok() {}
        }
    }
}

/// Where the writer puts bytes.
enum Sink {
    /// Standard output (or, in tests, any writer); written with `write_all` + `flush` per batch.
    Stream(Box<dyn Write + Send>),
    File(RotatingFile),
}

/// The writer thread's state: the sink, the batch being built and the loss accounting.
struct Writer {
    sink: Sink,
    /// The event being encoded; reused.
    line: Vec<u8>,
    /// The longest line written; a longer event has its `requestURI` cut.
    max_event_size: Option<usize>,
    /// Whole lines not yet written; all belong to the current file.
    batch: Batch,
    losses: Losses,
}

impl Writer {
    fn run(mut self, mut queue: mpsc::Receiver<Message>) {
        while let Some(first) = queue.blocking_recv() {
            let mut closing = false;
            let mut next = Some(first);
            while let Some(message) = next {
                match message {
                    Message::Event(event) => self.push(&event),
                    Message::Close => {
                        // Refuse new events; those already queued are still received below.
                        queue.close();
                        closing = true;
                    }
                }
                if self.batch.bytes.len() >= BATCH_BYTES {
                    self.flush();
                }
                next = queue.try_recv().ok();
            }
            self.flush();
            self.losses.report(false);
            if closing {
                break;
            }
        }
        self.losses.report(true);
    }

    /// Encodes one event into the batch, rotating the file first when the line would not fit.
    fn push(&mut self, event: &AuditEvent) {
        self.line.clear();
        // An unusually large event must not pin its buffer for the life of the process.
        self.line.shrink_to(BATCH_BYTES);
        let encoded = match self.max_event_size {
            Some(max) => encode_bounded(event, max, &mut self.line),
            None => encode_line(event, &mut self.line).map_err(io::Error::other),
        };
        if let Err(error) = encoded {
            self.losses.lose(1, error);
            return;
        }
        match self.make_room(self.line.len() as u64) {
            Ok(()) => {
                self.batch.bytes.extend_from_slice(&self.line);
                self.batch.events += 1;
            }
            Err(error) => {
                if error.kind() != io::ErrorKind::FileTooLarge {
                    self.batch.healthy.store(false, Ordering::Release);
                }
                self.losses.lose(1, error);
            }
        }
    }

    /// Makes the file ready for a line of `len` bytes: open, and rotated if the line would take
    /// it past the maximum size.
    fn make_room(&mut self, len: u64) -> io::Result<()> {
        let Sink::File(file) = &mut self.sink else {
            return Ok(());
        };
        file.ensure_open()?;
        match file.fit(len) {
            Fit::Fits => {}
            Fit::TooLarge => {
                return Err(io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    format!("an event of {len} bytes exceeds --audit-log-maxsize"),
                ));
            }
            Fit::Rotate => {
                // The batch belongs in the full file: write it there before renaming it.
                self.batch
                    .write_with(&mut self.losses, |bytes| file.write_all(bytes));
                file.rotate()?;
            }
        }
        file.size += len;
        Ok(())
    }

    fn flush(&mut self) {
        match &mut self.sink {
            Sink::Stream(stream) => self.batch.write_with(&mut self.losses, |bytes| {
                stream.write_all(bytes).and_then(|()| stream.flush())
            }),
            Sink::File(file) => self
                .batch
                .write_with(&mut self.losses, |bytes| file.write_all(bytes)),
        }
    }
}

/// Whole lines waiting to be written together.
struct Batch {
    bytes: Vec<u8>,
    /// How many events `bytes` holds, to count them if the write fails.
    events: u64,
    /// Shared with [`AuditLog::is_writable`]: the outcome of the last write.
    healthy: Arc<AtomicBool>,
}

impl Batch {
    /// Writes the batch with `write` and empties it; when the write fails its events are lost.
    fn write_with(&mut self, losses: &mut Losses, write: impl FnOnce(&[u8]) -> io::Result<()>) {
        if self.bytes.is_empty() {
            return;
        }
        let written = write(&self.bytes);
        self.healthy.store(written.is_ok(), Ordering::Release);
        if let Err(error) = written {
            losses.lose(self.events, error);
        }
        self.bytes.clear();
        self.bytes.shrink_to(2 * BATCH_BYTES);
        self.events = 0;
    }
}

/// Counts lost events and reports them in the process log, rate-limited: a full disk must not
/// turn into one log line per request.
struct Losses {
    dropped: Counter,
    /// The counter's value at the last report (or at start).
    reported: u64,
    last_report: Option<Instant>,
    last_error: Option<io::Error>,
}

impl Losses {
    fn new(dropped: Counter) -> Losses {
        Losses {
            reported: dropped.get(),
            dropped,
            last_report: None,
            last_error: None,
        }
    }

    fn lose(&mut self, events: u64, error: io::Error) {
        self.dropped.inc_by(events);
        self.last_error = Some(error);
    }

    /// Logs the losses since the last report (queue full or write errors), unless a report was
    /// made less than [`LOSS_REPORT_INTERVAL`] ago and `force` is false.
    fn report(&mut self, force: bool) {
        let total = self.dropped.get();
        if total <= self.reported {
            return;
        }
        if !force
            && self
                .last_report
                .is_some_and(|at| at.elapsed() < LOSS_REPORT_INTERVAL)
        {
            return;
        }
        let lost = total - self.reported;
        match self.last_error.take() {
            Some(error) => tracing::error!(lost, %error, "audit events lost: write failed"),
            None => tracing::warn!(lost, "audit events lost: the audit queue was full"),
        }
        self.reported = total;
        self.last_report = Some(Instant::now());
    }
}

/// Whether a line fits in the current file.
enum Fit {
    Fits,
    /// Rotate first, then write.
    Rotate,
    /// Larger than the maximum size on its own: lumberjack refuses such a write.
    TooLarge,
}

/// The audit file with lumberjack's size-based rotation.
struct RotatingFile {
    path: PathBuf,
    /// `None` after a failed write or rotation: reopened before the next event.
    file: Option<File>,
    /// Bytes in the file, including those pending in the writer's batch.
    size: u64,
    /// In bytes; 0 never rotates.
    max_size: u64,
    max_backups: u32,
}

impl RotatingFile {
    fn open(path: PathBuf, rotation: Rotation) -> io::Result<RotatingFile> {
        if path.file_name().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("audit log path {} names no file", path.display()),
            ));
        }
        let mut file = RotatingFile {
            path,
            file: None,
            size: 0,
            max_size: rotation.max_size_mb.saturating_mul(MEGABYTE),
            max_backups: rotation.max_backups,
        };
        file.ensure_open()?;
        file.remove_old_backups();
        Ok(file)
    }

    /// Opens the file for appending (creating it 0600) unless it is open.
    fn ensure_open(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .create(true)
                .mode(NEW_FILE_MODE)
                .open(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
        }
        Ok(())
    }

    fn fit(&self, len: u64) -> Fit {
        if self.max_size == 0 {
            Fit::Fits
        } else if len > self.max_size {
            Fit::TooLarge
        } else if self.size + len > self.max_size {
            Fit::Rotate
        } else {
            Fit::Fits
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let written = match &mut self.file {
            Some(file) => file.write_all(bytes),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the audit log file is not open",
            )),
        };
        if written.is_err() {
            self.file = None;
        }
        written
    }

    /// Renames the file to a backup name, starts a new one with the same mode, and removes the
    /// backups beyond `max_backups`. On failure the file is left closed, to be reopened (and
    /// rotation retried) at the next event.
    fn rotate(&mut self) -> io::Result<()> {
        let mode = match self.file.take() {
            Some(file) => file.metadata()?.permissions().mode() & 0o777,
            None => NEW_FILE_MODE,
        };
        let backup = self.free_backup_name(SystemTime::now())?;
        fs::rename(&self.path, &backup)?;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&self.path)?;
        self.file = Some(file);
        self.size = 0;
        self.remove_old_backups();
        Ok(())
    }

    /// The backup name for `now`, or the first free one a millisecond later: lumberjack would
    /// overwrite an existing backup, which would destroy audit records.
    fn free_backup_name(&self, now: SystemTime) -> io::Result<PathBuf> {
        for step in 0..BACKUP_NAME_TRIES {
            let candidate = backup_path(&self.path, now + Duration::from_millis(step.into()));
            if !candidate.try_exists()? {
                return Ok(candidate);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free audit log backup name",
        ))
    }

    /// lumberjack's cleanup: among the files named `<stem>-<timestamp><ext>` next to the log,
    /// keeps the `max_backups` newest by the time in their name and removes the rest. Failures
    /// are logged; they never stop the log.
    fn remove_old_backups(&self) {
        if self.max_backups == 0 {
            return;
        }
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot list audit log backups");
                return;
            }
        };
        let Some(name) = self.path.file_name() else {
            return;
        };
        let (stem, ext) = split_extension(name.as_bytes());
        let mut backups: Vec<(Vec<u8>, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|t| !t.is_dir()))
            .filter_map(|entry| {
                let name = entry.file_name().into_vec();
                let stamp = backup_timestamp(&name, stem, ext)?.to_vec();
                Some((stamp, entry.path()))
            })
            .collect();
        // The timestamps are fixed-width and zero-padded: byte order is time order.
        backups.sort_unstable_by(|a, b| b.cmp(a));
        for (_, old) in backups.iter().skip(self.max_backups as usize) {
            if let Err(error) = fs::remove_file(old) {
                tracing::warn!(file = %old.display(), %error, "cannot remove old audit log backup");
            }
        }
    }
}

/// Splits a file name as Go's `filepath.Ext`: the extension starts at the last dot.
fn split_extension(name: &[u8]) -> (&[u8], &[u8]) {
    match name.iter().rposition(|&b| b == b'.') {
        Some(dot) => name.split_at(dot),
        None => (name, &[]),
    }
}

/// `<dir>/<stem>-<2006-01-02T15-04-05.000 in UTC><ext>`, lumberjack's backup name.
fn backup_path(path: &Path, time: SystemTime) -> PathBuf {
    let name = path.file_name().map_or(&[][..], |n| n.as_bytes());
    let (stem, ext) = split_extension(name);
    let t = utc(time);
    let stamp = format!(
        "-{:04}-{:02}-{:02}T{:02}-{:02}-{:02}.{:03}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.subsec_nanosecond() / 1_000_000
    );
    let mut backup = Vec::with_capacity(name.len() + stamp.len());
    backup.extend_from_slice(stem);
    backup.extend_from_slice(stamp.as_bytes());
    backup.extend_from_slice(ext);
    path.with_file_name(std::ffi::OsString::from_vec(backup))
}

/// The timestamp part of a backup file name, when `name` is `<stem>-<timestamp><ext>`.
fn backup_timestamp<'a>(name: &'a [u8], stem: &[u8], ext: &[u8]) -> Option<&'a [u8]> {
    const SHAPE: &[u8] = b"0000-00-00T00-00-00.000";
    let stamp = name
        .strip_prefix(stem)?
        .strip_prefix(b"-")?
        .strip_suffix(ext)?;
    let well_formed = stamp.len() == SHAPE.len()
        && stamp.iter().zip(SHAPE).all(|(&c, &shape)| {
            if shape == b'0' {
                c.is_ascii_digit()
            } else {
                c == shape
            }
        });
    well_formed.then_some(stamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::sync::Mutex;
    use std::sync::mpsc as std_mpsc;

    use serde_json::{Value, json};

    const WAIT: Duration = Duration::from_secs(10);

    /// A fresh, empty directory for one test.
    fn rotating(rotation: Rotation) -> AuditOptions {
        AuditOptions {
            rotation,
            max_event_size: None,
        }
    }

    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kubelet-auth-proxy-audit-{}-{test}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn at(secs: i64, nanos: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
                + Duration::from_nanos(nanos.into())
        }
    }

    fn node_user() -> User {
        User {
            name: "system:node:node-1".to_owned(),
            uid: "9f6e1c2a".to_owned(),
            groups: vec!["system:nodes".to_owned(), "system:authenticated".to_owned()],
            extra: BTreeMap::from([(
                "authentication.kubernetes.io/credential-id".to_owned(),
                vec!["X509SHA256=4f2a".to_owned()],
            )]),
        }
    }

    fn sample(uri: &str) -> AuditEvent {
        AuditEvent {
            id: AuditId(Uuid::from_bytes([
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x46, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff,
            ])),
            stage: Stage::ResponseComplete,
            request_uri: uri.parse().unwrap(),
            verb: "get",
            user: Some(Arc::new(node_user())),
            source_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)),
            user_agent: Some(HeaderValue::from_static("kubectl/v1.34.0 (linux/amd64)")),
            object_ref: Some(ObjectRef {
                subresource: "proxy",
                name: Arc::from("node-1"),
            }),
            response_code: 200,
            request_received: at(1_795_324_560, 123_456_789),
            stage_timestamp: at(1_795_324_560, 130_000_000),
            authorization: Some(Authorization::Allow(Reason::Static(
                "RBAC: allowed by ClusterRoleBinding \"node-proxier\"",
            ))),
        }
    }

    fn line(event: &AuditEvent) -> String {
        let mut out = Vec::new();
        encode_line(event, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn parse(event: &AuditEvent) -> Value {
        let line = line(event);
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        serde_json::from_str(&line).unwrap()
    }

    /// The `requestURI` of every line of a log, in order.
    fn uris(log: &[u8]) -> Vec<String> {
        std::str::from_utf8(log)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["requestURI"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    #[test]
    fn event_serializes_as_a_kube_apiserver_metadata_event() {
        let event = sample("https://node-1:10250/logs/kubelet.log?tail=10");
        assert_eq!(
            parse(&event),
            json!({
                "kind": "Event",
                "apiVersion": "audit.k8s.io/v1",
                "level": "Metadata",
                "auditID": "00112233-4455-4677-8899-aabbccddeeff",
                "stage": "ResponseComplete",
                "requestURI": "/logs/kubelet.log?tail=10",
                "verb": "get",
                "user": {
                    "username": "system:node:node-1",
                    "uid": "9f6e1c2a",
                    "groups": ["system:nodes", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=4f2a"]}
                },
                "sourceIPs": ["10.0.0.7"],
                "userAgent": "kubectl/v1.34.0 (linux/amd64)",
                "objectRef": {
                    "resource": "nodes",
                    "name": "node-1",
                    "apiVersion": "v1",
                    "subresource": "proxy"
                },
                "responseStatus": {"metadata": {}, "code": 200},
                "requestReceivedTimestamp": "2026-11-22T05:16:00.123456Z",
                "stageTimestamp": "2026-11-22T05:16:00.130000Z",
                "annotations": {
                    "authorization.k8s.io/decision": "allow",
                    "authorization.k8s.io/reason": "RBAC: allowed by ClusterRoleBinding \"node-proxier\""
                }
            })
        );
        // Go's field order, byte for byte.
        let keys = [
            "kind",
            "apiVersion",
            "level",
            "auditID",
            "stage",
            "requestURI",
            "verb",
            "user",
            "sourceIPs",
            "userAgent",
            "objectRef",
            "responseStatus",
            "requestReceivedTimestamp",
            "stageTimestamp",
            "annotations",
        ];
        let text = line(&event);
        let positions: Vec<usize> = keys
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(positions.is_sorted(), "{text}");
        assert!(text.starts_with(
            r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"#
        ));
        assert!(text.contains(
            r#""objectRef":{"resource":"nodes","name":"node-1","apiVersion":"v1","subresource":"proxy"}"#
        ));
    }

    #[test]
    fn event_before_authentication_has_an_empty_user_and_omits_empty_fields() {
        let event = AuditEvent {
            verb: "",
            user: None,
            user_agent: None,
            object_ref: None,
            response_code: 401,
            authorization: None,
            ..sample("/pods")
        };
        assert_eq!(
            parse(&event),
            json!({
                "kind": "Event",
                "apiVersion": "audit.k8s.io/v1",
                "level": "Metadata",
                "auditID": "00112233-4455-4677-8899-aabbccddeeff",
                "stage": "ResponseComplete",
                "requestURI": "/pods",
                "verb": "",
                "user": {},
                "sourceIPs": ["10.0.0.7"],
                "responseStatus": {"metadata": {}, "code": 401},
                "requestReceivedTimestamp": "2026-11-22T05:16:00.123456Z",
                "stageTimestamp": "2026-11-22T05:16:00.130000Z"
            })
        );
        // An empty User-Agent header is omitted too, as Go's omitempty does.
        let empty_agent = AuditEvent {
            user_agent: Some(HeaderValue::from_static("")),
            ..sample("/pods")
        };
        assert!(parse(&empty_agent).get("userAgent").is_none());
    }

    #[test]
    fn user_fields_are_omitted_when_empty() {
        let no_uid_no_extra = User {
            uid: String::new(),
            extra: BTreeMap::new(),
            ..node_user()
        };
        let event = AuditEvent {
            user: Some(Arc::new(no_uid_no_extra)),
            ..sample("/pods")
        };
        assert_eq!(
            parse(&event)["user"],
            json!({"username": "system:node:node-1", "groups": ["system:nodes", "system:authenticated"]})
        );

        let anonymous = AuditEvent {
            user: Some(Arc::new(User::anonymous())),
            ..sample("/pods")
        };
        assert_eq!(
            parse(&anonymous)["user"],
            json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
        );
    }

    #[test]
    fn authorization_annotations_match_kube_apiserver() {
        let cases = [
            (
                Authorization::Forbid(Reason::Static("no RBAC policy matched")),
                json!({
                    "authorization.k8s.io/decision": "forbid",
                    "authorization.k8s.io/reason": "no RBAC policy matched"
                }),
            ),
            (
                Authorization::Allow(Reason::Shared(Arc::from(""))),
                json!({"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": ""}),
            ),
            (
                Authorization::Error,
                json!({"authorization.k8s.io/reason": "internal error"}),
            ),
        ];
        for (authorization, expected) in cases {
            let event = AuditEvent {
                authorization: Some(authorization),
                ..sample("/pods")
            };
            assert_eq!(parse(&event)["annotations"], expected);
        }
    }

    #[test]
    fn started_stream_events_have_their_stage_and_code() {
        let event = AuditEvent {
            stage: Stage::ResponseStarted,
            verb: "create",
            response_code: 101,
            ..sample("/exec/default/web/app?command=sh&stdin=true")
        };
        let v = parse(&event);
        assert_eq!(v["stage"], "ResponseStarted");
        assert_eq!(v["verb"], "create");
        assert_eq!(v["responseStatus"], json!({"metadata": {}, "code": 101}));
    }

    #[test]
    fn strings_are_escaped_as_go_encoding_json_does() {
        let user = User {
            name: "<script>&\u{2028}\u{2029}\"\n\u{1}é".to_owned(),
            ..User::default()
        };
        let event = AuditEvent {
            user: Some(Arc::new(user)),
            ..sample("/run/ns/pod/c?cmd=ls&x=1")
        };
        let text = line(&event);
        assert!(
            text.contains(r#""username":"\u003cscript\u003e\u0026\u2028\u2029\"\n\u0001é""#),
            "{text}"
        );
        assert!(
            text.contains(r#""requestURI":"/run/ns/pod/c?cmd=ls\u0026x=1""#),
            "{text}"
        );
        let v = parse(&event);
        assert_eq!(v["user"]["username"], "<script>&\u{2028}\u{2029}\"\n\u{1}é");
    }

    #[test]
    fn a_long_request_uri_is_cut_to_the_event_bound_and_annotated() {
        let short = sample("/pods?x=1");
        let mut out = Vec::new();
        encode_bounded(&short, 4096, &mut out).unwrap();
        assert_eq!(out, line(&short).into_bytes(), "short events are untouched");

        let mut long = sample(&format!("/pods?q={}é", "a".repeat(9000)));
        long.authorization = Some(Authorization::Allow(Reason::Static("allowed")));
        encode_bounded(&long, 4096, &mut out).unwrap();
        assert!(out.len() <= 4096, "{} bytes", out.len());
        let event: Value = serde_json::from_slice(&out).unwrap();
        let uri = event["requestURI"].as_str().unwrap();
        assert!(
            uri.starts_with("/pods?q=aaa") && uri.ends_with("...TRUNCATED"),
            "{uri}"
        );
        let annotations: Vec<&String> = event["annotations"].as_object().unwrap().keys().collect();
        assert_eq!(
            annotations,
            [
                "audit.k8s.io/truncated",
                "authorization.k8s.io/decision",
                "authorization.k8s.io/reason"
            ]
        );
        assert_eq!(event["annotations"]["audit.k8s.io/truncated"], "true");

        let huge_user = AuditEvent {
            user: Some(Arc::new(User {
                name: "u".repeat(8192),
                ..User::default()
            })),
            ..sample("/pods")
        };
        let error = encode_bounded(&huge_user, 4096, &mut out).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("--audit-log-truncate-max-event-size")
        );
    }

    #[test]
    fn user_agent_is_truncated_and_made_valid_utf8_like_kube_apiserver() {
        let with_agent = |agent: HeaderValue| {
            let event = AuditEvent {
                user_agent: Some(agent),
                ..sample("/pods")
            };
            parse(&event)["userAgent"].as_str().unwrap().to_owned()
        };
        let exact = "a".repeat(MAX_USER_AGENT);
        assert_eq!(with_agent(HeaderValue::from_str(&exact).unwrap()), exact);
        let long = "b".repeat(MAX_USER_AGENT + 1);
        assert_eq!(
            with_agent(HeaderValue::from_str(&long).unwrap()),
            format!("{}...TRUNCATED", "b".repeat(MAX_USER_AGENT))
        );
        assert_eq!(
            with_agent(HeaderValue::from_bytes(b"curl/\xff8").unwrap()),
            "curl/\u{fffd}8"
        );
    }

    #[test]
    fn source_ip_is_written_as_go_prints_it() {
        let cases = [
            (
                IpAddr::V6(Ipv4Addr::new(192, 0, 2, 9).to_ipv6_mapped()),
                "192.0.2.9",
            ),
            (
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
                "2001:db8::1",
            ),
            (IpAddr::V4(Ipv4Addr::LOCALHOST), "127.0.0.1"),
        ];
        for (ip, expected) in cases {
            let event = AuditEvent {
                source_ip: ip,
                ..sample("/pods")
            };
            assert_eq!(parse(&event)["sourceIPs"], json!([expected]), "{ip}");
        }
    }

    #[test]
    fn timestamps_are_rfc3339_microseconds_in_utc() {
        let cases = [
            (at(0, 0), "1970-01-01T00:00:00.000000Z"),
            (
                at(1_709_210_096, 123_456_000),
                "2024-02-29T12:34:56.123456Z",
            ),
            (at(951_782_400, 0), "2000-02-29T00:00:00.000000Z"),
            (at(4_107_456_000, 0), "2100-02-28T00:00:00.000000Z"),
            (at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z"),
            (
                at(1_795_324_560, 123_456_789),
                "2026-11-22T05:16:00.123456Z",
            ),
            // Truncated as Go formats, never rounded up into the next second (or year).
            (at(946_684_799, 999_999_999), "1999-12-31T23:59:59.999999Z"),
            (at(0, 999), "1970-01-01T00:00:00.000000Z"),
            // Before the epoch.
            (at(-1, 500_000_000), "1969-12-31T23:59:59.500000Z"),
            (at(-11_670_912_000, 0), "1600-03-01T00:00:00.000000Z"),
        ];
        for (time, expected) in cases {
            assert_eq!(MicroTime(time).to_string(), expected);
        }
    }

    #[test]
    fn audit_ids_are_random_uuid_v4() {
        let ids: Vec<String> = (0..64)
            .map(|_| AuditId::random().unwrap().to_string())
            .collect();
        for id in &ids {
            assert_eq!(id.len(), 36, "{id}");
            for (i, c) in id.chars().enumerate() {
                match i {
                    8 | 13 | 18 | 23 => assert_eq!(c, '-', "{id}"),
                    14 => assert_eq!(c, '4', "version of {id}"),
                    19 => assert!(matches!(c, '8' | '9' | 'a' | 'b'), "variant of {id}"),
                    _ => assert!(matches!(c, '0'..='9' | 'a'..='f'), "{id}"),
                }
            }
        }
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
    }

    #[test]
    fn backup_names_follow_lumberjack() {
        let time = at(1_795_324_560, 123_999_999);
        let cases = [
            (
                "/var/log/audit.log",
                "/var/log/audit-2026-11-22T05-16-00.123.log",
            ),
            ("/var/log/audit", "/var/log/audit-2026-11-22T05-16-00.123"),
            ("kube.audit.json", "kube.audit-2026-11-22T05-16-00.123.json"),
        ];
        for (path, expected) in cases {
            assert_eq!(backup_path(Path::new(path), time), Path::new(expected));
        }

        let (stem, ext) = split_extension(b"audit.log");
        assert_eq!(
            backup_timestamp(b"audit-2026-11-22T05-16-00.123.log", stem, ext),
            Some(&b"2026-11-22T05-16-00.123"[..])
        );
        for other in [
            &b"audit.log"[..],
            b"audit-notes.log",
            b"audit-2026-11-22T05-16-00.123.log.gz",
            b"audit-2026-11-22T05:16:00.123.log",
            b"other-2026-11-22T05-16-00.123.log",
            b"audit-2026-11-22T05-16-00.123.txt",
        ] {
            assert_eq!(
                backup_timestamp(other, stem, ext),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn target_flag_dash_is_stdout() {
        assert_eq!(AuditTarget::from_flag("-".into()), AuditTarget::Stdout);
        assert_eq!(
            AuditTarget::from_flag("/var/log/kap/audit.log".into()),
            AuditTarget::File("/var/log/kap/audit.log".into())
        );
    }

    #[tokio::test]
    async fn a_new_file_is_owner_only_and_an_existing_one_is_appended_to() {
        let dir = temp_dir("create");
        let path = dir.join("audit.log");
        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            AuditOptions::default(),
            Counter::default(),
        )
        .unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        log.record(sample("/first"));
        tokio::time::timeout(WAIT, log.close()).await.unwrap();

        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            AuditOptions::default(),
            Counter::default(),
        )
        .unwrap();
        log.record(sample("/second"));
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert_eq!(uris(&fs::read(&path).unwrap()), ["/first", "/second"]);

        let missing_dir = AuditLog::open(
            AuditTarget::File(dir.join("no-such-dir/audit.log")),
            AuditOptions::default(),
            Counter::default(),
        );
        assert!(missing_dir.is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn rotation_renames_full_files_and_keeps_the_newest_backups() {
        let dir = temp_dir("rotate");
        let path = dir.join("audit.log");
        let dropped = Counter::default();
        let rotation = Rotation {
            max_size_mb: 1,
            max_backups: 2,
        };
        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            rotating(rotation),
            dropped.clone(),
        )
        .unwrap();
        // A mode no umask narrows: the new file after a rotation must carry the old file's mode.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).unwrap();

        let padding = "p".repeat(4000);
        let events = 1100; // about 4.8 MiB: four rotations
        for n in 0..events {
            log.record(sample(&format!("/stats/summary?n={n:05}&pad={padding}")));
        }
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert_eq!(dropped.get(), 0);

        let mut backups = Vec::new();
        for entry in fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name != "audit.log" {
                assert!(
                    backup_timestamp(name.as_bytes(), b"audit", b".log").is_some(),
                    "unexpected file {name}"
                );
                backups.push(name);
            }
        }
        assert_eq!(backups.len(), 2, "{backups:?}");
        backups.sort();

        let line_len = line(&sample(&format!("/stats/summary?n=00000&pad={padding}"))).len() as u64;
        let mut seen = Vec::new();
        for name in &backups {
            let content = fs::read(dir.join(name)).unwrap();
            let size = content.len() as u64;
            assert!(
                size <= MEGABYTE && size > MEGABYTE - line_len,
                "{name}: {size}"
            );
            seen.extend(uris(&content));
        }
        let current = fs::read(&path).unwrap();
        assert!(current.len() as u64 <= MEGABYTE);
        seen.extend(uris(&current));
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o400
        );

        // The kept files hold the newest events, contiguous and in order, up to the last one.
        let numbers: Vec<usize> = seen
            .iter()
            .map(|uri| uri["/stats/summary?n=".len()..][..5].parse().unwrap())
            .collect();
        let first = events - numbers.len();
        assert!(first > 0, "older backups were removed");
        assert_eq!(numbers, (first..events).collect::<Vec<_>>());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn opening_removes_excess_backups_and_nothing_else() {
        let dir = temp_dir("cleanup");
        let path = dir.join("audit.log");
        let backups: Vec<String> = (1..=5)
            .map(|day| format!("audit-2026-01-0{day}T00-00-00.000.log"))
            .collect();
        let others = [
            "audit-notes.log",
            "audit.log.1",
            "other-2026-01-01T00-00-00.000.log",
            "audit-2026-01-01T00-00-00.000.log.gz",
        ];
        for name in backups.iter().map(String::as_str).chain(others) {
            fs::write(dir.join(name), "old\n").unwrap();
        }
        let present = |name: &str| dir.join(name).exists();

        let keep_all = Rotation {
            max_size_mb: 1,
            max_backups: 0,
        };
        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            rotating(keep_all),
            Counter::default(),
        )
        .unwrap();
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert!(backups.iter().all(|b| present(b)));

        let keep_two = Rotation {
            max_size_mb: 1,
            max_backups: 2,
        };
        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            rotating(keep_two),
            Counter::default(),
        )
        .unwrap();
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        let kept: Vec<&String> = backups.iter().filter(|b| present(b)).collect();
        assert_eq!(kept, [&backups[3], &backups[4]]);
        assert!(others.iter().all(|o| present(o)));
        assert!(present("audit.log"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_event_larger_than_the_maximum_size_is_dropped_and_counted() {
        let dir = temp_dir("oversized");
        let path = dir.join("audit.log");
        let dropped = Counter::default();
        let rotation = Rotation {
            max_size_mb: 1,
            max_backups: 0,
        };
        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            rotating(rotation),
            dropped.clone(),
        )
        .unwrap();
        let huge = User {
            name: "u".repeat(MEGABYTE as usize + 1),
            ..User::default()
        };
        log.record(sample("/before"));
        log.record(AuditEvent {
            user: Some(Arc::new(huge)),
            ..sample("/huge")
        });
        log.record(sample("/after"));
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert_eq!(dropped.get(), 1);
        assert_eq!(uris(&fs::read(&path).unwrap()), ["/before", "/after"]);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "no rotation");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Bytes written to a stream sink, readable by the test.
    #[derive(Clone, Default)]
    struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

    impl SharedBuffer {
        fn contents(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    impl Write for SharedBuffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A slow target: each write announces itself, then waits until the gate opens.
    struct GatedWriter {
        out: SharedBuffer,
        entered: std_mpsc::Sender<()>,
        gate: std_mpsc::Receiver<()>,
    }

    impl Write for GatedWriter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.entered.send(());
            // Returns at once when the test dropped its sender: the gate is open for good.
            let _ = self.gate.recv();
            self.out.write(buf)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_blocking() {
        let (entered_tx, entered) = std_mpsc::channel();
        let (open_gate, gate) = std_mpsc::channel();
        let out = SharedBuffer::default();
        let writer = GatedWriter {
            out: out.clone(),
            entered: entered_tx,
            gate,
        };
        let dropped = Counter::default();
        let log =
            AuditLog::start(Sink::Stream(Box::new(writer)), 1, None, dropped.clone()).unwrap();

        log.record(sample("/0"));
        // The writer now holds event 0 in a blocked write, and the queue is empty.
        entered.recv_timeout(WAIT).unwrap();
        log.record(sample("/1")); // fills the queue of one
        log.record(sample("/2"));
        log.record(sample("/3"));
        assert_eq!(dropped.get(), 2);

        drop(open_gate);
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert_eq!(uris(&out.contents()), ["/0", "/1"]);
        assert_eq!(dropped.get(), 2);
    }

    struct FailingWriter;

    impl Write for FailingWriter {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk on fire"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn failed_writes_are_counted_and_never_reach_the_caller() {
        let dropped = Counter::default();
        let log = AuditLog::start(
            Sink::Stream(Box::new(FailingWriter)),
            16,
            None,
            dropped.clone(),
        )
        .unwrap();
        for n in 0..5 {
            log.record(sample(&format!("/{n}")));
        }
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert_eq!(dropped.get(), 5);
    }

    #[tokio::test]
    async fn close_writes_everything_queued_then_refuses_new_events() {
        let dir = temp_dir("close");
        let path = dir.join("audit.log");
        let dropped = Counter::default();
        let log = AuditLog::open(
            AuditTarget::File(path.clone()),
            AuditOptions::default(),
            dropped.clone(),
        )
        .unwrap();
        let survivor = log.clone();
        let expected: Vec<String> = (0..3000).map(|n| format!("/pods?n={n}")).collect();
        for uri in &expected {
            log.record(sample(uri));
        }
        // Returns although a clone is still alive.
        tokio::time::timeout(WAIT, log.close()).await.unwrap();
        assert_eq!(uris(&fs::read(&path).unwrap()), expected);
        assert_eq!(dropped.get(), 0);

        survivor.record(sample("/late"));
        assert_eq!(dropped.get(), 1);
        assert_eq!(uris(&fs::read(&path).unwrap()).len(), expected.len());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn dropping_every_clone_stops_the_writer_after_writing() {
        let out = SharedBuffer::default();
        let log = AuditLog::start(
            Sink::Stream(Box::new(out.clone())),
            QUEUE_CAPACITY,
            None,
            Counter::default(),
        )
        .unwrap();
        let mut writer_done = log.writer_done.clone();
        let other = log.clone();
        log.record(sample("/a"));
        other.record(sample("/b"));
        drop(log);
        drop(other);
        let stopped = tokio::time::timeout(WAIT, writer_done.changed()).await;
        assert!(matches!(stopped, Ok(Err(_))), "the writer thread ended");
        assert_eq!(uris(&out.contents()), ["/a", "/b"]);
    }
}
