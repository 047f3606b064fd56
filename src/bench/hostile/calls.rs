//! The attacks made of whole gRPC calls: refunds that restore a budget, and RLQS streams
//! of the largest buckets.

use std::sync::PoisonError;

use tokio::time::Instant;

use super::{HostileArgs, Shared, attack_request, tally};

/// A hit and a refund of 10^9 on one key, in turn, until `until`; each answer's code is
/// counted, and the admitted hits.
pub(super) async fn refunds(
    args: &HostileArgs,
    report: &Shared,
    until: Instant,
) -> anyhow::Result<()> {
    let mut client =
        crate::pb::RateLimitServiceClient::connect(format!("http://{}", args.target)).await?;
    let mut one = attack_request(&HostileArgs {
        descriptors: 1,
        ..args.clone()
    });
    while Instant::now() < until {
        for refund in [false, true] {
            if let Some(descriptor) = one.descriptors.first_mut() {
                descriptor.is_negative_hits = refund;
                descriptor.hits_addend = Some(if refund { 1_000_000_000 } else { 1 });
            }
            let answer = client.should_rate_limit(one.clone()).await?.into_inner();
            let code = crate::pb::rate_limit_response::Code::try_from(answer.overall_code)
                .map_or("?", |code| code.as_str_name());
            tally(report, |r| {
                *r.answers.entry(code.to_owned()).or_default() += 1;
                if !refund && answer.overall_code == crate::pb::rate_limit_response::Code::Ok as i32
                {
                    r.admitted += 1;
                }
            });
        }
    }
    Ok(())
}

/// One RLQS stream subscribing `args.buckets` large buckets, in messages under 1 MiB, then
/// holding on until `until` or until the server ends it (its status counted in `answers`).
pub(super) async fn rlqs_buckets(
    args: &HostileArgs,
    report: &Shared,
    until: Instant,
) -> anyhow::Result<()> {
    use crate::pb::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use crate::pb::{BucketId, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.target))?
        .connect()
        .await?;
    let (reports, outgoing) = tokio::sync::mpsc::channel(2);
    let outgoing = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|report| (report, outgoing))
    });
    let (width, entries) = (args.entry_bytes.max(1), args.entries.max(1));
    let padded = move |text: String| format!("{text:x<width$}");
    let stream = report
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .streams_opened;
    tally(report, |r| r.streams_opened += 1);
    let bucket = move |n: usize| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: (1..entries)
                .map(|entry| (padded(format!("k{entry}-")), padded(String::new())))
                .chain([("name".to_owned(), padded(format!("{stream}-{n}-")))])
                .collect(),
        }),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    let bucket_bytes = entries * 2 * width + 64;
    let per_message = (900 * 1024 / bucket_bytes).max(1);
    let (total, domain) = (args.buckets, args.domain.clone());
    let sending = tokio::spawn(async move {
        for first in (0..total).step_by(per_message) {
            let message = RateLimitQuotaUsageReports {
                domain: domain.clone(),
                bucket_quota_usages: (first..(first + per_message).min(total))
                    .map(bucket)
                    .collect(),
            };
            if reports.send(message).await.is_err() {
                return;
            }
        }
        // Held open, as an Envoy holds its stream.
        reports.closed().await;
    });
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let ended = async {
        let mut responses = client
            .stream_rate_limit_quotas(outgoing)
            .await?
            .into_inner();
        loop {
            if responses.message().await?.is_none() {
                return Ok::<_, tonic::Status>(());
            }
        }
    };
    let outcome = tokio::select! {
        ended = ended => Some(ended),
        () = tokio::time::sleep_until(until) => None,
    };
    sending.abort();
    match outcome {
        None => Ok(()),
        Some(Ok(())) => anyhow::bail!("the server ended the stream"),
        Some(Err(status)) => {
            let code = (status.code() as i32).to_string();
            tally(report, |r| *r.answers.entry(code).or_default() += 1);
            anyhow::bail!("the server ended the stream: {status}")
        }
    }
}
