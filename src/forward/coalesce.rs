//! The kubelet's response body, in frames as large as what is already readable.
//!
//! The kubelet writes a container log line by line, flushing each (its handler wraps the
//! response in a flush-writer), so a log arrives as one chunk per line. hyper hands the body
//! over one chunk at a time, from the task that reads the kubelet connection to the one that
//! writes the caller's, and the caller's side writes what it has whenever the body has nothing
//! ready. Forwarded as they come, every line became its own TLS record and its own `write`
//! towards the caller: a long log cost a system call and a record per line.
//!
//! [`Coalesced`] gathers, before it answers, every chunk the kubelet connection can produce
//! without waiting: after each chunk it takes the next one hyper decodes, until hyper's reading
//! task finds the connection dry ([`Drained`]: a read that returned nothing since the last chunk
//! was taken), the body ends, or [`GATHER_LIMIT`] bytes are held. A followed log line that is
//! alone still leaves at once (as soon as the read after it finds nothing); a burst of lines
//! leaves as one frame, written in full TLS records. Large chunks (a `Content-Length` body read
//! in big pieces) pass without waiting or a copy.
//!
//! The end of a burst is told by the connection, not by the scheduler: hyper hands a body over
//! through a one-slot channel, so its reading task must run once per chunk, and waiting for "a
//! turn of the serving thread" to tell the end cost a look at every socket (`epoll_wait`) per
//! chunk: on the real kubelet's log, a system call per line (docs/PERFORMANCE.md).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::drained::Drained;

/// The most bytes gathered into one frame: four full TLS records. Past it the frame is answered
/// at once, so a fast kubelet never makes a frame (or what it holds) grow further.
pub const GATHER_LIMIT: usize = 64 * 1024;

/// `inner`, its data chunks gathered as the module describes.
#[derive(Debug)]
pub struct Coalesced<B: Body> {
    inner: B,
    /// Chunks taken but not yet answered: the first alone (no copy while it stays alone), then
    /// copied together.
    held: Held,
    /// The connection the body is read from; without it (a body not read from a kubelet
    /// connection), chunks are answered as they come.
    drained: Option<Drained>,
    /// The connection's count of dry reads when the last chunk was taken.
    mark: u64,
    /// What ended the inner body (its end, trailers or an error), answered after `held`.
    after: Option<After<B::Error>>,
}

#[derive(Debug, Default)]
enum Held {
    #[default]
    Nothing,
    One(Bytes),
    Many(BytesMut),
}

impl Held {
    fn len(&self) -> usize {
        match self {
            Held::Nothing => 0,
            Held::One(bytes) => bytes.len(),
            Held::Many(bytes) => bytes.len(),
        }
    }

    fn push(&mut self, chunk: Bytes) {
        *self = match std::mem::take(self) {
            Held::Nothing => Held::One(chunk),
            Held::One(first) => {
                let mut many = BytesMut::with_capacity((first.len() + chunk.len()).max(16 * 1024));
                many.extend_from_slice(&first);
                many.extend_from_slice(&chunk);
                Held::Many(many)
            }
            Held::Many(mut many) => {
                many.extend_from_slice(&chunk);
                Held::Many(many)
            }
        }
    }

    fn take(&mut self) -> Option<Bytes> {
        match std::mem::take(self) {
            Held::Nothing => None,
            Held::One(bytes) => Some(bytes),
            Held::Many(bytes) => Some(bytes.freeze()),
        }
    }
}

#[derive(Debug)]
enum After<E> {
    End,
    Trailers(http::HeaderMap),
    Error(E),
}

impl<B: Body> Coalesced<B> {
    /// Gathers the data of `inner`, read from the connection `drained` reports on.
    pub(crate) fn new(inner: B, drained: Option<Drained>) -> Coalesced<B> {
        Coalesced {
            inner,
            held: Held::Nothing,
            drained,
            mark: 0,
            after: None,
        }
    }
}

impl<B> Body for Coalesced<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.after.is_none() {
            loop {
                // Counted before the chunk is taken: hyper cannot read again until it is, so a
                // dry read counted later came after this chunk (on whatever thread).
                let before = this.drained.as_ref().map_or(0, Drained::mark);
                match Pin::new(&mut this.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(chunk) => {
                            this.mark = before;
                            if chunk.is_empty() {
                                continue;
                            }
                            if this.held.len() == 0
                                && (chunk.len() >= GATHER_LIMIT || this.inner.is_end_stream())
                            {
                                return Poll::Ready(Some(Ok(Frame::data(chunk))));
                            }
                            this.held.push(chunk);
                            if this.held.len() >= GATHER_LIMIT || this.inner.is_end_stream() {
                                break;
                            }
                        }
                        Err(frame) => {
                            match frame.into_trailers() {
                                Ok(trailers) => this.after = Some(After::Trailers(trailers)),
                                // Neither data nor trailers: nothing http-body defines today.
                                Err(_) => continue,
                            }
                            break;
                        }
                    },
                    Poll::Ready(Some(Err(e))) => {
                        this.after = Some(After::Error(e));
                        break;
                    }
                    Poll::Ready(None) => {
                        this.after = Some(After::End);
                        break;
                    }
                    Poll::Pending => {
                        if this.held.len() == 0 {
                            return Poll::Pending;
                        }
                        match &this.drained {
                            Some(drained) if drained.poll_since(this.mark, cx).is_pending() => {
                                return Poll::Pending;
                            }
                            _ => break,
                        }
                    }
                }
            }
        }
        if let Some(chunk) = this.held.take() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match this.after.take() {
            None | Some(After::End) => {
                this.after = Some(After::End);
                Poll::Ready(None)
            }
            Some(After::Trailers(trailers)) => {
                this.after = Some(After::End);
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Some(After::Error(e)) => {
                this.after = Some(After::End);
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.after {
            Some(After::End) => self.held.len() == 0,
            Some(_) => false,
            None => self.held.len() == 0 && self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held.len() as u64;
        if self.after.is_some() {
            return SizeHint::with_exact(held);
        }
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

#[cfg(test)]
mod tests;
