//! The audit log's handle and its writer thread: a bounded queue on the request path, batched
//! writes off it, losses counted and reported at a bounded rate.

use std::fs;
use std::future::Future;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};

use super::budget::{ActRefused, Budget, Charge, Identity};
use super::event::AuditEvent;
use super::json::{encode_bounded, encode_line};
use super::policy::{PolicyGate, PolicyRequest, Stages};
use super::rotate::{Fit, RotatingFile, Rotation};
use super::summary::Summaries;

/// Events waiting for the writer. Beyond this the writer is far behind and events are dropped
/// (and counted) rather than slowing requests or growing memory without bound.
pub(super) const QUEUE_CAPACITY: usize = 8192;
/// Places in the queue only events of requests that act ([`super::acts`]) may take, so a queue
/// filled by a flood cannot drop an exec's event or refuse the exec.
pub(super) const ACT_RESERVE: usize = 1024;
/// Pending bytes that trigger a write even while more events are queued; otherwise the writer
/// writes when the queue is empty.
pub(super) const BATCH_BYTES: usize = 64 * 1024;
/// At most one log line per this interval about lost events, however many are lost.
pub(super) const LOSS_REPORT_INTERVAL: Duration = Duration::from_secs(10);

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

/// How the audit log is written: rotation, and the largest event (`None`: no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuditOptions {
    /// When the file is rotated and how many backups are kept.
    pub rotation: Rotation,
    /// `--audit-log-truncate-max-event-size` when `--audit-log-truncate-enabled`.
    pub max_event_size: Option<usize>,
    /// `--audit-log-flood-retention`: how long the kept files must last under a flood; `None`
    /// turns the flood budget off.
    pub flood_retention: Option<Duration>,
}

/// A message to the writer thread.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "queue slots hold events anyway; boxing would cost an allocation per request"
)]
pub(super) enum Message {
    Event(AuditEvent),
    /// An event the flood budget already encoded on the request thread to learn its size,
    /// written as it is rather than encoded twice.
    Line(Vec<u8>),
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
    pub(super) writer_done: watch::Receiver<()>,
    /// `--audit-policy-file`: which events are written; `None` writes every one.
    policy: Option<Arc<PolicyGate>>,
    /// The flood budget and its summaries, when on ([`AuditLog::with_budget`]).
    flood: Option<Arc<Flood>>,
    max_event_size: Option<usize>,
}

/// The flood budget of an audit log and the summaries of what it suppressed.
#[derive(Debug)]
struct Flood {
    budget: Budget,
    summaries: Summaries,
}

thread_local! {
    /// Where an event is encoded to learn its size, reused by each request thread.
    static MEASURE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `event` as the writer would write it, with the bound `max_event_size`, and the bytes charged
/// for it. An event that cannot be encoded in any form is left for the writer, which counts and
/// reports the loss, and charged the bound.
fn measured(event: AuditEvent, max_event_size: Option<usize>) -> (Message, u64) {
    MEASURE.with_borrow_mut(|line| {
        line.clear();
        let encoded = match max_event_size {
            Some(max) => encode_bounded(&event, max, line),
            None => encode_line(&event, line).map_err(io::Error::other),
        };
        let measured = match encoded {
            Ok(()) => (Message::Line(line.clone()), line.len() as u64),
            Err(_) => (
                Message::Event(event),
                max_event_size.unwrap_or(line.len()) as u64,
            ),
        };
        line.shrink_to(BATCH_BYTES);
        measured
    })
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

    /// Meters what [`submit`](AuditLog::submit) writes with `budget` ([`super::budget`]).
    pub fn with_budget(mut self, budget: Budget) -> AuditLog {
        self.flood = Some(Arc::new(Flood {
            budget,
            summaries: Summaries::new(),
        }));
        self
    }

    pub(super) fn start(
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
            policy: None,
            flood: None,
            max_event_size,
        })
    }

    /// This log, writing only the events `policy` keeps.
    pub fn with_policy(self, policy: PolicyGate) -> AuditLog {
        AuditLog {
            policy: Some(Arc::new(policy)),
            ..self
        }
    }

    /// The stages of `request`'s events to record ([`PolicyGate::stages_kept`]); every stage
    /// without a policy.
    pub fn stages_kept(&self, request: &PolicyRequest<'_>, acts: bool, stream: bool) -> Stages {
        match &self.policy {
            Some(policy) => policy.stages_kept(request, acts, stream),
            None => Stages::ALL,
        }
    }

    /// Whether an event recorded now would be written: the queue has room and the last write
    /// succeeded. What exec, attach and portForward check first when they must be audited
    /// (`--audit-log-require-for-streams`).
    pub fn is_writable(&self) -> bool {
        self.healthy.load(Ordering::Acquire) && self.queue.capacity() > 0
    }

    /// Queues one event of a request that acts, or of a session's end: never suppressed, and
    /// it may take the places reserved for acts. Never blocks and never fails the request: when
    /// the queue is full (or the log is closed) the event is dropped and counted.
    pub fn record(&self, event: AuditEvent) {
        self.send(Message::Event(event));
    }

    fn send(&self, message: Message) {
        if self.queue.try_send(message).is_err() {
            self.dropped.inc();
        }
    }

    /// Queues the event of a request, charged to the flood budget: an event that `acts` is
    /// always queued ([`record`](AuditLog::record)); any other only within the budget of its
    /// identity and the overall one, and outside the places reserved for acts. What is not
    /// written is counted and summarized.
    pub fn submit(&self, event: AuditEvent, acts: bool) {
        let message = match &self.flood {
            Some(flood) => {
                let identity = event
                    .user
                    .as_ref()
                    .map_or(Identity::Unauthenticated, |user| {
                        Identity::User(user.name.clone())
                    });
                let (verb, subresource) = (
                    event.verb,
                    event.object_ref.as_ref().map_or("", |o| o.subresource),
                );
                let (message, bytes) = measured(event, self.max_event_size);
                let admission = flood.budget.charge(&Charge {
                    identity: &identity,
                    bytes,
                    acts,
                    verb,
                    subresource,
                });
                for summary in flood.summaries.due(&flood.budget) {
                    let (summary, bytes) = measured(summary, self.max_event_size);
                    flood.budget.take(bytes);
                    self.send(summary);
                }
                if !admission.writes() {
                    return;
                }
                message
            }
            None => Message::Event(event),
        };
        let reserved = ACT_RESERVE.min(self.queue.max_capacity() / 2);
        if acts || self.queue.capacity() > reserved {
            self.send(message);
        } else {
            self.dropped.inc();
        }
    }

    /// Whether a request of `user` (`None`: unauthenticated) that acts may go on: its event will
    /// be written whatever the flood budget holds, so it is admitted first ([`Budget::admit_act`]).
    /// Always, without a flood budget.
    pub fn admit_act(&self, user: Option<&str>) -> Result<(), ActRefused> {
        match &self.flood {
            Some(flood) => {
                let identity = user.map_or(Identity::Unauthenticated, |name| {
                    Identity::User(name.to_owned())
                });
                flood.budget.admit_act(&identity)
            }
            None => Ok(()),
        }
    }

    /// For graceful shutdown: writes every event queued so far, stops the writer and resolves
    /// when it has finished. Events recorded afterwards, through any clone, are dropped and
    /// counted.
    pub fn close(self) -> impl Future<Output = ()> + Send + 'static {
        let AuditLog {
            queue,
            mut writer_done,
            flood,
            dropped,
            ..
        } = self;
        if let Some(flood) = flood {
            for summary in Summaries::remaining(&flood.budget) {
                if queue.try_send(Message::Event(summary)).is_err() {
                    dropped.inc();
                }
            }
        }
        async move {
            // Fails only when the writer has already stopped, which is what we wait for anyway.
            let _ = queue.send(Message::Close).await;
            drop(queue);
            while writer_done.changed().await.is_ok() {}
        }
    }
}

/// Where the writer puts bytes.
pub(super) enum Sink {
    /// Standard output (or, in tests, any writer); written with `write_all` + `flush` per batch.
    Stream(Box<dyn Write + Send>),
    File(RotatingFile),
}

/// The writer thread's state: the sink, the batch being built and the loss accounting.
pub(super) struct Writer {
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
    pub(super) fn run(mut self, mut queue: mpsc::Receiver<Message>) {
        while let Some(first) = queue.blocking_recv() {
            let mut closing = false;
            let mut next = Some(first);
            while let Some(message) = next {
                match message {
                    Message::Event(event) => self.push(&event),
                    Message::Line(line) => self.push_line(&line),
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
    pub(super) fn push(&mut self, event: &AuditEvent) {
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
        let line = std::mem::take(&mut self.line);
        self.push_line(&line);
        self.line = line;
    }

    /// Adds one encoded event to the batch, rotating the file first when it would not fit.
    fn push_line(&mut self, line: &[u8]) {
        match self.make_room(line.len() as u64) {
            Ok(()) => {
                self.batch.bytes.extend_from_slice(line);
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
    pub(super) fn make_room(&mut self, len: u64) -> io::Result<()> {
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

    pub(super) fn flush(&mut self) {
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
pub(super) struct Batch {
    bytes: Vec<u8>,
    /// How many events `bytes` holds, to count them if the write fails.
    events: u64,
    /// Shared with [`AuditLog::is_writable`]: the outcome of the last write.
    healthy: Arc<AtomicBool>,
}

impl Batch {
    /// Writes the batch with `write` and empties it; when the write fails its events are lost.
    pub(super) fn write_with(
        &mut self,
        losses: &mut Losses,
        write: impl FnOnce(&[u8]) -> io::Result<()>,
    ) {
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
pub(super) struct Losses {
    dropped: Counter,
    /// The counter's value at the last report (or at start).
    reported: u64,
    last_report: Option<Instant>,
    last_error: Option<io::Error>,
}

impl Losses {
    pub(super) fn new(dropped: Counter) -> Losses {
        Losses {
            reported: dropped.get(),
            dropped,
            last_report: None,
            last_error: None,
        }
    }

    pub(super) fn lose(&mut self, events: u64, error: io::Error) {
        self.dropped.inc_by(events);
        self.last_error = Some(error);
    }

    /// Logs the losses since the last report (queue full or write errors), unless a report was
    /// made less than [`LOSS_REPORT_INTERVAL`] ago and `force` is false.
    pub(super) fn report(&mut self, force: bool) {
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
