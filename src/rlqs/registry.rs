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
use super::demand::{covered, smoothed};
use super::grant::{self, Grant, Sent};
use super::report::{MAX_BUCKETS_PER_STREAM, ReportError, bucket_bytes, bucket_key};
use super::split::split;
use crate::metrics::Metrics;
use crate::pb::rate_limit_quota_response::BucketAction;
use crate::pb::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::rules::RuleSet;

pub type StreamId = u64;

/// A stream may hold this fraction of `--rlqs-max-bucket-bytes` in the ids it reports.
const STREAM_SHARE: usize = 16;

/// Where a stream's responses go (the gRPC response stream reads the other end).
pub type Outbox = mpsc::Sender<Result<RateLimitQuotaResponse, ReportError>>;

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
    /// What the bounds count: subscriptions, and the bytes of the buckets' ids.
    pub(super) subscriptions: usize,
    pub(super) bucket_bytes: usize,
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
    /// The bytes of their ids (`report::bucket_bytes`).
    pub(super) bucket_bytes: usize,
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
    /// Requests per second, smoothed (`demand::smoothed`); `None` until a report says a rate.
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
    /// forgets the stream. Refused past `--rlqs-max-streams`.
    pub fn open(&self, outbox: Outbox) -> Result<(StreamId, oneshot::Receiver<()>), ReportError> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (ended, on_end) = oneshot::channel();
        let stream = Stream {
            outbox,
            _ended: ended,
            domain: None,
            buckets: HashSet::new(),
            bucket_bytes: 0,
        };
        let mut state = self.state();
        if state.streams.len() >= self.options.rlqs_max_streams {
            return Err(ReportError::Full("--rlqs-max-streams"));
        }
        state.streams.insert(id, stream);
        self.metrics.quota.streams.inc();
        Ok((id, on_end))
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
            let State {
                streams,
                domains,
                subscriptions,
                bucket_bytes: held_bytes,
            } = &mut *state;
            let stream = streams.get_mut(&id).ok_or(ReportError::Closed)?;
            let buckets = domains.entry(domain.clone()).or_default();
            let bucket = match buckets.get_mut(&key) {
                Some(bucket) => bucket,
                None => {
                    let bytes = bucket_bytes(&key);
                    if *held_bytes + bytes > self.options.rlqs_max_bucket_bytes {
                        return Err(ReportError::Full("--rlqs-max-bucket-bytes"));
                    }
                    *held_bytes += bytes;
                    let bucket = Bucket::new(key);
                    buckets.entry(Arc::clone(&bucket.key)).or_insert(bucket)
                }
            };
            if !bucket.members.contains_key(&id) {
                if stream.buckets.len() >= MAX_BUCKETS_PER_STREAM {
                    return Err(ReportError::TooManyBuckets);
                }
                if *subscriptions >= self.options.rlqs_max_subscriptions {
                    return Err(ReportError::Full("--rlqs-max-subscriptions"));
                }
                // One stream holds at most a share of the bytes, so that one client cannot
                // fill the service (nor make it decode much before it is cut off).
                let bytes = bucket_bytes(&bucket.key);
                let share = self.options.rlqs_max_bucket_bytes / STREAM_SHARE;
                if stream.bucket_bytes + bytes > share {
                    return Err(ReportError::Full(
                        "a stream's share of --rlqs-max-bucket-bytes",
                    ));
                }
                stream.bucket_bytes += bytes;
                *subscriptions += 1;
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
            self.subscriptions -= 1;
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
