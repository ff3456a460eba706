//! A TCP stream that counts its reads that returned data, and their bytes: the client's
//! receives, whose average size says how the target cut the stream (one TLS record per log line,
//! or large coalesced writes).
//!
//! rustls asks its transport for 4 KiB to 16 KiB at a time, which would cap every receive at
//! that size whatever the sender did; so this stream reads the socket into its own 64 KiB buffer
//! (the size curl reads with) and serves rustls from it: one receive here is one `recv` of up to
//! 64 KiB, whatever was waiting in the socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Counts of the reads from the socket.
#[derive(Debug, Default, Clone, Copy)]
pub struct Receives {
    /// Reads that returned data.
    pub reads: u64,
    /// Bytes they returned (TLS records, not payload).
    pub bytes: u64,
}

/// The size of each read from the socket.
const READ_BUFFER: usize = 64 * 1024;

/// A [`TcpStream`] read through a 64 KiB buffer, whose reads are counted.
#[derive(Debug)]
pub struct CountingStream {
    inner: TcpStream,
    buffer: Box<[u8]>,
    /// The buffered bytes not yet handed out: `buffer[start..end]`.
    start: usize,
    end: usize,
    pub counts: Receives,
}

impl CountingStream {
    pub fn new(inner: TcpStream) -> CountingStream {
        CountingStream {
            inner,
            buffer: vec![0; READ_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            counts: Receives::default(),
        }
    }
}

impl AsyncRead for CountingStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.start == this.end {
            let mut into = ReadBuf::new(&mut this.buffer);
            match Pin::new(&mut this.inner).poll_read(cx, &mut into) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            let read = into.filled().len();
            if read == 0 {
                return Poll::Ready(Ok(())); // the end of the stream
            }
            this.counts.reads += 1;
            this.counts.bytes += read as u64;
            (this.start, this.end) = (0, read);
        }
        let n = (this.end - this.start).min(buf.remaining());
        buf.put_slice(&this.buffer[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for CountingStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
