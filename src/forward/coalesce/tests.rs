use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

use super::*;

/// A body fed from a channel, as hyper's `Incoming` is fed by the task reading the connection.
struct Fed(mpsc::Receiver<Result<Frame<Bytes>, &'static str>>);

impl Body for Fed {
    type Data = Bytes;
    type Error = &'static str;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
        self.0.poll_recv(cx)
    }
}

/// A body fed as hyper feeds `Incoming`: through a one-slot channel, the feeder sending the
/// next chunk only once the last was taken, and reporting a dry read of the connection when a
/// burst is over (after its last chunk was taken, as hyper reads only then).
struct Feeder {
    sender: mpsc::Sender<Result<Frame<Bytes>, &'static str>>,
    drained: Drained,
}

impl Feeder {
    async fn send(&self, frame: Result<Frame<Bytes>, &'static str>) {
        self.sender.send(frame).await.unwrap();
    }

    /// `lines`, then the connection found dry.
    async fn burst(&self, lines: std::ops::Range<usize>) {
        for i in lines {
            self.send(Ok(Frame::data(line(i)))).await;
        }
        drop(self.sender.reserve().await.unwrap());
        self.drained.report();
    }
}

fn fed(capacity: usize) -> (Feeder, Coalesced<Fed>) {
    let (sender, receiver) = mpsc::channel(capacity);
    let drained = Drained::new();
    let body = Coalesced::new(Fed(receiver), Some(drained.clone()));
    (Feeder { sender, drained }, body)
}

fn line(i: usize) -> Bytes {
    Bytes::from(format!("2026-11-27T06:00:00.{i:09}Z INFO line {i}\n"))
}

async fn frames<B: Body<Data = Bytes> + Unpin>(
    body: &mut B,
) -> Vec<Result<Frame<Bytes>, B::Error>> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        out.push(frame);
    }
    out
}

#[tokio::test]
async fn lines_already_readable_leave_as_one_frame() {
    let (feeder, mut body) = fed(1000);
    let mut expected = Vec::new();
    for i in 0..500 {
        expected.extend_from_slice(&line(i));
        feeder.send(Ok(Frame::data(line(i)))).await;
    }
    drop(feeder);
    let got = frames(&mut body).await;
    assert_eq!(got.len(), 1, "one frame for what was readable at once");
    let data = got
        .into_iter()
        .next()
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(data, Bytes::from(expected));
    assert!(body.is_end_stream());
}

#[tokio::test(start_paused = true)]
async fn a_line_alone_leaves_without_waiting_for_the_next() {
    let (feeder, mut body) = fed(1);
    tokio::spawn(async move {
        feeder.burst(1..2).await;
        // The clock is paused: this only passes once nothing else can run, so a body that
        // waited for the second line would get both in its first frame.
        tokio::time::sleep(Duration::from_secs(10)).await;
        feeder.burst(2..3).await;
    });
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, line(1));
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(second, line(2));
    assert!(body.frame().await.is_none());
}

/// Two bursts of 100 lines, each chunk handed over alone as hyper hands them, the connection
/// found dry after each burst and the second coming a while later (the tests pause the clock:
/// once nothing else can run); the feeder's task ends once all are taken.
fn two_bursts_one_chunk_at_a_time() -> (tokio::task::JoinHandle<()>, Coalesced<Fed>) {
    let (feeder, body) = fed(1);
    let writer = tokio::spawn(async move {
        feeder.burst(0..100).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        feeder.burst(100..200).await;
    });
    (writer, body)
}

/// Asserts that `data` is the two bursts, every byte in order, a frame for each.
fn assert_gathered(data: &[Bytes]) {
    let burst = |lines: std::ops::Range<usize>| -> Bytes {
        lines
            .flat_map(|i| line(i).to_vec())
            .collect::<Vec<u8>>()
            .into()
    };
    let sizes: Vec<usize> = data.iter().map(Bytes::len).collect();
    assert!(
        data == [burst(0..100), burst(100..200)],
        "a frame per burst, every byte in order; got frames of {sizes:?} bytes"
    );
}

#[tokio::test(start_paused = true)]
async fn chunks_handed_over_one_at_a_time_leave_as_a_frame_per_burst() {
    let (writer, mut body) = two_bursts_one_chunk_at_a_time();
    let got: Vec<Bytes> = frames(&mut body)
        .await
        .into_iter()
        .map(|f| f.unwrap().into_data().unwrap())
        .collect();
    writer.await.unwrap();
    assert_gathered(&got);
}

/// Reads `body` as hyper's server does: within one run of its task it polls the body again
/// after a `Pending` (its dispatcher loops), before any other task has had a chance to run.
async fn data_polled_twice_per_run(body: &mut Coalesced<Fed>) -> Vec<Bytes> {
    let mut out = Vec::new();
    std::future::poll_fn(|cx| {
        let mut pendings = 0;
        loop {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(frame)) => {
                    out.push(frame.unwrap().into_data().unwrap());
                    pendings = 0;
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending if pendings == 1 => return Poll::Pending,
                Poll::Pending => pendings += 1,
            }
        }
    })
    .await;
    out
}

#[tokio::test(start_paused = true)]
async fn a_reader_polling_again_in_the_same_run_still_waits_for_the_dry_read() {
    let (writer, mut body) = two_bursts_one_chunk_at_a_time();
    let got = data_polled_twice_per_run(&mut body).await;
    writer.await.unwrap();
    assert_gathered(&got);
}

#[tokio::test]
async fn large_chunks_pass_without_a_copy_and_frames_stay_bounded() {
    let (feeder, mut body) = fed(100);
    let big = Bytes::from(vec![7u8; GATHER_LIMIT]);
    let small = Bytes::from(vec![1u8; 1000]);
    feeder.send(Ok(Frame::data(big.clone()))).await;
    for _ in 0..99 {
        feeder.send(Ok(Frame::data(small.clone()))).await;
    }
    drop(feeder);
    let got = frames(&mut body).await;
    let first = got[0].as_ref().unwrap().data_ref().unwrap();
    assert_eq!(first.as_ptr(), big.as_ptr(), "passed as it came");
    let sizes: Vec<usize> = got[1..]
        .iter()
        .map(|f| f.as_ref().unwrap().data_ref().unwrap().len())
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 99 * 1000);
    assert!(sizes.iter().all(|&n| n < GATHER_LIMIT + 1000), "{sizes:?}");
    assert!(
        sizes.len() >= 2,
        "99 KB is more than one frame's bound: {sizes:?}"
    );
}

#[tokio::test]
async fn trailers_and_errors_come_after_the_data_before_them() {
    let (feeder, mut body) = fed(10);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    feeder.send(Ok(Frame::data(line(1)))).await;
    feeder.send(Ok(Frame::data(line(2)))).await;
    feeder.send(Ok(Frame::trailers(trailers.clone()))).await;
    drop(feeder);
    let got = frames(&mut body).await;
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].as_ref().unwrap().data_ref().unwrap(),
        &[line(1), line(2)].concat()[..]
    );
    assert_eq!(got[1].as_ref().unwrap().trailers_ref(), Some(&trailers));

    let (feeder, mut body) = fed(10);
    feeder.send(Ok(Frame::data(line(1)))).await;
    feeder.send(Err("connection reset")).await;
    let got = frames(&mut body).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].as_ref().unwrap().data_ref().unwrap(), &line(1));
    assert_eq!(got[1].as_ref().err(), Some(&"connection reset"));
}

#[tokio::test]
async fn a_body_of_known_length_keeps_its_length_and_answers_at_once() {
    let mut body = Coalesced::new(Full::new(Bytes::from_static(b"ok")), None);
    assert_eq!(body.size_hint().exact(), Some(2));
    assert!(!body.is_end_stream());
    let frame = body.frame().await.unwrap().map_err(|e: Infallible| e);
    assert_eq!(frame.unwrap().into_data().unwrap(), "ok");
    assert!(body.is_end_stream());
}

#[tokio::test]
async fn without_a_connection_to_watch_chunks_leave_as_they_come() {
    let (sender, receiver) = mpsc::channel(10);
    let mut body = Coalesced::new(Fed(receiver), None);
    sender.send(Ok(Frame::data(line(1)))).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(frame, line(1));
    sender.send(Ok(Frame::data(line(2)))).await.unwrap();
    drop(sender);
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(frame, line(2));
}
