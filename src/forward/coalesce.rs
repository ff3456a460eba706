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
//! without waiting: after a chunk it lets the serving thread take a turn (run every task that is
//! ready, the reading one included, and look at the sockets once, as `tokio::task::yield_now`
//! does; no timer) and takes what that brought, until a turn brings nothing, the body ends, or
//! [`GATHER_LIMIT`] bytes are held. A followed log line that is alone still leaves at once; a
//! burst of lines leaves as one frame, written in full TLS records. Large chunks (a
//! `Content-Length` body read in big pieces) pass without a turn or a copy.
//!
//! The end of a turn is told by a wake-up the runtime defers until the turn is over ([`Turn`]),
//! not by the next poll: hyper's server polls a response body several times in one run of its
//! connection task, so "polled again" does not mean the reading task has run.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

/// The most bytes gathered into one frame: four full TLS records. Past it the frame is answered
/// without another turn, so a fast kubelet never makes a frame (or what it holds) grow further.
pub const GATHER_LIMIT: usize = 64 * 1024;

/// `inner`, its data chunks gathered as the module describes.
#[derive(Debug)]
pub struct Coalesced<B: Body> {
    inner: B,
    /// Chunks taken but not yet answered: the first alone (no copy while it stays alone), then
    /// copied together.
    held: Held,
    /// The turn being taken, if any (allocated at the first turn, then reused).
    turn: Option<Arc<Turn>>,
    /// Whether a turn is under way.
    turning: bool,
    /// Whether a chunk came since the turn under way (or the last one) began.
    brought: bool,
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

/// One turn of the serving thread: a wake-up handed to the runtime as `yield_now` hands it, so
/// that it comes once the tasks ready now have run and the sockets have been looked at, and a flag
/// it sets on its way to the body's task.
#[derive(Debug, Default)]
struct Turn {
    over: AtomicBool,
    task: AtomicWaker,
}

impl Turn {
    /// Begins a turn for the task of `cx`.
    fn take(turn: &Arc<Turn>, cx: &Context<'_>) {
        turn.over.store(false, Ordering::Relaxed);
        turn.task.register(cx.waker());
        let waker = Waker::from(Arc::clone(turn));
        // Its first poll hands `waker` to the runtime (woken at once outside one) and answers
        // `Pending`; it is never polled again.
        let _ = pin!(tokio::task::yield_now()).poll(&mut Context::from_waker(&waker));
    }

    /// Whether the turn is over; if not, the task of `cx` is the one it wakes.
    fn ended(&self, cx: &Context<'_>) -> bool {
        if self.over.load(Ordering::Acquire) {
            return true;
        }
        self.task.register(cx.waker());
        self.over.load(Ordering::Acquire)
    }
}

impl Wake for Turn {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.over.store(true, Ordering::Release);
        self.task.wake();
    }
}

#[derive(Debug)]
enum After<E> {
    End,
    Trailers(http::HeaderMap),
    Error(E),
}

impl<B: Body> Coalesced<B> {
    /// Gathers the data of `inner`.
    pub fn new(inner: B) -> Coalesced<B> {
        Coalesced {
            inner,
            held: Held::Nothing,
            turn: None,
            turning: false,
            brought: false,
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
                match Pin::new(&mut this.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(chunk) => {
                            this.brought = true;
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
                        if this.turning {
                            if let Some(turn) = this.turn.as_deref()
                                && !turn.ended(cx)
                            {
                                return Poll::Pending;
                            }
                            this.turning = false;
                            if !this.brought {
                                break;
                            }
                        }
                        // Another turn: the task reading the kubelet was woken when the chunk
                        // was taken, and runs in it.
                        this.brought = false;
                        this.turning = true;
                        Turn::take(this.turn.get_or_insert_with(Arc::default), cx);
                        return Poll::Pending;
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
