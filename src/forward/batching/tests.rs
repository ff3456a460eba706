use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// What the kubelet sends for one log line: a TLS record of about this size, alone.
const RECORD: usize = 126;

/// A connection to a peer on loopback: ours batched, theirs plain with `TCP_NODELAY` (each
/// write its own segment, as the kubelet's).
async fn connected() -> (BatchedTcp, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ours = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (theirs, _) = listener.accept().await.unwrap();
    theirs.set_nodelay(true).unwrap();
    (BatchedTcp::new(ours), theirs)
}

/// The peer writes `records` records one by one, letting the reader run after each (the two
/// share the test's thread, as the kubelet and the proxy share a node's cores).
fn trickle(mut theirs: TcpStream, records: usize) -> tokio::task::JoinHandle<TcpStream> {
    tokio::spawn(async move {
        for i in 0..records {
            theirs.write_all(&[(i % 251) as u8; RECORD]).await.unwrap();
            tokio::task::yield_now().await;
        }
        theirs
    })
}

/// Reads `bytes` bytes (no more), checking each is the trickle's; returns the sizes of the reads.
async fn read_trickle(ours: &mut BatchedTcp, bytes: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    let mut got = 0;
    while got < bytes {
        let want = (bytes - got).min(buf.len());
        let n = tokio::time::timeout(Duration::from_secs(10), ours.read(&mut buf[..want]))
            .await
            .expect("the tail is read, not held")
            .unwrap();
        assert!(n > 0, "the peer does not close");
        for (k, byte) in buf[..n].iter().enumerate() {
            assert_eq!(*byte, ((got + k) / RECORD % 251) as u8, "byte {}", got + k);
        }
        got += n;
        sizes.push(n);
    }
    sizes
}

#[tokio::test]
async fn a_trickle_is_read_in_batches_and_its_tail_is_not_held() {
    let (mut ours, theirs) = connected().await;
    let records = 4000;
    let writer = trickle(theirs, records);
    let sizes = read_trickle(&mut ours, records * RECORD).await;
    let _theirs = writer.await.unwrap();
    let big = sizes.iter().filter(|&&n| n >= LOW_WATER).count();
    assert!(
        sizes.len() < records / 10 && big > 0,
        "{records} records of {RECORD} bytes came in {} reads, {big} of them of {LOW_WATER} bytes or more",
        sizes.len()
    );
    // The tail, below the low-water mark, was read when the period ran out, and that ended
    // batching: a line that comes alone later is read as it comes.
    assert!(!ours.batching, "the end of a trickle ends batching");
}

#[tokio::test]
async fn writing_ends_batching_so_the_answer_is_not_held() {
    let (mut ours, theirs) = connected().await;
    let writer = trickle(theirs, 1000);
    // Half of it: the rest is still coming.
    read_trickle(&mut ours, 500 * RECORD).await;
    assert!(ours.batching, "batching in the middle of a trickle");

    ours.write_all(b"next request").await.unwrap();
    assert!(!ours.batching, "a write ends batching");
    let mut rest = vec![0; 500 * RECORD];
    ours.read_exact(&mut rest).await.unwrap();
    let mut theirs = writer.await.unwrap();
    let mut request = [0; 12];
    theirs.read_exact(&mut request).await.unwrap();
    theirs.write_all(b"answer").await.unwrap();
    let mut answer = [0; 6];
    ours.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"answer");
}

#[tokio::test]
async fn replies_to_what_we_write_never_start_batching() {
    let (mut ours, mut theirs) = connected().await;
    let echo = tokio::spawn(async move {
        let mut buf = [0; RECORD];
        while theirs.read_exact(&mut buf).await.is_ok() {
            theirs.write_all(&buf).await.unwrap();
        }
    });
    let mut buf = [0; RECORD];
    for i in 0..200 {
        ours.write_all(&[i as u8; RECORD]).await.unwrap();
        ours.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, [i as u8; RECORD]);
    }
    assert!(
        !ours.batching,
        "a conversation of small messages (a port-forwarded protocol) is no trickle"
    );
    drop(ours);
    echo.await.unwrap();
}
