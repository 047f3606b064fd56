//! The RLQS protocol as a client sees it, on an in-process server: assignments answer a new
//! bucket at once and follow the split as streams come and their demand changes; idle
//! buckets are abandoned; broken reports end the stream with INVALID_ARGUMENT; a graceful
//! shutdown expires every assignment and ends the streams.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use prost_types::Duration as ProtoDuration;
use tokio::sync::mpsc;
use tollgate::pb::rate_limit_quota_response::bucket_action::BucketAction as Action;
use tollgate::pb::rate_limit_quota_usage_reports::BucketQuotaUsage;
use tollgate::pb::rate_limit_strategy::{BlanketRule, Strategy};
use tollgate::pb::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports,
};
use tollgate::rlqs::QuotaOptions;
use tollgate::server::Options;
use tonic::{Code, Status, Streaming};

const RULES: &str = r#"
domain: quota
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: name
    value: open
    rate_limit: {unlimited: true}
  - key: name
    value: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
"#;

/// A client's end of one stream.
struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    responses: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn open(server: &TestServer) -> Self {
        let client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        Self::open_on(client).await
    }

    /// A stream on `client`'s connection (a clone of a client shares its connection).
    async fn open_on(mut client: RateLimitQuotaServiceClient<tonic::transport::Channel>) -> Self {
        let (reports, inbox) = mpsc::channel(16);
        let outgoing = futures_util::stream::unfold(inbox, |mut inbox| async move {
            inbox.recv().await.map(|report| (report, inbox))
        });
        let responses = client
            .stream_rate_limit_quotas(outgoing)
            .await
            .unwrap()
            .into_inner();
        Self { reports, responses }
    }

    /// Reports `(bucket, allowed, seconds)` for each bucket.
    async fn report(&self, domain: &str, usages: &[(&str, u64, i64)]) {
        let report = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages
                .iter()
                .map(|(name, allowed, seconds)| BucketQuotaUsage {
                    bucket_id: Some(bucket(name)),
                    time_elapsed: Some(ProtoDuration {
                        seconds: *seconds,
                        nanos: 0,
                    }),
                    num_requests_allowed: *allowed,
                    num_requests_denied: 0,
                })
                .collect(),
        };
        self.reports.send(report).await.unwrap();
    }

    /// The next response's actions as (bucket name, what it says), within 10 s.
    async fn next(&mut self) -> Result<Vec<(String, Given)>, Status> {
        let message = tokio::time::timeout(Duration::from_secs(10), self.responses.message())
            .await
            .expect("a response within 10 s")?;
        let response = message.expect("the stream goes on");
        Ok(response.bucket_action.iter().map(given).collect())
    }

    /// Responses until one says something about `name`; what it says.
    async fn next_for(&mut self, name: &str) -> Given {
        loop {
            if let Some((_, given)) = self
                .next()
                .await
                .unwrap()
                .into_iter()
                .find(|(n, _)| n == name)
            {
                return given;
            }
        }
    }
}

/// What an action gives, in short.
#[derive(Debug, Clone, PartialEq)]
enum Given {
    /// Tokens per second, the bucket's size, the time to live in seconds.
    Tokens(u32, u32, i64),
    AllowAll(i64),
    DenyAll(i64),
    Abandoned,
}

fn given(action: &tollgate::pb::rate_limit_quota_response::BucketAction) -> (String, Given) {
    let name = action.bucket_id.as_ref().unwrap().bucket["name"].clone();
    let given = match action.bucket_action.as_ref().unwrap() {
        Action::AbandonAction(_) => Given::Abandoned,
        Action::QuotaAssignmentAction(assignment) => {
            let ttl = assignment.assignment_time_to_live.unwrap().seconds;
            match assignment.rate_limit_strategy.unwrap().strategy.unwrap() {
                Strategy::TokenBucket(bucket) => {
                    assert_eq!(bucket.fill_interval.unwrap().seconds, 1);
                    Given::Tokens(bucket.tokens_per_fill.unwrap(), bucket.max_tokens, ttl)
                }
                Strategy::BlanketRule(rule) if rule == BlanketRule::AllowAll as i32 => {
                    Given::AllowAll(ttl)
                }
                Strategy::BlanketRule(_) => Given::DenyAll(ttl),
                other => panic!("unexpected strategy {other:?}"),
            }
        }
    };
    (name, given)
}

fn bucket(name: &str) -> BucketId {
    BucketId {
        bucket: HashMap::from([("name".to_owned(), name.to_owned())]),
    }
}

async fn server(quota: QuotaOptions) -> TestServer {
    let setup = Setup {
        options: Options {
            quota,
            ..Options::default()
        },
        ..Setup::default()
    };
    start_with(&[("quota.yaml", RULES)], setup).await
}

fn fast() -> QuotaOptions {
    QuotaOptions {
        rlqs_interval: Duration::from_millis(100),
        rlqs_abandon_after: Duration::from_secs(2),
        rlqs_assignment_ttl: Duration::from_secs(30),
        ..QuotaOptions::default()
    }
}

#[tokio::test]
async fn a_bucket_is_answered_at_once_and_split_by_demand_between_streams() {
    let server = server(fast()).await;
    let mut first = Stream::open(&server).await;
    first.report("quota", &[("api", 1, 0)]).await;
    // Alone: the whole 100 per second, a tenth of a second's worth at once.
    assert_eq!(
        first.next().await.unwrap(),
        [("api".to_owned(), Given::Tokens(100, 10, 30))]
    );

    let mut second = Stream::open(&server).await;
    second.report("quota", &[("api", 1, 0)]).await;
    // Demands unknown yet: equal shares, the first stream told too.
    assert_eq!(second.next_for("api").await, Given::Tokens(50, 5, 30));
    assert_eq!(first.next_for("api").await, Given::Tokens(50, 5, 30));

    // 300 and 100 requests over 5 s: 60/s and 20/s, so 75 and 25 per second.
    first.report("quota", &[("api", 300, 5)]).await;
    second.report("quota", &[("api", 100, 5)]).await;
    let mut shares = (first.next_for("api").await, second.next_for("api").await);
    // The two reports may land in different rounds: the first round can see one of them.
    while shares != (Given::Tokens(75, 8, 30), Given::Tokens(25, 3, 30)) {
        shares = (first.next_for("api").await, second.next_for("api").await);
    }

    // The second stream goes: the first gets the whole limit back.
    drop(second);
    assert_eq!(first.next_for("api").await, Given::Tokens(100, 10, 30));
    let metrics = get(server.http, "/metrics", &[]).await.body;
    assert!(metrics.contains("tollgate_rlqs_streams 1\n"), "{metrics}");
}

#[tokio::test]
async fn unlimited_zero_and_unknown_buckets_get_blanket_rules() {
    let server = server(fast()).await;
    let mut stream = Stream::open(&server).await;
    stream
        .report(
            "quota",
            &[("open", 1, 0), ("closed", 1, 0), ("nobody", 1, 0)],
        )
        .await;
    let mut actions = stream.next().await.unwrap();
    actions.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        actions,
        [
            ("closed".to_owned(), Given::DenyAll(30)),
            ("nobody".to_owned(), Given::AllowAll(30)),
            ("open".to_owned(), Given::AllowAll(30)),
        ]
    );
    let config = get(server.http, "/config", &[]).await.body;
    assert!(
        config.contains(
            "quota name=closed: rule quota.name_closed, deny all, streams 1 (all replicas)"
        ),
        "{config}"
    );
}

#[tokio::test]
async fn a_bucket_unused_for_the_abandon_time_is_abandoned() {
    let server = server(fast()).await;
    let mut stream = Stream::open(&server).await;
    stream
        .report("quota", &[("api", 1, 0), ("open", 1, 0)])
        .await;
    assert_eq!(stream.next().await.unwrap().len(), 2);
    // `api` keeps being used; `open` is reported with no requests, as Envoy does.
    let started = std::time::Instant::now();
    loop {
        stream
            .report("quota", &[("api", 5, 1), ("open", 0, 1)])
            .await;
        let actions = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
        if let Ok(actions) = actions {
            let actions = actions.unwrap();
            if actions.contains(&("open".to_owned(), Given::Abandoned)) {
                assert!(
                    !actions.iter().any(|(name, _)| name == "api"),
                    "{actions:?}"
                );
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never abandoned"
        );
    }
    assert!(started.elapsed() >= Duration::from_secs(2));
    let config = get(server.http, "/config", &[]).await.body;
    assert!(
        config.contains("quota name=api:") && !config.contains("name=open"),
        "{config}"
    );
    // Reported again, it is a new subscription, answered at once.
    stream.report("quota", &[("open", 1, 0)]).await;
    assert_eq!(stream.next_for("open").await, Given::AllowAll(30));
}

#[tokio::test]
async fn reports_that_break_the_protocol_end_the_stream_with_invalid_argument() {
    let server = server(fast()).await;
    type Usages<'a> = &'a [(&'a str, u64, i64)];
    let long = "x".repeat(1_025);
    let cases: [(&str, Usages<'_>, &str); 3] = [
        ("", &[("api", 1, 0)], "must name its domain"),
        ("quota", &[("", 1, 0)], "must not be empty"),
        ("quota", &[(long.as_str(), 1, 0)], "at most 1024 bytes"),
    ];
    for (domain, usages, reason) in cases {
        let mut stream = Stream::open(&server).await;
        stream.report(domain, usages).await;
        let status = stream.next().await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(reason), "{}", status.message());
    }
    // Another domain on the same stream.
    let mut stream = Stream::open(&server).await;
    stream.report("quota", &[("api", 1, 0)]).await;
    stream.next().await.unwrap();
    stream.report("other", &[("api", 1, 0)]).await;
    let status = loop {
        if let Err(status) = stream.next().await {
            break status;
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("the stream's domain is \"quota\""),
        "{}",
        status.message()
    );
    // A report claiming to cover 2^63 seconds is taken as an hour: no overflow, and the
    // rounds go on (the stream is still answered after several of them).
    let mut odd = Stream::open(&server).await;
    odd.report("quota", &[("api", 1, i64::MAX)]).await;
    assert_eq!(odd.next_for("api").await, Given::Tokens(100, 10, 30));
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(odd);
    // The server still serves.
    let mut fresh = Stream::open(&server).await;
    fresh.report("quota", &[("api", 1, 0)]).await;
    assert_eq!(fresh.next_for("api").await, Given::Tokens(100, 10, 30));
}

#[tokio::test]
async fn a_graceful_shutdown_expires_every_assignment_and_ends_the_streams() {
    let mut server = server(fast()).await;
    let mut stream = Stream::open(&server).await;
    stream
        .report("quota", &[("api", 1, 0), ("closed", 1, 0)])
        .await;
    assert_eq!(stream.next().await.unwrap().len(), 2);
    server.trigger_stop();
    let mut expired = stream.next().await.unwrap();
    expired.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        expired,
        [
            ("api".to_owned(), Given::Tokens(100, 10, 0)),
            ("closed".to_owned(), Given::DenyAll(0)),
        ]
    );
    // Then the stream ends, so the drain does not wait for it.
    let end = tokio::time::timeout(Duration::from_secs(10), stream.responses.message()).await;
    assert!(matches!(end, Ok(Ok(None))), "{end:?}");
    let task = server.take_task();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn demand_is_shared_through_redis_and_a_stopped_replica_drops_out() {
    use tollgate::storage::{Demand, DemandPost};
    let redis = common::redis_process::RedisServer::start();
    let clock = tollgate::clock::ManualClock::at_seconds(T2222);
    let metrics = tollgate::metrics::Metrics::default();
    let store = redis_store(&redis.url(), &clock, Duration::from_secs(2), &metrics);
    let demand = |stream: &str, per_second: Option<f64>| Demand {
        stream: stream.to_owned(),
        per_second,
    };
    let shared = store.demand.expect("a Redis store shares demand");
    let post = |demands: Vec<Demand>, gone: Vec<String>| {
        let store = std::sync::Arc::clone(&shared);
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let posted = store
                    .share_demand(&DemandPost {
                        key: "bucket",
                        demands: &demands,
                        gone: &gone,
                        stale_after: Duration::from_millis(1500),
                    })
                    .await;
                match posted {
                    Ok(mut all) => {
                        all.sort_by(|a, b| a.stream.cmp(&b.stream));
                        return all;
                    }
                    // Connecting in the background.
                    Err(_) if std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    };
    // Replica a posts two streams (one not measured yet), replica b one: both read all three.
    post(vec![demand("a/1", Some(12.5)), demand("a/2", None)], vec![]).await;
    let all = post(vec![demand("b/1", Some(40.0))], vec![]).await;
    assert_eq!(
        all,
        [
            demand("a/1", Some(12.5)),
            demand("a/2", None),
            demand("b/1", Some(40.0))
        ]
    );
    // a's stream 2 leaves.
    let all = post(vec![demand("a/1", Some(10.0))], vec!["a/2".to_owned()]).await;
    assert_eq!(all, [demand("a/1", Some(10.0)), demand("b/1", Some(40.0))]);
    // Replica a stops posting: past the stale time, b no longer sees it, and it is deleted.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let all = post(vec![demand("b/1", Some(41.0))], vec![]).await;
    assert_eq!(all, [demand("b/1", Some(41.0))]);
    assert_eq!(redis.query(&["HLEN", "bucket"]), "1");
    // The hash expires with its last stream's stale time, twice over.
    let ttl: i64 = redis.query(&["PTTL", "bucket"]).parse().unwrap();
    assert!((1..=3000).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn a_stream_refused_for_a_bound_leaves_the_streams_beside_it_on_its_connection_served() {
    let server = server(QuotaOptions {
        // A stream's share, a sixteenth: 300 bytes.
        rlqs_max_bucket_bytes: 4_800,
        rlqs_abandon_after: Duration::from_secs(60),
        ..fast()
    })
    .await;
    let client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let mut sibling = Stream::open_on(client.clone()).await;
    sibling.report("quota", &[("api", 1, 0)]).await;
    sibling.next().await.unwrap();
    let mut large = Stream::open_on(client.clone()).await;
    large.report("quota", &[(&"y".repeat(1_000), 1, 0)]).await;
    let status = large.next().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    // Past the time a lone stream's connection would have been closed in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sibling.report("quota", &[("closed", 1, 0)]).await;
    assert!(matches!(
        sibling.next_for("closed").await,
        Given::DenyAll(_)
    ));
    let mut another = Stream::open_on(client).await;
    another.report("quota", &[("open", 1, 0)]).await;
    another.next().await.unwrap();
}

#[tokio::test]
async fn past_a_bound_of_the_whole_service_a_stream_is_refused_and_the_others_go_on() {
    let server = server(QuotaOptions {
        rlqs_max_streams: 2,
        rlqs_max_subscriptions: 3,
        // A stream's share, a sixteenth: 300 bytes, room for a few short buckets.
        rlqs_max_bucket_bytes: 4_800,
        rlqs_abandon_after: Duration::from_secs(60),
        ..fast()
    })
    .await;
    let mut first = Stream::open(&server).await;
    first
        .report("quota", &[("api", 1, 0), ("open", 1, 0)])
        .await;
    first.next().await.unwrap();
    // Two more subscriptions where one is left: the stream ends, naming the bound.
    let mut second = Stream::open(&server).await;
    second
        .report("quota", &[("api", 1, 0), ("closed", 1, 0)])
        .await;
    let status = loop {
        if let Err(status) = second.next().await {
            break status;
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("--rlqs-max-subscriptions"),
        "{}",
        status.message()
    );
    // A bucket id larger than a stream's share of the bytes: the same, naming that bound.
    let mut large = Stream::open(&server).await;
    large.report("quota", &[(&"y".repeat(1_000), 1, 0)]).await;
    let status = large.next().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("--rlqs-max-bucket-bytes"),
        "{}",
        status.message()
    );
    // Two streams open: a third is refused as it opens.
    let _held = Stream::open(&server).await;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let refused = client
        .stream_rate_limit_quotas(futures_util::stream::pending())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("--rlqs-max-streams"),
        "{}",
        refused.message()
    );
    // The first stream is still served: a bucket it adds (the last subscription left) is
    // answered at once.
    first.report("quota", &[("closed", 1, 0)]).await;
    assert!(matches!(first.next_for("closed").await, Given::DenyAll(_)));
}
