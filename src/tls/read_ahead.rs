//! Socket reads as large as the data waiting, under TLS.
//!
//! rustls asks its transport for at most 4 KiB per read, so a stream arriving in full 16 KiB
//! records cost four or more `read` calls per record, on the caller's connection and the
//! kubelet's alike. [`ReadAhead`] answers those small reads from a buffer it fills with one large
//! read, but only while the connection is busy: a read that fills what was asked for suggests
//! more is waiting, and switches to large reads; once a read finds nothing waiting, the buffer is
//! given back and reads go straight to the socket again. A request or an idle connection costs
//! no buffer and no copy; a bulk transfer costs one `read` per [`AHEAD`] bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The size of one large read: two full TLS records.
pub const AHEAD: usize = 32 * 1024;

/// `io`, read ahead as the module describes; writes pass straight through.
#[derive(Debug)]
pub struct ReadAhead<T> {
    io: T,
    /// Read from the socket, not yet given to the reader.
    buf: BytesMut,
    /// Whether reads currently go through `buf`.
    ahead: bool,
}

impl<T> ReadAhead<T> {
    /// Reads `io` ahead when it is busy.
    pub fn new(io: T) -> ReadAhead<T> {
        ReadAhead {
            io,
            buf: BytesMut::new(),
            ahead: false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.buf.is_empty() {
            if !this.ahead {
                let asked = out.remaining();
                let before = out.filled().len();
                ready!(Pin::new(&mut this.io).poll_read(cx, out))?;
                // All that was asked for came: more is probably waiting.
                this.ahead = asked > 0 && out.filled().len() - before == asked;
                return Poll::Ready(Ok(()));
            }
            this.buf.reserve(AHEAD);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut this.buf) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Nothing waiting: the connection is quiet, give the buffer back.
                    this.buf = BytesMut::new();
                    this.ahead = false;
                    return Poll::Pending;
                }
            }
            // An end of stream leaves `buf` empty and `out` unfilled: the reader sees the end.
        }
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
