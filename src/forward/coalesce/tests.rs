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

fn fed(
    capacity: usize,
) -> (
    mpsc::Sender<Result<Frame<Bytes>, &'static str>>,
    Coalesced<Fed>,
) {
    let (sender, receiver) = mpsc::channel(capacity);
    (sender, Coalesced::new(Fed(receiver)))
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
    let (sender, mut body) = fed(1000);
    let mut expected = Vec::new();
    for i in 0..500 {
        expected.extend_from_slice(&line(i));
        sender.send(Ok(Frame::data(line(i)))).await.unwrap();
    }
    drop(sender);
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
    let (sender, mut body) = fed(1);
    tokio::spawn(async move {
        sender.send(Ok(Frame::data(line(1)))).await.unwrap();
        // The clock is paused: this only passes once nothing else can run, so a body that
        // waited for the second line would get both in its first frame.
        tokio::time::sleep(Duration::from_secs(10)).await;
        sender.send(Ok(Frame::data(line(2)))).await.unwrap();
    });
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, line(1));
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(second, line(2));
    assert!(body.frame().await.is_none());
}

/// A body fed as hyper's connection task feeds one: a chunk each time the writer runs, while
/// chunks are readable (100 lines); the writer's task ends once all are taken.
fn hundred_lines_one_per_turn() -> (tokio::task::JoinHandle<()>, Coalesced<Fed>) {
    let (sender, body) = fed(1);
    let writer = tokio::spawn(async move {
        for i in 0..100 {
            sender.send(Ok(Frame::data(line(i)))).await.unwrap();
        }
    });
    (writer, body)
}

/// Asserts that `data` is the 100 lines, every byte in order, in a few frames.
fn assert_gathered(data: &[Bytes]) {
    assert_eq!(
        data.concat(),
        (0..100).flat_map(|i| line(i).to_vec()).collect::<Vec<u8>>(),
        "every byte, in order"
    );
    assert!(
        data.len() < 10,
        "100 chunks produced one per turn came out in {} frames",
        data.len()
    );
}

#[tokio::test]
async fn a_writer_task_producing_one_chunk_per_turn_is_gathered() {
    let (writer, mut body) = hundred_lines_one_per_turn();
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

#[tokio::test]
async fn a_reader_polling_again_in_the_same_run_still_waits_for_the_turn() {
    let (writer, mut body) = hundred_lines_one_per_turn();
    let got = data_polled_twice_per_run(&mut body).await;
    writer.await.unwrap();
    assert_gathered(&got);
}

#[tokio::test]
async fn large_chunks_pass_without_a_copy_and_frames_stay_bounded() {
    let (sender, mut body) = fed(100);
    let big = Bytes::from(vec![7u8; GATHER_LIMIT]);
    let small = Bytes::from(vec![1u8; 1000]);
    sender.send(Ok(Frame::data(big.clone()))).await.unwrap();
    for _ in 0..99 {
        sender.send(Ok(Frame::data(small.clone()))).await.unwrap();
    }
    drop(sender);
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
    let (sender, mut body) = fed(10);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    sender.send(Ok(Frame::data(line(1)))).await.unwrap();
    sender.send(Ok(Frame::data(line(2)))).await.unwrap();
    sender
        .send(Ok(Frame::trailers(trailers.clone())))
        .await
        .unwrap();
    drop(sender);
    let got = frames(&mut body).await;
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].as_ref().unwrap().data_ref().unwrap(),
        &[line(1), line(2)].concat()[..]
    );
    assert_eq!(got[1].as_ref().unwrap().trailers_ref(), Some(&trailers));

    let (sender, mut body) = fed(10);
    sender.send(Ok(Frame::data(line(1)))).await.unwrap();
    sender.send(Err("connection reset")).await.unwrap();
    let got = frames(&mut body).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].as_ref().unwrap().data_ref().unwrap(), &line(1));
    assert_eq!(got[1].as_ref().err(), Some(&"connection reset"));
}

#[tokio::test]
async fn a_body_of_known_length_keeps_its_length_and_answers_at_once() {
    let mut body = Coalesced::new(Full::new(Bytes::from_static(b"ok")));
    assert_eq!(body.size_hint().exact(), Some(2));
    assert!(!body.is_end_stream());
    let frame = body.frame().await.unwrap().map_err(|e: Infallible| e);
    assert_eq!(frame.unwrap().into_data().unwrap(), "ok");
    assert!(body.is_end_stream());
}
