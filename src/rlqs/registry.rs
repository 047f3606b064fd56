//! Who reports what. A stream's first report names its domain; each bucket it reports is a
//! subscription from its first report on, carrying the stream's smoothed demand and the
//! assignment it was last sent. A new subscription is answered at once; the rest of the
//! assignments go out from `rebalance`. A stream's state goes when it closes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::QuotaOptions;
use super::bucket::{self, BucketKey, Quota};
use super::grant::{self, Grant, Sent};
use super::split::split;
use crate::metrics::Metrics;
use crate::pb::rate_limit_quota_response::BucketAction;
use crate::pb::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::rules::RuleSet;

pub type StreamId = u64;

/// Where a stream's responses go (the gRPC response stream reads the other end).
pub type Outbox = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// How much a new report weighs against the demand already known.
const SMOOTHING: f64 = 0.7;

/// Most buckets one stream may report, and most entries in one bucket.
pub const MAX_BUCKETS_PER_STREAM: usize = 100_000;
pub const MAX_BUCKET_ENTRIES: usize = 64;

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
    pub(super) buckets: HashMap<BucketRef, Bucket>,
}

/// A bucket within its domain.
pub type BucketRef = (String, BucketKey);

pub(super) struct Stream {
    pub(super) outbox: Outbox,
    /// Dropped with the stream: tells its reader to stop reading.
    _ended: oneshot::Sender<()>,
    pub(super) domain: Option<String>,
    /// Keyed by the bucket's key as its `Bucket` holds it: one copy however many streams.
    pub(super) subscriptions: HashMap<Arc<BucketKey>, Subscription>,
}

pub(super) struct Subscription {
    /// Requests per second, smoothed; `None` until a report covers a whole second.
    pub(super) demand: Option<f64>,
    /// When the stream last reported a request in the bucket (or subscribed).
    pub(super) last_used: Instant,
    /// The time its latest report covered: how often the stream reports.
    pub(super) period: Duration,
    pub(super) sent: Option<Sent>,
}

/// One bucket as this replica knows it.
#[derive(Default)]
pub(super) struct Bucket {
    /// The bucket's entries, shared by its streams' subscriptions.
    pub(super) key: Option<Arc<BucketKey>>,
    /// This replica's streams that report it.
    pub(super) streams: Vec<StreamId>,
    /// Streams that stopped reporting it since demand was last shared.
    pub(super) gone: Vec<StreamId>,
    /// Other replicas' streams' demands (`None`: not known yet), as last read from the store.
    pub(super) others: Vec<Option<f64>>,
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
            subscriptions: HashMap::new(),
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
        let domain = stream.domain.unwrap_or_default();
        for key in stream.subscriptions.into_keys() {
            state.unsubscribe(&(domain.clone(), BucketKey::clone(&key)), id);
        }
    }

    /// Ends a stream that broke the protocol with `status`.
    pub fn refuse(&self, id: StreamId, status: Status) {
        if let Some(stream) = self.state().streams.get(&id) {
            let _ = stream.outbox.try_send(Err(status));
        }
        self.close(id);
    }

    /// Ends every stream (shutdown): their response streams finish once drained.
    pub fn end_all(&self) {
        let ids: Vec<StreamId> = self.state().streams.keys().copied().collect();
        for id in ids {
            self.close(id);
        }
    }

    /// Takes one usage report; new subscriptions are answered at once.
    pub fn report(&self, id: StreamId, reports: RateLimitQuotaUsageReports) -> Result<(), Status> {
        self.metrics.quota.reports.inc();
        let now = Instant::now();
        let rules = self.rules.load();
        let mut state = self.state();
        let domain = state.domain_of(id, reports.domain)?;
        let mut new = Vec::new();
        for usage in reports.bucket_quota_usages {
            let key = bucket_key(usage.bucket_id.map(|b| b.bucket))?;
            let elapsed = usage.time_elapsed.map_or(Duration::ZERO, |d| {
                Duration::new(
                    d.seconds.max(0).unsigned_abs(),
                    d.nanos.max(0).unsigned_abs(),
                )
            });
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let stream = state.streams.get_mut(&id).ok_or_else(closed)?;
            let count = stream.subscriptions.len();
            let subscription = match stream.subscriptions.get_mut(&key) {
                Some(subscription) => subscription,
                None if count >= MAX_BUCKETS_PER_STREAM => {
                    return Err(Status::invalid_argument(format!(
                        "a stream may report at most {MAX_BUCKETS_PER_STREAM} buckets"
                    )));
                }
                None => {
                    new.push(key.clone());
                    let bucket = state.buckets.entry((domain.clone(), key.clone())).or_default();
                    bucket.streams.push(id);
                    let shared = bucket
                        .key
                        .get_or_insert_with(|| Arc::new(key.clone()))
                        .clone();
                    let stream = state.streams.get_mut(&id).ok_or_else(closed)?;
                    stream.subscriptions.entry(shared).or_insert(Subscription {
                        demand: None,
                        last_used: now,
                        period: Duration::ZERO,
                        sent: None,
                    })
                }
            };
            if requests > 0 {
                subscription.last_used = now;
            }
            if !elapsed.is_zero() {
                subscription.period = elapsed;
            }
            subscription.demand = smoothed(subscription.demand, requests, elapsed);
        }
        // The newcomer gets its share of the new split at once; the others get theirs at the
        // next round (telling every stream of a bucket of n streams at each subscription
        // would cost n² messages as a fleet starts up).
        let mut actions = Vec::with_capacity(new.len());
        for key in new {
            let at = (domain.clone(), key);
            let answer = state.assign(&self.options, &rules, &at, now, Reach::Newcomer(id));
            actions.extend(answer.into_values());
        }
        self.metrics.quota.buckets.set(gauge(state.buckets.len()));
        if let Some(stream) = state.streams.get(&id) {
            send(&stream.outbox, actions, &self.metrics, "assign");
        }
        Ok(())
    }
}

impl State {
    /// The stream's domain: set by its first report, and the same in every later one.
    fn domain_of(&mut self, id: StreamId, named: String) -> Result<String, Status> {
        let stream = self.streams.get_mut(&id).ok_or_else(closed)?;
        match (&stream.domain, named.is_empty()) {
            (Some(domain), true) => Ok(domain.clone()),
            (Some(domain), false) if *domain == named => Ok(named),
            (Some(domain), false) => Err(Status::invalid_argument(format!(
                "the stream's domain is {domain:?}; a report named {named:?}"
            ))),
            (None, true) => Err(Status::invalid_argument(
                "the first report of a stream must name its domain",
            )),
            (None, false) => {
                stream.domain = Some(named.clone());
                Ok(named)
            }
        }
    }

    /// Removes a stream from a bucket, remembering it so the store forgets its demand.
    pub(super) fn unsubscribe(&mut self, at: &BucketRef, id: StreamId) {
        if let Some(bucket) = self.buckets.get_mut(at) {
            bucket.streams.retain(|&s| s != id);
            bucket.gone.push(id);
        }
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
    ) -> BTreeMap<StreamId, BucketAction> {
        let Some(bucket) = self.buckets.get(at) else {
            return BTreeMap::new();
        };
        let (quota, _) = bucket::quota(rules, &at.0, &at.1);
        let demands: Vec<Option<f64>> = bucket
            .streams
            .iter()
            .map(|id| {
                let subscription = self.streams.get(id)?.subscriptions.get(&at.1)?;
                subscription.demand
            })
            .collect();
        let grants = grants(quota, &demands, &bucket.others, options.rlqs_floor);
        let ttl = options.rlqs_assignment_ttl;
        let mut actions = BTreeMap::new();
        for (id, grant) in bucket.streams.clone().into_iter().zip(grants) {
            let Some(subscription) = self
                .streams
                .get_mut(&id)
                .and_then(|s| s.subscriptions.get_mut(&at.1))
            else {
                continue;
            };
            let send = match reach {
                Reach::Newcomer(newcomer) => id == newcomer,
                Reach::Due => grant::due(subscription.sent.as_ref(), grant, now, ttl),
            };
            if send {
                subscription.sent = Some(Sent { grant, at: now });
                actions.insert(id, grant::assign(&at.1, grant, ttl));
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

/// The demand after a report of `requests` over `elapsed`. Envoy counts `elapsed` in whole
/// seconds, and a bucket's first report covers none: a report under a second says nothing
/// about the rate.
fn smoothed(known: Option<f64>, requests: u64, elapsed: Duration) -> Option<f64> {
    if elapsed < Duration::from_secs(1) {
        return known;
    }
    let rate = requests as f64 / elapsed.as_secs_f64();
    Some(match known {
        Some(known) => SMOOTHING * rate + (1.0 - SMOOTHING) * known,
        None => rate,
    })
}

/// A bucket's entries, checked: at least one, none empty, at most `MAX_BUCKET_ENTRIES`.
fn bucket_key(entries: Option<HashMap<String, String>>) -> Result<BucketKey, Status> {
    let entries = entries.unwrap_or_default();
    if entries.is_empty() || entries.len() > MAX_BUCKET_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "a bucket_id needs 1 to {MAX_BUCKET_ENTRIES} entries, not {}",
            entries.len()
        )));
    }
    if entries.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(Status::invalid_argument(
            "bucket_id keys and values must not be empty",
        ));
    }
    Ok(entries.into_iter().collect())
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

fn closed() -> Status {
    Status::cancelled("the stream is closed")
}

/// A name for this process's streams in a shared store: its process id and start time.
fn replica_name() -> String {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}.{:x}", std::process::id(), started)
}
