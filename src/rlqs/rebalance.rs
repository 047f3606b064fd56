//! Every interval: abandon the buckets streams stopped using, share each bucket's demand
//! through the store (one call per bucket; the memory store shares nothing), split again, and
//! push the assignments that changed or are due for renewal.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::bucket::BucketKey;
use super::grant;
use super::registry::{self, BucketRef, Reach, Registry, StreamId, gauge, send};
use super::report;
use crate::metrics::{BucketFigures, MAX_BUCKET_LABELS};
use crate::pb::rate_limit_quota_response::BucketAction;
use crate::storage::{Demand, DemandPost, DemandShare};

/// Store calls in flight at once while sharing demand.
const SHARING_CONCURRENCY: usize = 64;

/// Runs `tick` every `rlqs_interval` until aborted.
pub fn spawn(registry: Arc<Registry>, store: Option<Arc<dyn DemandShare>>) -> JoinHandle<()> {
    registry
        .store_shares
        .store(store.is_some(), Ordering::Relaxed);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(registry.options.rlqs_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            registry.tick(store.as_deref()).await;
        }
    })
}

/// What one bucket posts to the store.
struct Post {
    at: BucketRef,
    demands: Vec<Demand>,
    gone: Vec<String>,
}

impl Registry {
    /// One round: abandon, share (when the store is shared between replicas), split, push.
    pub async fn tick(&self, store: Option<&dyn DemandShare>) {
        let posts = self.abandon_idle(Instant::now());
        let shared = match store {
            Some(store) => self.share(store, posts).await,
            None => HashMap::new(),
        };
        self.reassign(shared, Instant::now());
    }

    /// Before a graceful shutdown: every assignment sent again with no time to live, so that
    /// the data planes fall back to their expired-assignment behaviour now rather than when
    /// the assignments run out.
    pub fn expire_all(&self) {
        let state = self.state();
        let mut actions: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        for bucket in state.domains.values().flat_map(HashMap::values) {
            for (&id, subscription) in &bucket.members {
                if let Some(sent) = subscription.sent {
                    let action = grant::assign(&bucket.key, sent.grant, Duration::ZERO);
                    actions.entry(id).or_default().push(action);
                }
            }
        }
        for (id, actions) in actions {
            if let Some(stream) = state.streams.get(&id) {
                send(&stream.outbox, actions, &self.metrics, "expire");
            }
        }
    }

    /// Abandons subscriptions unused for `rlqs_abandon_after` (at least two of their stream's
    /// report periods), and collects each bucket's post.
    fn abandon_idle(&self, now: Instant) -> Vec<Post> {
        let idle_after = self.options.rlqs_abandon_after;
        let shares = self.store_shares.load(Ordering::Relaxed);
        let mut state = self.state();
        let registry::State {
            streams,
            domains,
            subscriptions,
            bucket_bytes,
        } = &mut *state;
        let mut abandoned: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        let mut posts = Vec::new();
        for (domain, buckets) in domains.iter_mut() {
            for bucket in buckets.values_mut() {
                let key = &bucket.key;
                let mut left = Vec::new();
                bucket.members.retain(|&id, subscription| {
                    // A bucket in use shows it only in the stream's next report: never judge
                    // it idle in less than two of the stream's report periods.
                    let idle_after = idle_after.max(subscription.period.saturating_mul(2));
                    let idle = now.saturating_duration_since(subscription.last_used) >= idle_after;
                    if idle {
                        left.push(id);
                    }
                    !idle
                });
                *subscriptions -= left.len();
                for id in left {
                    abandoned.entry(id).or_default().push(grant::abandon(key));
                    if let Some(stream) = streams.get_mut(&id) {
                        stream.buckets.remove(key);
                        stream.bucket_bytes = stream
                            .bucket_bytes
                            .saturating_sub(report::bucket_bytes(key));
                    }
                    bucket.gone.push(id);
                }
                if !shares {
                    bucket.gone.clear();
                    continue;
                }
                let name = |id: &StreamId| format!("{}/{id}", self.replica);
                let demands = bucket
                    .members
                    .iter()
                    .map(|(id, subscription)| Demand {
                        stream: name(id),
                        per_second: subscription.demand,
                    })
                    .collect();
                // A stream that left and came back since the last post is not gone.
                let members = &bucket.members;
                let gone = bucket
                    .gone
                    .drain(..)
                    .filter(|id| !members.contains_key(id))
                    .map(|id| name(&id))
                    .collect();
                posts.push(Post {
                    at: (domain.clone(), Arc::clone(key)),
                    demands,
                    gone,
                });
            }
        }
        for (id, actions) in abandoned {
            if let Some(stream) = streams.get(&id) {
                send(&stream.outbox, actions, &self.metrics, "abandon");
            }
        }
        for (domain, buckets) in domains.iter_mut() {
            buckets.retain(|key, bucket| {
                let keep = !bucket.members.is_empty();
                if !keep {
                    self.metrics.quota.remove_bucket(domain, &label(key));
                    *bucket_bytes -= report::bucket_bytes(key);
                }
                keep
            });
        }
        domains.retain(|_, buckets| !buckets.is_empty());
        self.metrics.quota.buckets.set(gauge(state.bucket_count()));
        posts
    }

    /// Each bucket's post sent to the store; the other replicas' demands that come back, for
    /// the buckets whose call succeeded (a failed one keeps the last known).
    async fn share(
        &self,
        store: &dyn DemandShare,
        posts: Vec<Post>,
    ) -> HashMap<BucketRef, Vec<Option<f64>>> {
        // Each replica posts its streams every interval: three missed posts mean it stopped.
        let stale_after = self.options.rlqs_interval * 3;
        let own = format!("{}/", self.replica);
        let calls = posts.into_iter().map(|post| {
            let own = own.as_str();
            async move {
                let key = store_key(&post.at);
                let shared = store
                    .share_demand(&DemandPost {
                        key: &key,
                        demands: &post.demands,
                        gone: &post.gone,
                        stale_after,
                    })
                    .await;
                let others = match shared {
                    Ok(all) => Some(
                        all.into_iter()
                            .filter(|d| !d.stream.starts_with(own))
                            .map(|d| d.per_second)
                            .collect(),
                    ),
                    Err(error) => {
                        tracing::warn!(%error, "RLQS: sharing demand failed; the last known is kept");
                        None
                    }
                };
                (post.at, others)
            }
        });
        // A Redis that does not answer must not hold the round up past the renewals: what has
        // not answered by half an interval keeps its last known demand.
        let deadline = tokio::time::sleep(self.options.rlqs_interval / 2);
        futures_util::stream::iter(calls)
            .buffer_unordered(SHARING_CONCURRENCY)
            .take_until(deadline)
            .filter_map(|(at, others)| async move { others.map(|o| (at, o)) })
            .collect()
            .await
    }

    /// Splits every bucket again and pushes what is due.
    fn reassign(&self, mut shared: HashMap<BucketRef, Vec<Option<f64>>>, now: Instant) {
        let rules = self.rules.load();
        let mut state = self.state();
        let mut actions: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        let all: Vec<BucketRef> = state
            .domains
            .iter()
            .flat_map(|(domain, buckets)| {
                buckets.keys().map(|key| (domain.clone(), Arc::clone(key)))
            })
            .collect();
        let labelled = all.len() <= MAX_BUCKET_LABELS;
        if !labelled {
            self.metrics.quota.clear_buckets();
        }
        for at in &all {
            let bucket = state.domains.get_mut(&at.0).and_then(|b| b.get_mut(&at.1));
            if let (Some(others), Some(bucket)) = (shared.remove(at), bucket) {
                bucket.others = others;
            }
            for (id, action) in state.assign(&self.options, &rules, at, now, Reach::Due) {
                actions.entry(id).or_default().push(action);
            }
            if labelled {
                self.report_bucket(&state, at);
            }
        }
        for (id, actions) in actions {
            if let Some(stream) = state.streams.get(&id) {
                send(&stream.outbox, actions, &self.metrics, "assign");
            }
        }
    }

    fn report_bucket(&self, state: &registry::State, at: &BucketRef) {
        let Some(bucket) = state.domains.get(&at.0).and_then(|b| b.get(&at.1)) else {
            return;
        };
        let (demand, assigned, streams) = bucket.figures();
        self.metrics.quota.set_bucket(&BucketFigures {
            domain: &at.0,
            bucket: &label(&at.1),
            demand,
            assigned,
            streams,
        });
    }
}

/// A bucket's entries as `key=value` joined by `,`, in key order (metrics, listings), with
/// `\`, `,` and `=` inside keys and values escaped by `\`, so that two buckets never share
/// a label. Past `MAX_LABEL_BYTES` the text is cut and ends in `…#` and a digest of the whole,
/// so that a label stays short whatever a data plane sends, and still names one bucket.
pub fn label(key: &BucketKey) -> String {
    let escape = |text: &str| {
        text.replace('\\', "\\\\")
            .replace(',', "\\,")
            .replace('=', "\\=")
    };
    let entries: Vec<String> = key
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect();
    let whole = entries.join(",");
    if whole.len() <= MAX_LABEL_BYTES {
        return whole;
    }
    let mut cut = MAX_LABEL_BYTES;
    while !whole.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest: String = Sha256::digest(whole.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}…#{digest}", &whole[..cut])
}

/// Longest bucket label kept whole.
const MAX_LABEL_BYTES: usize = 128;

/// The store key of a bucket's demand: a digest of the domain and entries, so that any
/// bytes clients send make a short key of fixed shape.
fn store_key(at: &BucketRef) -> String {
    let mut digest = Sha256::new();
    for part in std::iter::once((&at.0, &String::new())).chain(at.1.iter()) {
        for text in [part.0, part.1] {
            digest.update((text.len() as u64).to_be_bytes());
            digest.update(text.as_bytes());
        }
    }
    let hex: String = digest.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("tollgate:rlqs:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_bucket_label_is_cut_and_still_names_one_bucket() {
        let key = |value: &str| BucketKey::from([("tenant".to_owned(), value.to_owned())]);
        assert_eq!(label(&key("a,b=c")), "tenant=a\\,b\\=c");
        let (one, other) = (
            label(&key(&"x".repeat(5_000))),
            label(&key(&format!("{}y", "x".repeat(4_999)))),
        );
        assert_eq!(
            one.chars().take_while(|&c| c != '…').count(),
            MAX_LABEL_BYTES
        );
        assert!(one.len() < MAX_LABEL_BYTES + 24, "{}", one.len());
        assert_ne!(one, other);
        // Cut on a character, not within one.
        let wide = label(&key(&"日".repeat(100)));
        assert!(wide.starts_with("tenant=日"));
    }
}
