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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Uri};
use prometheus_client::metrics::counter::Counter;
use ring::rand::{SecureRandom, SystemRandom};
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};
use tokio::sync::{mpsc, watch};

use crate::authn::User;
use crate::authz::{API_VERSION, RESOURCE, Reason};

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

/// A request's audit ID: 128 random bits shown as a UUID version 4, as kube-apiserver's, so tools
/// that correlate the stages of one request by `auditID` work unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuditId([u8; 16]);

impl AuditId {
    /// A fresh random ID from the operating system's generator.
    pub fn random() -> Result<AuditId, AuditIdError> {
        let mut bytes = [0u8; 16];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| AuditIdError)?;
        // RFC 9562: version 4 in the high nibble of byte 6, variant 0b10 in the top bits of byte 8.
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Ok(AuditId(bytes))
    }
}

impl fmt::Display for AuditId {
    /// Lowercase hex in 8-4-4-4-12 groups, as Go's `uuid.New().String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
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
        let mut event = serializer.serialize_struct("Event", 15)?;
        event.serialize_field("kind", "Event")?;
        event.serialize_field("apiVersion", "audit.k8s.io/v1")?;
        event.serialize_field("level", "Metadata")?;
        event.serialize_field("auditID", &self.id)?;
        event.serialize_field("stage", self.stage.as_str())?;
        let uri = self.request_uri.path_and_query().map_or("", |pq| pq.as_str());
        event.serialize_field("requestURI", uri)?;
        event.serialize_field("verb", self.verb)?;
        event.serialize_field("user", &UserInfo(self.user.as_deref()))?;
        // Go prints an IPv4-mapped IPv6 address in its IPv4 form.
        event.serialize_field("sourceIPs", &[self.source_ip.to_canonical()])?;
        if let Some(agent) = self.user_agent.as_ref().filter(|ua| !ua.is_empty()) {
            event.serialize_field("userAgent", &UserAgent(agent))?;
        }
        if let Some(object) = &self.object_ref {
            event.serialize_field("objectRef", object)?;
        }
        event.serialize_field("responseStatus", &ResponseStatus(self.response_code))?;
        event.serialize_field("requestReceivedTimestamp", &MicroTime(self.request_received))?;
        event.serialize_field("stageTimestamp", &MicroTime(self.stage_timestamp))?;
        if let Some(authorization) = &self.authorization {
            event.serialize_field("annotations", authorization)?;
        }
        event.end()
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

impl Serialize for Authorization {
    /// The annotations map, keys in Go's (sorted) order.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        const DECISION: &str = "authorization.k8s.io/decision";
        const REASON: &str = "authorization.k8s.io/reason";
        let mut map = serializer.serialize_map(None)?;
        match self {
            Authorization::Allow(reason) => {
                map.serialize_entry(DECISION, "allow")?;
                map.serialize_entry(REASON, reason_text(reason))?;
            }
            Authorization::Forbid(reason) => {
                map.serialize_entry(DECISION, "forbid")?;
                map.serialize_entry(REASON, reason_text(reason))?;
            }
            Authorization::Error => map.serialize_entry(REASON, "internal error")?,
        }
        map.end()
    }
}

/// The text of a reason, borrowed: the annotation is written without building a string.
fn reason_text(reason: &Reason) -> &str {
    match reason {
        Reason::Static(text) => text,
        Reason::Shared(text) => text,
    }
}

/// A UTC calendar time, split from a `SystemTime` without any date library.
#[derive(Debug, PartialEq, Eq)]
struct CivilTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    nanos: u32,
}

impl CivilTime {
    fn from_system_time(time: SystemTime) -> CivilTime {
        let (secs, nanos) = match time.duration_since(UNIX_EPOCH) {
            Ok(after) => (
                i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
                after.subsec_nanos(),
            ),
            Err(before) => {
                let before = before.duration();
                let secs = i64::try_from(before.as_secs()).map_or(i64::MIN, |s| -s);
                match before.subsec_nanos() {
                    0 => (secs, 0),
                    n => (secs.saturating_sub(1), 1_000_000_000 - n),
                }
            }
        };
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        // rem_euclid of 86 400 is in 0..86 400, so it fits a u32.
        let of_day = secs.rem_euclid(86_400) as u32;
        CivilTime {
            year,
            month,
            day,
            hour: of_day / 3600,
            minute: of_day / 60 % 60,
            second: of_day % 60,
            nanos,
        }
    }
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`: 400-year eras of 146 097 days, years starting on March 1st).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097); // [0, 146096]
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365; // [0, 399]
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // [0, 365]
    let shifted_month = (5 * day_of_year + 2) / 153; // [0, 11], March = 0
    // Both results are small and positive by the ranges above.
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = (if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    }) as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `metav1.MicroTime` as JSON: RFC 3339 in UTC with exactly six fractional digits, truncated (not
/// rounded) as Go's time formatting does, e.g. `2026-11-22T05:16:00.123456Z`.
struct MicroTime(SystemTime);

impl fmt::Display for MicroTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = CivilTime::from_system_time(self.0);
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year,
            t.month,
            t.day,
            t.hour,
            t.minute,
            t.second,
            t.nanos / 1000
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
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, GoJsonFormatter);
    event.serialize(&mut serializer)?;
    out.push(b'\n');
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
    /// Never sent on: the writer thread drops its sender when it ends, which wakes `close`.
    writer_done: watch::Receiver<()>,
}

impl AuditLog {
    /// Opens the target and starts the writer thread. A file is opened (and created) now, so a bad
    /// `--audit-log-path` fails at start-up; excess backups are removed at once.
    pub fn open(
        target: AuditTarget,
        rotation: Rotation,
        dropped: Counter,
    ) -> io::Result<AuditLog> {
        let sink = match target {
            AuditTarget::Stdout => Sink::Stream(Box::new(io::stdout())),
            AuditTarget::File(path) => Sink::File(RotatingFile::open(path, rotation)?),
        };
        AuditLog::start(sink, QUEUE_CAPACITY, dropped)
    }

    fn start(sink: Sink, capacity: usize, dropped: Counter) -> io::Result<AuditLog> {
        let (queue, receiver) = mpsc::channel(capacity);
        let (done, writer_done) = watch::channel(());
        let writer = Writer {
            sink,
            line: Vec::with_capacity(1024),
            pending: Vec::with_capacity(BATCH_BYTES),
            pending_events: 0,
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
            writer_done,
        })
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
    /// Whole lines not yet written; all belong to the current file.
    pending: Vec<u8>,
    /// How many events `pending` holds, to count them if the write fails.
    pending_events: u64,
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
                if self.pending.len() >= BATCH_BYTES {
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
        if let Err(error) = encode_line(event, &mut self.line) {
            self.losses.lose(1, io::Error::other(error));
            return;
        }
        let len = self.line.len() as u64;
        if let Sink::File(file) = &mut self.sink {
            if let Err(error) = file.ensure_open() {
                self.losses.lose(1, error);
                return;
            }
            match file.fit(len) {
                Fit::Fits => {}
                Fit::TooLarge => {
                    let error = io::Error::new(
                        io::ErrorKind::FileTooLarge,
                        format!("an event of {len} bytes exceeds --audit-log-maxsize"),
                    );
                    self.losses.lose(1, error);
                    return;
                }
                Fit::Rotate => {
                    self.flush();
                    if let Sink::File(file) = &mut self.sink
                        && let Err(error) = file.rotate()
                    {
                        self.losses.lose(1, error);
                        return;
                    }
                }
            }
            if let Sink::File(file) = &mut self.sink {
                file.size += len;
            }
        }
        self.pending.extend_from_slice(&self.line);
        self.pending_events += 1;
    }

    /// Writes the batch. On failure its events are counted as lost, and a file is reopened (and
    /// re-measured) before the next event.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let written = match &mut self.sink {
            Sink::Stream(stream) => stream.write_all(&self.pending).and_then(|()| stream.flush()),
            Sink::File(file) => file.write_all(&self.pending),
        };
        if let Err(error) = written {
            self.losses.lose(self.pending_events, error);
        }
        self.pending.clear();
        self.pending_events = 0;
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
    let t = CivilTime::from_system_time(time);
    let stamp = format!(
        "-{:04}-{:02}-{:02}T{:02}-{:02}-{:02}.{:03}",
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.nanos / 1_000_000
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
