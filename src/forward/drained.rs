//! When the kubelet connection has nothing more to read: the signal [`super::coalesce`] gathers
//! by.
//!
//! hyper reads the kubelet's response on a task of its own and hands the body over one chunk at
//! a time through a one-slot channel: it decodes a chunk, waits until the body's reader has taken
//! it, then decodes the next, and reads the socket only when its buffer holds no whole chunk.
//! So "every chunk readable now has been taken" is known only on the reading side, at the moment
//! a read of the connection finds nothing ([`Poll::Pending`]). [`Drained`] is that moment,
//! counted and announced: the connection's stream counts every read that found nothing and wakes
//! whoever waits on it; a body that took a chunk when the count was `n` knows, once it is past
//! `n`, that hyper went back to the socket after that chunk and found it dry.
//!
//! One per upstream connection, shared by the connection's stream (which reports) and the
//! response bodies read from it in turn (which wait); handed from one to the other in the
//! response's extensions, where hyper-util puts what the connector attached to the connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

/// The count of reads of one connection that found nothing, and the task waiting for the next.
#[derive(Debug, Clone, Default)]
pub(crate) struct Drained(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    dry_reads: AtomicU64,
    waiter: AtomicWaker,
}

impl Drained {
    /// A connection's own, before its first read.
    pub(crate) fn new() -> Drained {
        Drained::default()
    }

    /// Called by the connection's stream when a read finds nothing: counts it and wakes the
    /// waiting body, if any.
    pub(crate) fn report(&self) {
        self.0.dry_reads.fetch_add(1, Ordering::Release);
        self.0.waiter.wake();
    }

    /// The count now: what a body records when it takes a chunk.
    pub(crate) fn mark(&self) -> u64 {
        self.0.dry_reads.load(Ordering::Acquire)
    }

    /// Ready once a read has found nothing since `mark`; until then the task of `cx` is woken
    /// by the next such read.
    pub(crate) fn poll_since(&self, mark: u64, cx: &Context<'_>) -> Poll<()> {
        if self.mark() != mark {
            return Poll::Ready(());
        }
        self.0.waiter.register(cx.waker());
        // A report between the first look and the registration woke no one: look again.
        if self.mark() != mark {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn a_dry_read_after_the_mark_ends_the_wait_and_wakes_the_waiter() {
        let drained = Drained::new();
        let mark = drained.mark();
        let woken = Arc::new(WakeCount::default());
        let waker = Waker::from(Arc::clone(&woken));
        let cx = Context::from_waker(&waker);
        assert!(drained.poll_since(mark, &cx).is_pending());
        drained.report();
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(drained.poll_since(mark, &cx).is_ready());
        // A new mark waits for the next dry read.
        assert!(drained.poll_since(drained.mark(), &cx).is_pending());
    }

    #[derive(Default)]
    struct WakeCount(AtomicU64);

    impl std::task::Wake for WakeCount {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
