//! Copying an upgraded session both ways in full TLS records.
//!
//! `tokio::io::copy_bidirectional` writes after every read, into an 8 KiB buffer. Reading from
//! TLS gives at most the records one socket read brought (rustls reads 4 KiB at a time), so each
//! of those became a record and a `write` of its own on the other side: an exec's stdout went to
//! the caller in records of a few kilobytes. Here each direction reads until what is readable is
//! taken or its buffer is full, and only then writes, in one call, so the other side gets full
//! 16 KiB records and as few writes as the data allows. Nothing waits for data that is not there
//! yet: a keystroke still leaves as soon as it is read.
//!
//! Each direction's buffer starts at [`SMALL`] and grows to [`LARGE`] once a batch fills it. A
//! batch smaller than a record, once written, gives the buffer back: an interactive or idle
//! session holds no buffer between keystrokes, and a bulk copy keeps its buffer while it lasts.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

/// A direction's first buffer: one full TLS record.
pub(super) const SMALL: usize = 16 * 1024;
/// A busy direction's buffer: four records per write.
pub(super) const LARGE: usize = 64 * 1024;

/// Copies `a` to `b` and `b` to `a` until both have ended (each end read is passed on as a
/// shutdown of the other side's writing half), or until either fails. Returns the bytes copied
/// each way: `(a to b, b to a)`.
pub(super) async fn both_ways<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut a_to_b = Pump::default();
    let mut b_to_a = Pump::default();
    poll_fn(|cx| {
        let forth = a_to_b.poll(cx, &mut *a, &mut *b)?;
        let back = b_to_a.poll(cx, &mut *b, &mut *a)?;
        match (forth, back) {
            (Poll::Ready(forth), Poll::Ready(back)) => Poll::Ready(Ok((forth, back))),
            _ => Poll::Pending,
        }
    })
    .await
}

/// One direction of a session.
#[derive(Debug, Default)]
struct Pump {
    /// Read and not yet written (the part before `buf`'s start has been written and dropped).
    buf: BytesMut,
    /// The buffer size to read up to in this batch.
    capacity: usize,
    /// Whether data was written since the last flush.
    unflushed: bool,
    /// The reading side has ended.
    read_done: bool,
    /// The writing side has been shut down after the end: this direction is over.
    done: bool,
    moved: u64,
}

impl Pump {
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<io::Result<u64>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        loop {
            if self.done {
                return Poll::Ready(Ok(self.moved));
            }
            let mut read_pending = false;
            if self.capacity == 0 {
                self.capacity = SMALL;
            }
            while !self.read_done && self.buf.len() < self.capacity {
                self.buf.reserve(self.capacity - self.buf.len());
                match tokio_util::io::poll_read_buf(Pin::new(&mut *reader), cx, &mut self.buf) {
                    Poll::Ready(Ok(0)) => self.read_done = true,
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        read_pending = true;
                        break;
                    }
                }
            }
            let batch = self.buf.len();
            while !self.buf.is_empty() {
                let written = ready!(Pin::new(&mut *writer).poll_write(cx, &self.buf))?;
                if written == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.buf.advance(written);
                self.moved += written as u64;
                self.unflushed = true;
            }
            if batch >= self.capacity {
                self.capacity = LARGE;
            } else if batch < SMALL {
                // Written, and not a bulk copy: give the memory back until data comes again.
                self.buf = BytesMut::new();
                self.capacity = SMALL;
            }
            if self.read_done {
                if self.unflushed {
                    ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                    self.unflushed = false;
                }
                ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
                self.done = true;
                continue;
            }
            if read_pending {
                if self.unflushed {
                    ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                    self.unflushed = false;
                }
                return Poll::Pending;
            }
        }
    }
}

#[cfg(test)]
mod tests;
