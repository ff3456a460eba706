//! A response body that holds something until the body ends or is dropped: the connection's
//! count of requests in flight (so a long download is never taken for an idle connection), the
//! places of a request to the kubelet (so a caller that stops reading keeps its own places, not
//! others'). One wrapper for both, because both must last exactly as long as the body.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

/// `inner`, holding `guard` until its last frame, an error, or its drop.
#[derive(Debug)]
pub struct Holding<B, G> {
    inner: B,
    guard: Option<G>,
}

impl<B, G> Holding<B, G> {
    /// `inner`, holding `guard` (if any) until it ends.
    pub fn new(inner: B, guard: Option<G>) -> Holding<B, G> {
        Holding { inner, guard }
    }
}

impl<B: Body + Unpin, G: Unpin> Body for Holding<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use std::sync::Arc;

    #[tokio::test]
    async fn the_guard_is_released_when_the_body_ends() {
        let guard = Arc::new(());
        let mut body = Holding::new(
            Full::new(Bytes::from_static(b"ok")),
            Some(Arc::clone(&guard)),
        );
        assert_eq!(Arc::strong_count(&guard), 2);
        while body.frame().await.is_some() {}
        assert_eq!(
            Arc::strong_count(&guard),
            1,
            "released at the end, before the drop"
        );
        drop(body);
    }
}
