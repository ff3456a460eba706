//! Reading a trickle from the kubelet in batches.
//!
//! The kubelet writes a container log one line per `write`, each flushed: one TLS record and one
//! TCP segment per line, about 330,000 a second from one log. Read as they come, each segment
//! wakes the serving thread (an `epoll_wait` return, a context switch) and costs a `recv`, a
//! decryption and a write towards the caller of a few hundred bytes: most of the proxy's CPU,
//! for lines nobody reads one at a time.
//!
//! [`BatchedTcp`] notices such a trickle (many small reads in a row, close together, with
//! nothing written in between) and asks the kernel to wake it only once [`LOW_WATER`] bytes wait
//! (`SO_RCVLOWAT`), with a timer that reads whatever is there after [`FLUSH_AFTER`] at the
//! latest. The trickle is then read 16 KiB at a time and leaves towards the caller in full TLS
//! records. It stops batching as soon as it writes (the next request on the connection, or
//! input of an upgraded session: an answer to it must not wait) or a timer period brings
//! nothing (the stream went quiet: its next line is read at once). A line of a followed log, a
//! response to a request, a keystroke's echo: none comes in a trickle, none waits. What a
//! trickle's line may wait is [`FLUSH_AFTER`] and the timer's granularity (about 2 ms), while
//! its stream is busy.

mod low_water;

use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// Bytes the kernel holds back while batching: one full TLS record's worth of payload.
pub(crate) const LOW_WATER: usize = 16 * 1024;
/// The longest bytes wait below [`LOW_WATER`] while batching (rounded up to the runtime's
/// millisecond timer).
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(1);
/// A read shorter than this is small: a few of the kubelet's per-line records.
const SMALL_READ: usize = 2048;
/// Reads further apart than this are not a trickle.
const TRICKLE_GAP: Duration = Duration::from_micros(200);
/// Small reads in a row, each within [`TRICKLE_GAP`] of the last, that make a trickle.
const TRICKLE_READS: u32 = 16;

/// A TCP connection to the kubelet that reads a trickle in batches, as the module says.
#[derive(Debug)]
pub(crate) struct BatchedTcp {
    tcp: TcpStream,
    /// Small reads in a row, close together, nothing written between them.
    small_reads: u32,
    /// When the last read returned data (none after a write or a large read).
    last_read: Option<Instant>,
    /// Something was written since the last read: the next read answers it and starts no
    /// trickle, so it is not timed (a request's response costs no clock read).
    after_write: bool,
    /// `SO_RCVLOWAT` is [`LOW_WATER`] (else 1).
    batching: bool,
    /// While batching: when what waits below the low-water mark is read anyway.
    flush: Option<Pin<Box<Sleep>>>,
    /// Whether `flush` is set for the current wait.
    flush_armed: bool,
}

impl BatchedTcp {
    pub(crate) fn new(tcp: TcpStream) -> BatchedTcp {
        BatchedTcp {
            tcp,
            small_reads: 0,
            last_read: None,
            after_write: false,
            batching: false,
            flush: None,
            flush_armed: false,
        }
    }

    /// Counts a read of `n` bytes and starts batching when they make a trickle.
    fn saw(&mut self, n: usize) {
        self.flush_armed = false;
        if n >= SMALL_READ || std::mem::take(&mut self.after_write) {
            self.small_reads = 0;
            self.last_read = None;
            return;
        }
        let now = Instant::now();
        let close = self
            .last_read
            .is_some_and(|last| now.duration_since(last) <= TRICKLE_GAP);
        self.last_read = Some(now);
        if !close {
            self.small_reads = 0;
            return;
        }
        self.small_reads = self.small_reads.saturating_add(1);
        if !self.batching && self.small_reads >= TRICKLE_READS {
            self.set_batching(true);
        }
    }

    /// Sets the low-water mark. Failing that, the connection reads as it did: batching only
    /// saves CPU, and a kernel without `SO_RCVLOWAT` for TCP loses nothing else.
    fn set_batching(&mut self, on: bool) {
        let bytes = if on { LOW_WATER } else { 1 };
        if low_water::set(self.tcp.as_fd(), bytes).is_ok() {
            self.batching = on;
        }
        self.small_reads = 0;
        self.flush_armed = false;
    }

    /// While batching, after the socket said it has fewer than [`LOW_WATER`] bytes: ready when
    /// the flush timer has run out.
    fn poll_flush_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = Instant::now() + FLUSH_AFTER;
        let flush = self
            .flush
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.flush_armed {
            flush.as_mut().reset(deadline);
            self.flush_armed = true;
        }
        flush.as_mut().poll(cx)
    }
}

impl AsyncRead for BatchedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    this.saw(n);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if !this.batching || this.poll_flush_due(cx).is_pending() {
                    return Poll::Pending;
                }
                // The period is over: whatever waits below the mark is read now. Lowering the
                // mark makes the kernel signal at once if anything waits; a period that brought
                // nothing means the stream went quiet, and it stays lowered.
                this.set_batching(false);
                if this.batching {
                    // Not lowered (the kernel refused): try again after another period rather
                    // than hold what waits until the mark is reached.
                    let _ = this.poll_flush_due(cx);
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for BatchedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.wrote();
        Pin::new(&mut this.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.wrote();
        Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

impl BatchedTcp {
    /// Something goes to the kubelet: whatever it answers must not wait, and what came before
    /// was no one-way trickle.
    fn wrote(&mut self) {
        self.after_write = true;
        self.small_reads = 0;
        if self.batching {
            self.set_batching(false);
        }
    }
}

#[cfg(test)]
mod tests;
