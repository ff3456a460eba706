//! Container logs as the kubelet writes them: line by line. The kubelet's log handler wraps the
//! response in a flush-writer, so each line is one `Write` and one `Flush`: one HTTP chunk, one
//! TLS record, one send. [`write_chunked`] does exactly that on the connection itself, a chunk
//! per line written and flushed alone, as fast as the kubelet does (a hyper body that returned
//! `Pending` after each line to make hyper flush it reached a third of the real kubelet's rate,
//! and a proxy measured behind it waited for the stand-in). A followed log ([`FollowBody`]) is
//! slow by nature and goes through hyper.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::io::Write as _;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, Sleep};

/// Lines in the pool a log is cut from; enough that the lengths do not repeat visibly.
const POOL_LINES: usize = 4096;
/// Shortest and longest line, newline included.
const SHORTEST: usize = 80;
const LONGEST: usize = 250;

const LEVELS: &[&str] = &["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"];
const WORDS: &[&str] = &[
    "request",
    "completed",
    "handler",
    "GET",
    "/api/v1/orders",
    "status=200",
    "duration_ms=12",
    "user_id=4411",
    "cache",
    "miss",
    "retrying",
    "connection",
    "upstream",
    "timeout",
    "ok",
    "trace_id=5f2c9a1e7b3d4c60",
    "bytes=5120",
    "worker",
    "queue",
    "depth=3",
    "committed",
    "offset=918273",
    "partition=7",
    "reconciling",
    "pod",
    "web-0",
    "ready",
    "probe",
    "latency",
];

/// Realistic log lines made once: an RFC 3339 timestamp with nanoseconds, a level, a message;
/// 80 to 250 bytes, about 130 on average. Logs are slices of one buffer, so serving a line
/// costs no formatting and no allocation.
#[derive(Debug, Clone)]
pub struct LinePool {
    lines: Arc<[Bytes]>,
}

impl LinePool {
    pub fn new() -> LinePool {
        let mut text = String::new();
        let mut bounds = Vec::with_capacity(POOL_LINES);
        // A fixed xorshift: the same pool in every run.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..POOL_LINES {
            // The product of two uniform draws leans the lengths towards the short end.
            let (a, b) = ((next() % 171) as usize, (next() % 171) as usize);
            let len = (SHORTEST + a * b / 150).min(LONGEST);
            let start = text.len();
            let nanos = (next() % 1_000_000_000) as usize;
            let (h, m, s) = (i / 3600 % 24, i / 60 % 60, i % 60);
            let level = LEVELS[(next() % LEVELS.len() as u64) as usize];
            text.push_str(&format!(
                "2026-01-15T{h:02}:{m:02}:{s:02}.{nanos:09}Z {level:<5} "
            ));
            while text.len() - start < len - 1 {
                text.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
                text.push(' ');
            }
            text.truncate(start + len - 1);
            text.push('\n');
            bounds.push((start, text.len()));
        }
        let all = Bytes::from(text);
        let lines = bounds.iter().map(|&(s, e)| all.slice(s..e)).collect();
        LinePool { lines }
    }

    /// The `i`-th line, round the pool.
    fn line(&self, i: usize) -> &Bytes {
        &self.lines[i % self.lines.len()]
    }
}

/// Answers a log request on `io` with `bytes` bytes of lines, chunked, each line one chunk
/// written and flushed alone (over TLS: one record and one send per line), then closes the
/// connection (`Connection: close`, so that it needs no HTTP server after it).
pub async fn write_chunked<W: AsyncWrite + Unpin>(
    mut io: W,
    pool: &LinePool,
    bytes: u64,
) -> std::io::Result<()> {
    io.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .await?;
    io.flush().await?;
    let mut chunk = Vec::with_capacity(LONGEST + 16);
    let mut remaining = bytes;
    let mut next_line = 0;
    while remaining > 0 {
        let line = pool.line(next_line);
        let line = &line[..line.len().min(remaining as usize)];
        chunk.clear();
        write!(chunk, "{:x}\r\n", line.len())?;
        chunk.extend_from_slice(line);
        chunk.extend_from_slice(b"\r\n");
        io.write_all(&chunk).await?;
        io.flush().await?;
        remaining -= line.len() as u64;
        next_line += 1;
    }
    io.write_all(b"0\r\n\r\n").await?;
    io.flush().await?;
    io.shutdown().await
}

/// A followed log: `lines` lines, one every `interval`, each starting with the wall-clock time
/// it is sent, in nanoseconds since the UNIX epoch, so that the client can tell how long it took
/// to arrive. Each line is flushed alone since the next one waits for its timer.
pub struct FollowBody {
    pool: LinePool,
    sent: usize,
    lines: usize,
    interval: Duration,
    timer: Pin<Box<Sleep>>,
}

impl FollowBody {
    pub fn new(pool: LinePool, lines: usize, interval: Duration) -> FollowBody {
        FollowBody {
            pool,
            sent: 0,
            lines,
            interval,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
        }
    }
}

impl Body for FollowBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent == self.lines {
            return Poll::Ready(None);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let deadline = self.timer.deadline() + self.interval;
        self.timer.as_mut().reset(deadline);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let line = self.pool.line(self.sent);
        let mut text = Vec::with_capacity(line.len() + 21);
        text.extend_from_slice(format!("{now} ").as_bytes());
        text.extend_from_slice(line);
        self.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(text)))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent == self.lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_lines_are_realistic() {
        let pool = LinePool::new();
        let lens: Vec<usize> = pool.lines.iter().map(Bytes::len).collect();
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!(lens.iter().all(|&l| (SHORTEST..=LONGEST).contains(&l)));
        assert!((115.0..145.0).contains(&mean), "mean {mean}");
        assert!(pool.lines.iter().all(|l| l.ends_with(b"\n")));
    }
}
