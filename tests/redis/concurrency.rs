//! Concurrency limits on one Redis shared by three tollgate replicas, as Envoy uses them: a
//! take when a request arrives, and when its stream ends a refund of what the answer said it
//! reserved, each through whichever replica. 200 callers never hold more than the limit at
//! once; a refused take gives nothing back; a hold never given back is released after the
//! longest hold.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_process::RedisServer;
use common::rng::Rng;
use common::*;
use tollgate::pb::{self, rate_limit_response as rls};
use tonic::transport::Channel;

/// 20 in flight per tenant; a hold never given back is released after 2 s.
const RULES: &str = r#"
domain: ai
descriptors:
  - key: tenant
    rate_limit:
      name: in_flight
      unit: second
      unit_multiplier: 2
      requests_per_unit: 20
      algorithm: concurrency
"#;

const LIMIT: usize = 20;

/// A take (`refund` false) or a give-back of `hits` for `tenant`.
fn hold(tenant: &str, hits: u64, refund: bool) -> pb::RateLimitRequest {
    let mut request = request("ai", &[&[("tenant", tenant)]]);
    request.descriptors[0].hits_addend = Some(hits);
    request.descriptors[0].is_negative_hits = refund;
    request
}

/// What an answer says the request reserved under `in_flight`, as Envoy reads it back for the
/// refund (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:reserved:in_flight)%`).
fn reserved(response: &pb::RateLimitResponse) -> Option<u64> {
    let metadata = struct_json(response.dynamic_metadata.as_ref()?);
    metadata["reserved"]["in_flight"]
        .as_f64()
        .map(|hits| hits as u64)
}

/// Three replicas on one Redis, ready, and a client of each.
async fn fleet(
    redis: &RedisServer,
    config: &std::path::Path,
) -> (Vec<Replica>, Vec<pb::RateLimitServiceClient<Channel>>) {
    let url = redis.url();
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::spawn(config, &["--store", &url, "--store-timeout", "2s"]))
        .collect();
    let mut clients = Vec::new();
    for replica in &replicas {
        replica.wait_ready().await;
        clients.push(replica.client().await);
    }
    (replicas, clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_callers_through_three_replicas_never_hold_more_than_the_limit() {
    let redis = RedisServer::start();
    let config = config_dir(&[("ai.yaml", RULES)]);
    let (_replicas, clients) = fleet(&redis, config.path()).await;
    let started = Instant::now();
    let run_for = Duration::from_secs(3);
    let mut callers = Vec::new();
    for caller in 0..200u64 {
        let clients = clients.clone();
        callers.push(tokio::spawn(async move {
            let mut rng = Rng(0x00c0_ffee + caller);
            // Each hold as the caller saw it: from the take's answer to the refund's send,
            // within what the store held it for.
            let mut held: Vec<(Instant, Instant)> = Vec::new();
            let mut refused = 0;
            while started.elapsed() < run_for {
                let mut client = clients[rng.below(3) as usize].clone();
                let answer = client
                    .should_rate_limit(hold("acme", 1, false))
                    .await
                    .unwrap()
                    .into_inner();
                if answer.overall_code != rls::Code::Ok as i32 {
                    assert_eq!(reserved(&answer), None, "a refused take reserves nothing");
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(1 + rng.below(5))).await;
                    continue;
                }
                let from = Instant::now();
                assert_eq!(reserved(&answer), Some(1));
                tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
                let mut client = clients[rng.below(3) as usize].clone();
                let to = Instant::now();
                client
                    .should_rate_limit(hold("acme", 1, true))
                    .await
                    .unwrap();
                held.push((from, to));
            }
            (held, refused)
        }));
    }
    let mut holds = Vec::new();
    let mut refused = 0;
    for caller in callers {
        let (held, denied) = caller.await.unwrap();
        holds.extend(held);
        refused += denied;
    }
    // The most holds at once: +1 at each start, -1 at each end, ends first at a tie.
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|&(from, to)| [(from, 1), (to, -1)])
        .collect();
    events.sort_by_key(|&(at, change)| (at, change));
    let (mut now, mut most) = (0, 0);
    for (_, change) in events {
        now += change;
        most = most.max(now);
    }
    println!(
        "{} holds taken, {refused} takes refused, at most {most} at once",
        holds.len()
    );
    assert!(most <= LIMIT as i32, "{most} held at once, limit {LIMIT}");
    assert!(holds.len() >= 200, "{} holds taken", holds.len());
    assert!(refused > 0, "200 callers contend for 20 holds");
    // Every hold given back: the limit is whole again.
    let mut client = clients[0].clone();
    let check = client
        .should_rate_limit(hold("acme", 0, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(check.statuses[0].limit_remaining, LIMIT as u32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_never_given_back_is_released_after_the_longest_hold_and_not_before() {
    let redis = RedisServer::start();
    let config = config_dir(&[("ai.yaml", RULES)]);
    let (_replicas, clients) = fleet(&redis, config.path()).await;
    let clients = Arc::new(clients);
    let take = |replica: usize| {
        let clients = Arc::clone(&clients);
        async move {
            let mut client = clients[replica].clone();
            let answer = client
                .should_rate_limit(hold("lost", 1, false))
                .await
                .unwrap()
                .into_inner();
            answer.overall_code == rls::Code::Ok as i32
        }
    };
    // Twenty streams whose proxy restarted: their refunds never come.
    let first = Instant::now();
    for index in 0..LIMIT {
        assert!(take(index % 3).await, "take {index}");
    }
    assert!(!take(0).await, "the limit is held");
    let deadline = first + Duration::from_secs(10);
    let released = loop {
        if take(1).await {
            break first.elapsed();
        }
        assert!(Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Not before the longest hold, 2 s from the first take (Redis's clock, which the
    // replicas track, and this one agree within milliseconds).
    assert!(
        released >= Duration::from_millis(1_950),
        "released after {released:?}"
    );
}
