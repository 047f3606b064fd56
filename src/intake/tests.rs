#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::metered::Metered;
use super::*;
use http_body::{Body as _, Frame};
use prost::bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::body::Body;

/// A request body whose frames the test sends when it likes.
struct Frames(mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.0
            .poll_recv(cx)
            .map(|next| next.map(|b| Ok(Frame::data(b))))
    }
}

fn frames() -> (mpsc::UnboundedSender<Bytes>, Body) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (sender, Body::new(Frames(receiver)))
}

/// `payload` as one gRPC message.
fn message(payload: &[u8]) -> Bytes {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

fn intake(waiting: usize, bytes: usize) -> Arc<Intake> {
    Arc::new(Intake::new(&IntakeOptions {
        grpc_request_timeout: Duration::from_secs(5),
        grpc_max_requests_waiting: waiting,
        grpc_max_bytes_reading: bytes,
        ..IntakeOptions::default()
    }))
}

#[tokio::test]
async fn a_request_sent_whole_is_read_without_a_count_and_without_a_copy() {
    let intake = intake(1, 16);
    let _busy = (Counted::new(&intake.waiting), Counted::new(&intake.waiting));
    let (send, body) = frames();
    let whole = message(b"hello, this is longer than the budget");
    send.send(whole.clone()).unwrap();
    drop(send);
    let read = intake.unary(body, 1024, None).await.unwrap();
    assert_eq!(&read[..], b"hello, this is longer than the budget");
    assert_eq!(read.as_ptr(), whole[PREFIX..].as_ptr());
}

#[tokio::test(start_paused = true)]
async fn a_request_still_arriving_waits_on_its_client_and_holds_its_bytes_from_the_budget() {
    let intake = intake(1, 32);
    let whole = message(&[7; 20]);
    let (send, body) = frames();
    send.send(whole.slice(..10)).unwrap();
    let reading = tokio::spawn({
        let intake = Arc::clone(&intake);
        async move { intake.unary(body, 1024, None).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(intake.waiting.load(Ordering::Relaxed), 1);
    // Charged for the whole message its prefix declares: the room it holds for it.
    assert_eq!(intake.bytes.available_permits(), 7);
    // A second slow request is past the bound (on a connection that cannot be told apart,
    // refused); one sent whole is still read.
    let (other, slow) = frames();
    other.send(whole.slice(..3)).unwrap();
    assert_eq!(intake.unary(slow, 1024, None).await, Err(Refusal::Waiting));
    let (other, fast) = frames();
    other.send(whole.clone()).unwrap();
    drop(other);
    assert_eq!(intake.unary(fast, 1024, None).await.unwrap().len(), 20);
    send.send(whole.slice(10..)).unwrap();
    drop(send);
    assert_eq!(reading.await.unwrap().unwrap(), whole.slice(PREFIX..));
    assert_eq!(intake.waiting.load(Ordering::Relaxed), 0);
    assert_eq!(intake.bytes.available_permits(), 32);
}

#[tokio::test(start_paused = true)]
async fn a_request_not_whole_within_the_timeout_or_larger_than_the_budget_is_refused() {
    let intake = intake(4, 32);
    let (send, body) = frames();
    send.send(message(&[1; 10]).slice(..4)).unwrap();
    let started = Instant::now();
    assert_eq!(
        intake.unary(body, 1024, None).await,
        Err(Refusal::TooSlow(Duration::from_secs(5)))
    );
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    // A message that declares more than the budget is refused at its first bytes.
    let (send, body) = frames();
    send.send(message(&[1; 100]).slice(..30)).unwrap();
    assert_eq!(intake.unary(body, 1024, None).await, Err(Refusal::Bytes));
    // Two that fit alone but not together: the second waits for the first.
    let (first, body) = frames();
    first.send(message(&[1; 20]).slice(..3)).unwrap();
    let reading = tokio::spawn({
        let intake = Arc::clone(&intake);
        async move { intake.unary(body, 1024, None).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    first.send(message(&[1; 20]).slice(3..6)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(intake.bytes.available_permits(), 7);
    let (second, body) = frames();
    second.send(message(&[2; 20]).slice(..6)).unwrap();
    let waiting = tokio::spawn({
        let intake = Arc::clone(&intake);
        async move { intake.unary(body, 1024, None).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    second.send(message(&[2; 20]).slice(6..)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Not read: its rest has been sent, but the budget has no room for it yet.
    assert!(!waiting.is_finished());
    first.send(message(&[1; 20]).slice(6..)).unwrap();
    assert_eq!(reading.await.unwrap().unwrap().len(), 20);
    assert_eq!(waiting.await.unwrap().unwrap().len(), 20);
    assert_eq!(intake.bytes.available_permits(), 32);
}

#[tokio::test]
async fn framing_faults_are_named() {
    let intake = intake(4, 1024);
    let read = |sent: Vec<Bytes>| {
        let intake = Arc::clone(&intake);
        async move {
            let (send, body) = frames();
            for frame in sent {
                send.send(frame).unwrap();
            }
            drop(send);
            intake.unary(body, 8, None).await
        }
    };
    let too_large = Refusal::TooLarge { found: 9, limit: 8 };
    assert_eq!(
        read(vec![message(&[0; 9]).slice(..5)]).await,
        Err(too_large)
    );
    let two = [message(b"a"), message(b"b")].concat();
    assert_eq!(
        read(vec![Bytes::from(two)]).await,
        Err(Refusal::NotOneMessage)
    );
    assert_eq!(
        read(vec![message(b"abc").slice(..6)]).await,
        Err(Refusal::NotOneMessage)
    );
    assert_eq!(read(vec![]).await, Err(Refusal::NotOneMessage));
    let mut compressed = message(b"abc").to_vec();
    compressed[0] = 1;
    assert_eq!(
        read(vec![Bytes::from(compressed)]).await,
        Err(Refusal::Compressed)
    );
    assert_eq!(
        &read(vec![Bytes::new(), message(b"ok")]).await.unwrap()[..],
        b"ok"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_of_messages_is_held_to_the_deadline_message_by_message() {
    use http_body_util_like::next;
    let intake = intake(4, 64);
    let (send, body) = frames();
    let mut metered = intake.metered(body);
    // A message and the start of the next in one frame, the rest later.
    let (first, second) = (message(&[1; 10]), message(&[2; 10]));
    send.send(Bytes::from([&first[..], &second[..3]].concat()))
        .unwrap();
    assert!(next(&mut metered).await.is_some());
    assert_eq!(intake.bytes.available_permits(), 61);
    tokio::time::sleep(Duration::from_secs(4)).await;
    send.send(second.slice(3..)).unwrap();
    assert!(next(&mut metered).await.is_some());
    assert_eq!(intake.bytes.available_permits(), 64);
    // Between messages the stream may stay quiet as long as it likes.
    tokio::time::sleep(Duration::from_secs(60)).await;
    send.send(message(&[3; 10]).slice(..2)).unwrap();
    assert!(next(&mut metered).await.is_some());
    let started = Instant::now();
    let failed = next(&mut metered).await.unwrap().unwrap_err();
    assert_eq!(failed.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(next(&mut metered).await.is_none());
    assert_eq!(intake.bytes.available_permits(), 64);
}

#[tokio::test]
async fn a_message_of_a_stream_over_the_budget_ends_the_stream() {
    use http_body_util_like::next;
    let intake = intake(4, 16);
    let (send, body) = frames();
    let mut metered = intake.metered(body);
    send.send(message(&[0; 40]).slice(..20)).unwrap();
    let failed = next(&mut metered).await.unwrap().unwrap_err();
    assert_eq!(failed.code(), tonic::Code::ResourceExhausted);
}

mod http_body_util_like {
    use super::*;

    pub async fn next(body: &mut Metered) -> Option<Result<Frame<Bytes>, Status>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }
}
