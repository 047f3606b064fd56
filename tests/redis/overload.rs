//! Load shedding: with the store stalled, no more than --max-in-flight decisions wait on it;
//! the rest are refused with RESOURCE_EXHAUSTED after --max-queue-time, long before the store
//! answers, and the admitted ones are answered once it does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use tollgate::server::Options;
use tollgate::service::ServiceOptions;

const LIMITS: &str = "domain: o\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// A server on Redis with 2 decision slots, requests of at most 1 KiB.
async fn two_slot_server(max_queue_time: Duration) -> TestServer {
    let mut service = ServiceOptions {
        max_in_flight: 2,
        max_queue_time,
        ..ServiceOptions::default()
    };
    service.input_limits.max_request_bytes = 1_024;
    start_with(
        &[("o.yaml", LIMITS)],
        Setup {
            store: StoreKind::Redis,
            store_timeout: Duration::from_secs(10),
            options: Options {
                service,
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await
}

/// Stalls the server's Redis for `pause`: every store call waits for it to end.
fn stall(server: &TestServer, pause: Duration) {
    let Backing::Redis(redis) = &server.backing else {
        panic!("a Redis test");
    };
    redis.query(&["CLIENT", "PAUSE", &pause.as_millis().to_string(), "ALL"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_in_flight_requests_are_shed_with_resource_exhausted() {
    let server = two_slot_server(Duration::from_millis(100)).await;
    let pause = Duration::from_millis(2_000);
    stall(&server, pause);
    let started = Instant::now();
    let client = server.client().await;
    let calls = (0..20).map(|i| {
        let mut client = client.clone();
        async move {
            let answer = client
                .should_rate_limit(request("o", &[&[("user", &format!("u{i}"))]]))
                .await;
            (
                answer.map(|r| r.into_inner().overall_code),
                started.elapsed(),
            )
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let shed: Vec<Duration> = answers
        .iter()
        .filter(|(a, _)| matches!(a, Err(s) if s.code() == tonic::Code::ResourceExhausted))
        .map(|(_, took)| *took)
        .collect();
    let admitted: Vec<Duration> = answers
        .iter()
        .filter(|(a, _)| matches!(a, Ok(code) if *code == OK))
        .map(|(_, took)| *took)
        .collect();
    assert_eq!((admitted.len(), shed.len()), (2, 18), "{answers:?}");
    // Shed while the store was still stalled; the admitted ones waited for it.
    assert!(shed.iter().all(|took| *took < pause), "{shed:?}");
    assert!(
        admitted
            .iter()
            .all(|took| *took >= pause - Duration::from_millis(200)),
        "{admitted:?}"
    );
    let status = answers.iter().find_map(|(a, _)| a.as_ref().err()).unwrap();
    assert!(status.message().contains("overloaded"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_queue_has_no_room_for_is_refused_unread() {
    let pause = Duration::from_millis(2_000);
    // Waiting requests outlast the pause, so the queue stays full until it ends.
    let server = two_slot_server(pause * 5).await;
    let mut client = server.client().await;
    // Too large to decode: read, it fails with OUT_OF_RANGE.
    let oversized = request("o", &[&[("user", &"x".repeat(2_048))]]);
    let read = client.should_rate_limit(oversized.clone()).await;
    assert_eq!(read.unwrap_err().code(), tonic::Code::OutOfRange);

    // Both slots busy on a stalled store, both places in the queue taken.
    stall(&server, pause);
    let busy = (0..4).map(|i| {
        let mut client = client.clone();
        async move {
            let answer = client
                .should_rate_limit(request("o", &[&[("user", &format!("u{i}"))]]))
                .await;
            answer
                .map(|r| r.into_inner().overall_code)
                .map_err(|s| s.code())
        }
    });
    let busy = tokio::spawn(futures_util::future::join_all(busy));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let refused = client.should_rate_limit(oversized).await.unwrap_err();
    // Refused before its body was decoded: RESOURCE_EXHAUSTED, not OUT_OF_RANGE, at once.
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(started.elapsed() < pause / 2, "{:?}", started.elapsed());
    // The four are answered once the store is back: two after the pause, two after them.
    let busy = busy.await.unwrap();
    assert_eq!(busy, [Ok(OK), Ok(OK), Ok(OK), Ok(OK)], "{busy:?}");
}
