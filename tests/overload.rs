//! Load shedding: with the store stalled, no more than --max-in-flight decisions wait on it;
//! the rest are refused with RESOURCE_EXHAUSTED after --max-queue-time, long before the store
//! answers, and the admitted ones are answered once it does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use tollgate::server::Options;
use tollgate::service::ServiceOptions;

const LIMITS: &str = "domain: o\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_in_flight_requests_are_shed_with_resource_exhausted() {
    let server = start_with(
        &[("o.yaml", LIMITS)],
        Setup {
            store: StoreKind::Redis,
            store_timeout: Duration::from_secs(10),
            options: Options {
                service: ServiceOptions {
                    max_in_flight: 2,
                    max_queue_time: Duration::from_millis(100),
                    ..ServiceOptions::default()
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    let Backing::Redis(redis) = &server.backing else {
        panic!("a Redis test");
    };
    // Stall the store: every call waits for the pause to end.
    let pause = Duration::from_millis(2_000);
    redis.query(&["CLIENT", "PAUSE", &pause.as_millis().to_string(), "ALL"]);
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
