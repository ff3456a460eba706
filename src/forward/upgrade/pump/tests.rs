use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadBuf, duplex};

use super::*;

/// A stream that gives at most `per_read` bytes per read, as rustls gives the records of one
/// 4 KiB socket read, and records the size of every write.
struct Trickle {
    io: DuplexStream,
    per_read: usize,
    writes: Arc<Mutex<Vec<usize>>>,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = buf.remaining().min(self.per_read);
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(n));
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut part))?;
        let got = part.filled().len();
        buf.advance(got);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.writes.lock().unwrap().push(n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A session between a caller and a kubelet, each side a `Trickle` over an in-memory pipe; the
/// returned ends are the caller's and the kubelet's peers, and each side's record of writes.
#[allow(clippy::type_complexity)]
fn session(per_read: usize) -> (Trickle, Trickle, DuplexStream, DuplexStream) {
    let (caller, caller_peer) = duplex(4 << 20);
    let (kubelet, kubelet_peer) = duplex(4 << 20);
    let wrap = |io| Trickle {
        io,
        per_read,
        writes: Arc::default(),
    };
    (wrap(caller), wrap(kubelet), caller_peer, kubelet_peer)
}

#[tokio::test]
async fn what_is_readable_leaves_in_full_records() {
    let (mut caller, mut kubelet, mut caller_peer, mut kubelet_peer) = session(4096);
    let to_caller = Arc::clone(&caller.writes);
    let stdout: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    kubelet_peer.write_all(&stdout).await.unwrap();
    kubelet_peer.shutdown().await.unwrap();
    caller_peer.shutdown().await.unwrap();
    let copied = both_ways(&mut caller, &mut kubelet).await.unwrap();
    assert_eq!(copied, (0, stdout.len() as u64));
    let mut received = Vec::new();
    caller_peer.read_to_end(&mut received).await.unwrap();
    assert!(received == stdout, "every byte, in order");
    let writes = to_caller.lock().unwrap().clone();
    let (last, full) = writes.split_last().unwrap();
    assert!(*last > 0);
    assert!(
        full.iter().all(|&n| n >= SMALL),
        "4 KiB reads were written as they came: {writes:?}"
    );
    assert!(
        writes.len() <= stdout.len() / SMALL + 1,
        "{} writes",
        writes.len()
    );
}

/// Writes `key` into `from` and reads it from `to`, failing when it takes five seconds: with the
/// clock paused, a pump that waited for more data would let them run out.
async fn passes_at_once(from: &mut DuplexStream, to: &mut DuplexStream, key: u8) {
    from.write_all(&[key]).await.unwrap();
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), to.read_exact(&mut byte))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(byte, [key]);
}

#[tokio::test(start_paused = true)]
async fn a_keystroke_leaves_at_once_both_ways() {
    let (mut caller, mut kubelet, mut caller_peer, mut kubelet_peer) = session(4096);
    let copy = tokio::spawn(async move { both_ways(&mut caller, &mut kubelet).await });
    passes_at_once(&mut caller_peer, &mut kubelet_peer, b'l').await;
    passes_at_once(&mut kubelet_peer, &mut caller_peer, b'$').await;
    drop(caller_peer);
    drop(kubelet_peer);
    assert_eq!(copy.await.unwrap().unwrap(), (1, 1));
}

#[tokio::test]
async fn one_side_ending_closes_the_other_sides_writing_half_and_the_rest_still_flows() {
    let (mut caller, mut kubelet, mut caller_peer, mut kubelet_peer) = session(4096);
    let copy = tokio::spawn(async move { both_ways(&mut caller, &mut kubelet).await });
    // The caller sends its stdin and closes it, as `kubectl cp` into a pod does.
    caller_peer.write_all(b"tar data").await.unwrap();
    caller_peer.shutdown().await.unwrap();
    let mut stdin = Vec::new();
    kubelet_peer.read_to_end(&mut stdin).await.unwrap();
    assert_eq!(stdin, b"tar data", "the end is passed on");
    kubelet_peer.write_all(b"done").await.unwrap();
    kubelet_peer.shutdown().await.unwrap();
    let mut out = Vec::new();
    caller_peer.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, b"done");
    assert_eq!(copy.await.unwrap().unwrap(), (8, 4));
}

/// Writes all of `bytes` into an in-memory pipe with room for them.
fn fill(pipe: &mut DuplexStream, bytes: &[u8]) {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut sent = 0;
    while sent < bytes.len() {
        match Pin::new(&mut *pipe).poll_write(&mut cx, &bytes[sent..]) {
            Poll::Ready(Ok(n)) => sent += n,
            other => panic!("the pipe has room: {other:?}"),
        }
    }
}

#[test]
fn a_small_batch_gives_its_buffer_back_and_a_bulk_one_keeps_a_large_one() {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let (mut reader, mut reader_peer) = duplex(1 << 20);
    let (mut writer, _writer_peer) = duplex(1 << 20);
    let mut pump = Pump::default();
    fill(&mut reader_peer, b"ls\n");
    assert!(pump.poll(&mut cx, &mut reader, &mut writer).is_pending());
    assert_eq!(pump.moved, 3);
    assert_eq!(pump.buf.capacity(), 0, "nothing held between keystrokes");

    fill(&mut reader_peer, &vec![0u8; 200_000]);
    assert!(pump.poll(&mut cx, &mut reader, &mut writer).is_pending());
    assert_eq!(pump.moved, 3 + 200_000);
    assert_eq!(pump.capacity, LARGE, "a bulk copy reads in large batches");
    assert!(
        pump.buf.capacity() > 0,
        "and keeps its buffer while it lasts"
    );
}
