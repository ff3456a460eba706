use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

use super::*;

/// A transport that counts the reads that brought data.
struct Counted {
    io: DuplexStream,
    reads: Arc<AtomicUsize>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(Ok(()))
    }
}

fn counted() -> (ReadAhead<Counted>, DuplexStream, Arc<AtomicUsize>) {
    let (io, peer) = duplex(4 << 20);
    let reads = Arc::new(AtomicUsize::new(0));
    let transport = Counted {
        io,
        reads: Arc::clone(&reads),
    };
    (ReadAhead::new(transport), peer, reads)
}

/// Reads everything in reads of at most 4 KiB, as rustls does.
async fn read_as_rustls(stream: &mut ReadAhead<Counted>) -> Vec<u8> {
    let mut all = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        if n == 0 {
            return all;
        }
        all.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn a_bulk_transfer_is_read_in_large_reads() {
    let (mut stream, mut peer, reads) = counted();
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    peer.write_all(&data).await.unwrap();
    drop(peer);
    let got = read_as_rustls(&mut stream).await;
    assert!(got == data, "every byte, in order");
    let reads = reads.load(Ordering::Relaxed);
    assert!(
        reads <= data.len() / AHEAD + 2,
        "{reads} socket reads for {} bytes read 4 KiB at a time",
        data.len()
    );
}

#[tokio::test]
async fn a_request_is_read_directly_and_holds_no_buffer() {
    let (mut stream, mut peer, reads) = counted();
    peer.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
        .await
        .unwrap();
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await.unwrap();
    assert_eq!(&chunk[..n], b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n");
    assert_eq!(reads.load(Ordering::Relaxed), 1);
    assert!(!stream.ahead);
    assert_eq!(stream.buf.capacity(), 0);
}

#[tokio::test]
async fn a_quiet_connection_gives_its_buffer_back() {
    let (mut stream, mut peer, _reads) = counted();
    peer.write_all(&vec![1u8; 100_000]).await.unwrap();
    let mut chunk = [0u8; 4096];
    let mut got = 0;
    while got < 100_000 {
        got += stream.read(&mut chunk).await.unwrap();
    }
    assert!(stream.ahead, "a busy connection reads ahead");
    // Nothing more is waiting: the next read finds the socket empty.
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut out = ReadBuf::new(&mut chunk);
    assert!(
        Pin::new(&mut stream)
            .poll_read(&mut cx, &mut out)
            .is_pending()
    );
    assert!(!stream.ahead);
    assert_eq!(stream.buf.capacity(), 0, "no buffer held while quiet");
    peer.write_all(b"more").await.unwrap();
    let n = stream.read(&mut chunk).await.unwrap();
    assert_eq!(&chunk[..n], b"more");
}
