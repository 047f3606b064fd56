//! Who reports what. A stream's first report names its domain; each bucket it reports is a
//! subscription from its first report on, carrying the stream's smoothed demand and the
//! assignment it was last sent. A new subscription is answered at once; the rest of the
//! assignments go out from `rebalance`. A stream's state goes when it closes.

use std::collections::{HashMap, HashSet};

use indexmap::IndexMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};

use super::QuotaOptions;
use super::bucket::{self, BucketKey, Quota};
use super::grant::{self, Grant, Sent};
use super::report::{MAX_BUCKETS_PER_STREAM, ReportError, bucket_key};
use super::split::split;
use crate::metrics::Metrics;
use crate::pb::rate_limit_quota_response::BucketAction;
use crate::pb::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::rules::RuleSet;

pub type StreamId = u64;

/// Where a stream's responses go (the gRPC response stream reads the other end).
pub type Outbox = mpsc::Sender<Result<RateLimitQuotaResponse, ReportError>>;

/// How much a report covering `SMOOTHING_PERIOD` weighs against the demand already known;
/// a shorter report weighs less, a longer one more, so that the demand forgets at the same
/// pace per second however often a stream reports.
const SMOOTHING: f64 = 0.7;
const SMOOTHING_PERIOD: Duration = Duration::from_secs(5);

/// Shortest time a report must cover to say something about a rate: Envoy's first report of
/// a new bucket covers none (0), and a rate over a few microseconds is noise.
const MIN_ELAPSED: Duration = Duration::from_millis(10);

/// How far the time between two reports, as this process saw them arrive, may stray from
/// the whole seconds Envoy wrote and still be taken as the true time covered (the network
/// and the two event loops delay each report by a few milliseconds at most).
const ARRIVAL_JITTER: Duration = Duration::from_millis(250);

/// A report whose count strays further than this many standard deviations of a Poisson
/// count from what the known demand predicts (and by more than `SHIFT_FLOOR` of it) is a
/// change of load, not noise: it is taken whole rather than smoothed.
const SHIFT_DEVIATIONS: f64 = 3.0;
const SHIFT_FLOOR: f64 = 0.1;

/// Longest time one report is taken to cover.
const MAX_ELAPSED: Duration = Duration::from_secs(3_600);

pub struct Registry {
    pub(super) options: QuotaOptions,
    pub(super) rules: Arc<ArcSwap<RuleSet>>,
    pub(super) metrics: Arc<Metrics>,
    /// Names this replica's streams in a shared store.
    pub(super) replica: String,
    /// Cleared once the store says it shares nothing (the memory store): demand is then not
    /// posted at all.
    pub(super) store_shares: std::sync::atomic::AtomicBool,
    next_stream: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) streams: HashMap<StreamId, Stream>,
    /// Per domain, the buckets this replica's streams report.
    pub(super) domains: HashMap<String, HashMap<Arc<BucketKey>, Bucket>>,
}

/// A bucket within its domain.
pub type BucketRef = (String, Arc<BucketKey>);

pub(super) struct Stream {
    pub(super) outbox: Outbox,
    /// Dropped with the stream: tells its reader to stop reading.
    _ended: oneshot::Sender<()>,
    pub(super) domain: Option<String>,
    /// The buckets it reports (the key as its `Bucket` holds it: one copy for every stream).
    pub(super) buckets: HashSet<Arc<BucketKey>>,
}

/// One bucket as this replica knows it: its streams here (each a subscription), and what
/// the store said of the others.
pub(super) struct Bucket {
    pub(super) key: Arc<BucketKey>,
    pub(super) members: IndexMap<StreamId, Subscription>,
    /// Streams that stopped reporting it since demand was last shared.
    pub(super) gone: Vec<StreamId>,
    /// Other replicas' streams' demands (`None`: not known yet), as last read from the store.
    pub(super) others: Vec<Option<f64>>,
}

impl Bucket {
    /// Requests per second offered by every replica's streams, assigned to this replica's
    /// (infinite: allow all), and the streams reporting it, every replica's.
    pub(super) fn figures(&self) -> (f64, f64, usize) {
        let members = self.members.values();
        let demand = members
            .clone()
            .filter_map(|s| s.demand)
            .chain(self.others.iter().flatten().copied())
            .fold(0.0, |sum, d| sum + d);
        let assigned = members
            .map(|s| match s.sent.map(|sent| sent.grant) {
                Some(Grant::Rate(rate)) => rate,
                Some(Grant::AllowAll) => f64::INFINITY,
                Some(Grant::DenyAll) | None => 0.0,
            })
            .fold(0.0, |sum, a| sum + a);
        (demand, assigned, self.members.len() + self.others.len())
    }

    fn new(key: BucketKey) -> Self {
        Self {
            key: Arc::new(key),
            members: IndexMap::new(),
            gone: Vec::new(),
            others: Vec::new(),
        }
    }
}

/// One stream's subscription to one bucket.
pub(super) struct Subscription {
    /// Requests per second, smoothed; `None` until a report covers `MIN_ELAPSED`.
    pub(super) demand: Option<f64>,
    /// When the stream last reported a request in the bucket (or subscribed).
    pub(super) last_used: Instant,
    /// The time its latest report covered: how often the stream reports.
    pub(super) period: Duration,
    /// When its latest report arrived here.
    pub(super) reported_at: Instant,
    pub(super) sent: Option<Sent>,
}

impl Registry {
    pub fn new(options: QuotaOptions, rules: Arc<ArcSwap<RuleSet>>, metrics: Arc<Metrics>) -> Self {
        Self {
            options,
            rules,
            metrics,
            replica: replica_name(),
            store_shares: std::sync::atomic::AtomicBool::new(true),
            next_stream: AtomicU64::new(1),
            state: Mutex::new(State::default()),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new stream, answered through `outbox`; the receiver resolves when the registry
    /// forgets the stream.
    pub fn open(&self, outbox: Outbox) -> (StreamId, oneshot::Receiver<()>) {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (ended, on_end) = oneshot::channel();
        let stream = Stream {
            outbox,
            _ended: ended,
            domain: None,
            buckets: HashSet::new(),
        };
        self.state().streams.insert(id, stream);
        self.metrics.quota.streams.inc();
        (id, on_end)
    }

    /// Forgets a closed stream.
    pub fn close(&self, id: StreamId) {
        let mut state = self.state();
        let Some(stream) = state.streams.remove(&id) else {
            return;
        };
        self.metrics.quota.streams.dec();
        let Some(domain) = stream.domain else {
            return;
        };
        for key in stream.buckets {
            state.unsubscribe(&domain, &key, id);
        }
    }

    /// Ends a stream that broke the protocol with `error`, sent after whatever its outbox
    /// holds (the send waits for room, or for the client to go).
    pub fn refuse(&self, id: StreamId, error: ReportError) {
        let outbox = self.state().streams.get(&id).map(|s| s.outbox.clone());
        self.close(id);
        if let Some(outbox) = outbox {
            tokio::spawn(async move {
                let _ = outbox.send(Err(error)).await;
            });
        }
    }

    /// Ends every stream (shutdown): their response streams finish once drained.
    pub fn end_all(&self) {
        let ids: Vec<StreamId> = self.state().streams.keys().copied().collect();
        for id in ids {
            self.close(id);
        }
    }

    /// Takes one usage report; new subscriptions are answered at once.
    pub fn report(
        &self,
        id: StreamId,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<(), ReportError> {
        self.metrics.quota.reports.inc();
        let now = Instant::now();
        let rules = self.rules.load();
        let mut state = self.state();
        let domain = state.domain_of(id, reports.domain)?;
        let mut new = Vec::new();
        for usage in reports.bucket_quota_usages {
            let key = bucket_key(usage.bucket_id.map(|b| b.bucket))?;
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let State { streams, domains } = &mut *state;
            let stream = streams.get_mut(&id).ok_or(ReportError::Closed)?;
            let buckets = domains.entry(domain.clone()).or_default();
            let bucket = match buckets.get_mut(&key) {
                Some(bucket) => bucket,
                None => {
                    let bucket = Bucket::new(key);
                    buckets.entry(Arc::clone(&bucket.key)).or_insert(bucket)
                }
            };
            if !bucket.members.contains_key(&id) {
                if stream.buckets.len() >= MAX_BUCKETS_PER_STREAM {
                    return Err(ReportError::TooManyBuckets);
                }
                stream.buckets.insert(Arc::clone(&bucket.key));
                new.push(Arc::clone(&bucket.key));
            }
            let mut since_last = None;
            let subscription = bucket
                .members
                .entry(id)
                .and_modify(|known| since_last = Some(now - known.reported_at))
                .or_insert(Subscription {
                    demand: None,
                    last_used: now,
                    period: Duration::ZERO,
                    reported_at: now,
                    sent: None,
                });
            let elapsed = covered(usage.time_elapsed, since_last);
            subscription.reported_at = now;
            if requests > 0 {
                subscription.last_used = now;
            }
            if !elapsed.is_zero() {
                subscription.period = elapsed;
            }
            subscription.demand = smoothed(subscription.demand, requests, elapsed);
            tracing::debug!(stream = id, requests, ?elapsed, demand = ?subscription.demand, "RLQS report");
        }
        // The newcomer gets its share of the new split at once; the others get theirs at the
        // next round (telling every stream of a bucket of n streams at each subscription
        // would cost n² messages as a fleet starts up).
        let mut actions = Vec::with_capacity(new.len());
        for key in new {
            let at = (domain.clone(), key);
            let answer = state.assign(&self.options, &rules, &at, now, Reach::Newcomer(id));
            actions.extend(answer.into_iter().map(|(_, action)| action));
        }
        self.metrics.quota.buckets.set(gauge(state.bucket_count()));
        if let Some(stream) = state.streams.get(&id) {
            send(&stream.outbox, actions, &self.metrics, "assign");
        }
        Ok(())
    }
}

impl State {
    /// The stream's domain: set by its first report, and the same in every later one.
    fn domain_of(&mut self, id: StreamId, named: String) -> Result<String, ReportError> {
        let stream = self.streams.get_mut(&id).ok_or(ReportError::Closed)?;
        match (&stream.domain, named.is_empty()) {
            (Some(domain), true) => Ok(domain.clone()),
            (Some(domain), false) if *domain == named => Ok(named),
            (Some(domain), false) => Err(ReportError::OtherDomain {
                domain: domain.clone(),
                named,
            }),
            (None, true) => Err(ReportError::NoDomain),
            (None, false) => {
                stream.domain = Some(named.clone());
                Ok(named)
            }
        }
    }

    /// Removes a stream from a bucket, remembering it so the store forgets its demand.
    pub(super) fn unsubscribe(&mut self, domain: &str, key: &BucketKey, id: StreamId) {
        let bucket = self.domains.get_mut(domain).and_then(|b| b.get_mut(key));
        if let Some(bucket) = bucket
            && bucket.members.swap_remove(&id).is_some()
        {
            bucket.gone.push(id);
        }
    }

    /// Buckets over every domain.
    pub(super) fn bucket_count(&self) -> usize {
        self.domains.values().map(HashMap::len).sum()
    }

    /// The split of one bucket among its streams here; returns the actions for the streams
    /// `reach` names, and records them as sent.
    pub(super) fn assign(
        &mut self,
        options: &QuotaOptions,
        rules: &RuleSet,
        at: &BucketRef,
        now: Instant,
        reach: Reach,
    ) -> Vec<(StreamId, BucketAction)> {
        let Some(bucket) = self.domains.get_mut(&at.0).and_then(|b| b.get_mut(&at.1)) else {
            return Vec::new();
        };
        let (quota, _) = bucket::quota(rules, &at.0, &at.1);
        let demands: Vec<Option<f64>> = bucket.members.values().map(|s| s.demand).collect();
        let grants = grants(quota, &demands, &bucket.others, options.rlqs_floor);
        let ttl = options.rlqs_assignment_ttl;
        let mut actions = Vec::new();
        for ((&id, subscription), grant) in bucket.members.iter_mut().zip(grants) {
            let send = match reach {
                Reach::Newcomer(newcomer) => id == newcomer,
                Reach::Due => grant::due(subscription.sent.as_ref(), grant, now, ttl),
            };
            if send {
                tracing::debug!(stream = id, demand = ?subscription.demand, ?grant, "RLQS assignment");
                subscription.sent = Some(Sent { grant, at: now });
                actions.push((id, grant::assign(&at.1, grant, ttl)));
            }
        }
        actions
    }
}

/// Which streams of a bucket `State::assign` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// Only a stream that just subscribed, whatever it gets.
    Newcomer(StreamId),
    /// Every stream whose assignment is due (`grant::due`).
    Due,
}

/// What each of this replica's streams gets, given their demands (unknown: the average of
/// the known ones) and the other replicas' streams' demands.
pub(super) fn grants(
    quota: Quota,
    demands: &[Option<f64>],
    others: &[Option<f64>],
    floor: f64,
) -> Vec<Grant> {
    let per_second = match quota {
        Quota::AllowAll => return vec![Grant::AllowAll; demands.len()],
        Quota::DenyAll => return vec![Grant::DenyAll; demands.len()],
        Quota::Rate { per_second } => per_second,
    };
    let known: Vec<f64> = demands.iter().chain(others).flatten().copied().collect();
    let typical = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let all: Vec<f64> = demands
        .iter()
        .chain(others)
        .map(|d| d.unwrap_or(typical))
        .collect();
    split(per_second, &all, floor)
        .into_iter()
        .take(demands.len())
        .map(Grant::Rate)
        .collect()
}

/// The time a report covers. Envoy 1.40 writes whole seconds, truncated: a report sent every
/// 5 s covers 4.999 s as often as 5.001 s, and says 4 s for the first, a rate a quarter too
/// high. When the report says whole seconds and the time since the stream's previous report
/// of the bucket arrived fits them (from the seconds written to one second more), that time
/// is the truer one; a report with nanoseconds, or one that does not fit (the first of a
/// subscription, a stream that missed reports), counts as written.
fn covered(reported: Option<prost_types::Duration>, since_last: Option<Duration>) -> Duration {
    let Some(reported) = reported else {
        return Duration::ZERO;
    };
    let whole_seconds = reported.nanos == 0;
    let reported = elapsed(reported);
    match since_last {
        Some(measured)
            if whole_seconds
                && !reported.is_zero()
                && measured + ARRIVAL_JITTER >= reported
                && measured < reported + Duration::from_secs(1) + ARRIVAL_JITTER =>
        {
            measured.clamp(reported, reported + Duration::from_secs(1))
        }
        _ => reported,
    }
}

/// The demand after a report of `requests` over `elapsed`. A report under `MIN_ELAPSED` says
/// nothing about the rate. A count within the noise of the known demand moves it by the time
/// the report covers (`SMOOTHING` for `SMOOTHING_PERIOD`); a count beyond it is a change of
/// load and replaces it, so that streams whose load changed alike are given alike at the
/// first report after the change, whatever they offered before.
fn smoothed(known: Option<f64>, requests: u64, elapsed: Duration) -> Option<f64> {
    if elapsed < MIN_ELAPSED {
        return known;
    }
    let seconds = elapsed.as_secs_f64();
    let rate = requests as f64 / seconds;
    let Some(known) = known else {
        return Some(rate);
    };
    let expected = known * seconds;
    let noise = (SHIFT_DEVIATIONS * expected.max(1.0).sqrt()).max(SHIFT_FLOOR * expected);
    if (requests as f64 - expected).abs() > noise {
        return Some(rate);
    }
    let weight = 1.0 - (1.0 - SMOOTHING).powf(seconds / SMOOTHING_PERIOD.as_secs_f64());
    Some(weight * rate + (1.0 - weight) * known)
}

/// The time a report covers, at most `MAX_ELAPSED` (anything longer says nothing more about
/// a rate, and would overflow the arithmetic that uses it); negative is zero.
fn elapsed(duration: prost_types::Duration) -> Duration {
    let seconds = u64::try_from(duration.seconds).unwrap_or(0);
    let nanos = u32::try_from(duration.nanos).unwrap_or(0).min(999_999_999);
    Duration::new(seconds.min(MAX_ELAPSED.as_secs()), nanos).min(MAX_ELAPSED)
}

/// Sends a stream its actions as one response; a stream too slow to take it misses it (the
/// next renewal carries the assignment again).
pub(super) fn send(
    outbox: &Outbox,
    actions: Vec<BucketAction>,
    metrics: &Metrics,
    kind: &'static str,
) {
    if actions.is_empty() {
        return;
    }
    let count = actions.len() as u64;
    let response = RateLimitQuotaResponse {
        bucket_action: actions,
    };
    if outbox.try_send(Ok(response)).is_ok() {
        metrics.quota.count_actions(kind, count);
    }
}

pub(super) fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// A name for this process's streams in a shared store: its process id and start time.
fn replica_name() -> String {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}.{:x}", std::process::id(), started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_by_its_real_duration_and_an_empty_one_not_at_all() {
        let ms = Duration::from_millis;
        // 20 requests in 200 ms: 100 a second.
        assert_eq!(smoothed(None, 20, ms(200)), Some(100.0));
        let nanos = elapsed(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        });
        assert_eq!(smoothed(None, 20, nanos), Some(100.0));
        // No time (a new bucket's first report), or too little: the demand stays as known.
        assert_eq!(smoothed(None, 20, Duration::ZERO), None);
        assert_eq!(smoothed(Some(7.0), 20, ms(1)), Some(7.0));
        // Within the noise, a report of the smoothing period weighs SMOOTHING, a shorter one
        // less.
        let five = smoothed(Some(100.0), 520, Duration::from_secs(5)).unwrap();
        assert!((five - 102.8).abs() < 1e-9, "{five}");
        let short = smoothed(Some(100.0), 11, ms(100)).unwrap();
        assert!(
            short > 100.0 && short < 0.7 * 110.0 + 0.3 * 100.0,
            "{short}"
        );
    }

    #[test]
    fn a_change_of_load_beyond_the_noise_replaces_the_demand() {
        let five = Duration::from_secs(5);
        // 200/s, then 50/s: the first report after the change says it all, whatever the
        // stream offered before; so do two streams that both fell to 50/s.
        assert_eq!(smoothed(Some(200.0), 250, five), Some(50.0));
        assert_eq!(smoothed(Some(100.0), 250, five), Some(50.0));
        // 3 standard deviations of 500 requests is 67, 10% of it 50: 560 is noise, 570 not.
        assert_eq!(smoothed(Some(100.0), 570, five), Some(114.0));
        let noise = smoothed(Some(100.0), 560, five).unwrap();
        assert!((noise - 108.4).abs() < 1e-9, "{noise}");
        // At high rates the floor of 10% holds the noise band open.
        let busy = smoothed(Some(10_000.0), 52_000, five).unwrap();
        assert!((busy - 10_280.0).abs() < 1e-6, "{busy}");
    }

    #[test]
    fn whole_seconds_truncated_by_envoy_count_as_the_time_between_reports() {
        let whole = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
        let ms = Duration::from_millis;
        // Envoy wrote 4 s for a report 4.998 s after the previous one: 4.998 s it covered.
        assert_eq!(covered(whole(4), Some(ms(4_998))), ms(4_998));
        assert_eq!(covered(whole(5), Some(ms(5_003))), ms(5_003));
        // A few milliseconds of arrival jitter stay within the seconds written.
        assert_eq!(covered(whole(5), Some(ms(4_990))), ms(5_000));
        // Nanoseconds written, no previous report, or times that do not fit: as written.
        let precise = Some(prost_types::Duration {
            seconds: 4,
            nanos: 500_000_000,
        });
        assert_eq!(covered(precise, Some(ms(4_998))), ms(4_500));
        assert_eq!(covered(whole(4), None), ms(4_000));
        assert_eq!(covered(whole(5), Some(ms(15_000))), ms(5_000));
        assert_eq!(covered(whole(0), Some(ms(700))), Duration::ZERO);
        assert_eq!(covered(None, Some(ms(5_000))), Duration::ZERO);
    }
}
