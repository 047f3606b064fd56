//! Which Redis Cluster master serves each slot (`Topology`, read from CLUSTER SLOTS and kept
//! fresh in the background), and how a request's hits split into script calls: one per node
//! where the slot map is known (a call across the slots of one node), else one per slot. Fewer calls than slots matters: on a cluster every call costs the client and
//! the node a fixed overhead that dwarfs what a counter adds (docs/performance.md).
//!
//! A stale map costs a retry, never a wrong count: a call across slots whose counters are not
//! all on its node fails on the read of the first one that is not, having written nothing, and
//! its hits are sent again one slot at a time (`split_by_slot`), which redis-rs routes and
//! redirects.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::Value;

use super::connection::{Connection, Current};
use super::library;
use crate::storage::{Hit, StoreError};

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The slot of a key, as Redis computes it: CRC16 of the hash tag (the first non-empty
/// `{…}`), else of the whole key.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&byte| byte == b'}')?;
            (close > 0).then(|| &rest[..close])
        });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % SLOTS
}

/// The master of every slot, numbered in the order CLUSTER SLOTS named them, and where each
/// master is (the address redis-rs knows it by, from the same reply).
#[derive(Debug, PartialEq, Eq)]
pub struct SlotOwners {
    owner: Box<[u16]>,
    masters: Vec<(String, u16)>,
}

/// A slot no master serves (a cluster that is still forming or lost a shard), or one whose
/// master has no usable address.
const NO_OWNER: u16 = u16::MAX;

#[derive(Debug, thiserror::Error)]
pub enum SlotMapError {
    #[error("CLUSTER SLOTS answered something other than a list of ranges")]
    NotAList,
    #[error("CLUSTER SLOTS range {0} is not [start, end, [host, port, …], …]")]
    Range(usize),
    #[error("CLUSTER SLOTS range {0} is out of bounds")]
    OutOfBounds(usize),
    #[error("CLUSTER SLOTS names more masters than tollgate can number")]
    TooManyMasters,
}

impl SlotOwners {
    /// Reads a CLUSTER SLOTS reply: `[start, end, [host, port, …], replicas…]` per range. A
    /// master announced without a host (`""` or `"?"`: "the address you reached me at") is
    /// left out: its slots get calls of their own, routed by key.
    pub fn from_cluster_slots(reply: &Value) -> Result<Self, SlotMapError> {
        let Value::Array(ranges) = reply else {
            return Err(SlotMapError::NotAList);
        };
        let mut owner = vec![NO_OWNER; usize::from(SLOTS)].into_boxed_slice();
        let mut masters: Vec<(String, u16)> = Vec::new();
        for (number, range) in ranges.iter().enumerate() {
            let Value::Array(fields) = range else {
                return Err(SlotMapError::Range(number));
            };
            let [Value::Int(start), Value::Int(end), Value::Array(master), ..] = fields.as_slice()
            else {
                return Err(SlotMapError::Range(number));
            };
            let [Value::BulkString(host), Value::Int(port), ..] = master.as_slice() else {
                return Err(SlotMapError::Range(number));
            };
            let slots = usize::try_from(*start)
                .ok()
                .zip(usize::try_from(*end).ok())
                .filter(|&(start, end)| start <= end && end < owner.len())
                .ok_or(SlotMapError::OutOfBounds(number))?;
            let host = String::from_utf8_lossy(host);
            let (Ok(port), false) = (u16::try_from(*port), host.is_empty() || host == "?") else {
                continue;
            };
            let address = (host.into_owned(), port);
            let index = match masters.iter().position(|known| *known == address) {
                Some(index) => index,
                None => {
                    masters.push(address);
                    masters.len() - 1
                }
            };
            let index = u16::try_from(index)
                .ok()
                .filter(|&index| index != NO_OWNER)
                .ok_or(SlotMapError::TooManyMasters)?;
            owner[slots.0..=slots.1].fill(index);
        }
        Ok(Self { owner, masters })
    }

    fn owner(&self, slot: u16) -> Option<u16> {
        self.owner
            .get(usize::from(slot))
            .copied()
            .filter(|&owner| owner != NO_OWNER)
    }

    /// Host and port of master number `node`.
    fn address(&self, node: u16) -> Option<(&str, u16)> {
        self.masters
            .get(usize::from(node))
            .map(|(host, port)| (host.as_str(), *port))
    }
}

/// The hits of one script call, by index into the request's hits (in request order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group<'a> {
    pub indices: Vec<usize>,
    /// The hits span more than one slot (of one node).
    pub cross_slot: bool,
    /// Host and port of the master serving every hit's slot, from the `SlotOwners` planned
    /// with; `None` where the map is not known.
    pub node: Option<(&'a str, u16)>,
}

/// Splits hits into calls: by master when `owners` is known, else by slot. Groups come in the
/// order of their first hit. A slot without a known master gets a call of its own.
pub fn plan<'a>(hits: &[Hit], owners: Option<&'a SlotOwners>) -> Vec<Group<'a>> {
    // (what the group is keyed by, the slot of its first hit, the group)
    let mut groups: Vec<(u32, u16, Group<'a>)> = Vec::new();
    for (index, hit) in hits.iter().enumerate() {
        let slot = slot_of(hit.key.as_str());
        // Every numbered master has an address (`from_cluster_slots` leaves out the others).
        let owner = owners.and_then(|owners| {
            let number = owners.owner(slot)?;
            Some((number, owners.address(number)?))
        });
        let (by, node) = match owner {
            Some((number, address)) => (u32::from(number), Some(address)),
            None => (u32::from(NO_OWNER) + 1 + u32::from(slot), None),
        };
        match groups.iter_mut().find(|(key, _, _)| *key == by) {
            Some((_, first, group)) => {
                group.indices.push(index);
                group.cross_slot |= *first != slot;
            }
            None => groups.push((
                by,
                slot,
                Group {
                    indices: vec![index],
                    cross_slot: false,
                    node,
                },
            )),
        }
    }
    groups.into_iter().map(|(_, _, group)| group).collect()
}

/// Hits one slot at a time (each group routed by its key): for when a call across slots found
/// a counter moved, and for refunds, which are rare enough not to need the slot map.
pub fn split_by_slot(indices: &[usize], hits: &[Hit]) -> Vec<Group<'static>> {
    let mut slots: Vec<(u16, Group<'static>)> = Vec::new();
    for &index in indices {
        let slot = slot_of(hits[index].key.as_str());
        match slots.iter_mut().find(|(known, _)| *known == slot) {
            Some((_, group)) => group.indices.push(index),
            None => slots.push((
                slot,
                Group {
                    indices: vec![index],
                    cross_slot: false,
                    node: None,
                },
            )),
        }
    }
    slots.into_iter().map(|(_, group)| group).collect()
}

// === impl Topology ===

/// What the store knows of a cluster's slots.
#[derive(Default)]
pub struct Topology {
    /// Which node serves each slot, once known and once the cross-slot script is loaded.
    owners: ArcSwapOption<SlotOwners>,
    cross_slot: AtomicU8,
    /// Woken when a call found the map stale, to read it again before the next period.
    stale: Arc<tokio::sync::Notify>,
}

/// `Topology::cross_slot`: whether the cross-slot script is loaded on every node.
const NOT_YET: u8 = 0;
const LOADED: u8 = 1;
/// A node refused to compile it (Redis before 7): one call per slot for good.
const REFUSED: u8 = 2;

/// Reads of the slot map are at least this far apart, so that calls finding it stale while a
/// migration is in progress (the map cannot show a half-moved slot) do not flood the cluster.
const SLOT_MAP_MIN_GAP: Duration = Duration::from_secs(1);

impl Topology {
    /// The slot map, when known.
    pub fn owners(&self) -> Option<Arc<SlotOwners>> {
        self.owners.load_full()
    }

    /// Asks for the map to be read again soon: a call found it stale.
    pub fn report_stale(&self) {
        self.stale.notify_one();
    }

    pub async fn refresh(&self, connection: &Connection) {
        if self.cross_slot.load(Ordering::Acquire) == NOT_YET {
            // Once is enough: a node that lacks it later (restarted, promoted) gets it with
            // its first call, by EVAL. Redis before 7 cannot compile it.
            let loaded = match library::cross_slot_probe() {
                Some(script) => connection.load(script).await,
                None => Ok(()),
            };
            match loaded {
                Ok(()) => self.cross_slot.store(LOADED, Ordering::Release),
                Err(error) if error.is_transient() => {
                    tracing::warn!(%error, "loading the cross-slot script failed; one call per slot until it loads");
                }
                Err(error) => {
                    tracing::info!(%error, "the cluster cannot run cross-slot scripts (Redis 7+): one call per slot");
                    self.cross_slot.store(REFUSED, Ordering::Release);
                }
            }
        }
        if self.cross_slot.load(Ordering::Acquire) != LOADED {
            return;
        }
        let reply = connection
            .query::<Value>(&redis::cmd("CLUSTER").arg("SLOTS").to_owned())
            .await;
        let owners = reply.and_then(|reply| {
            SlotOwners::from_cluster_slots(&reply)
                .map_err(|error| StoreError::MalformedReply(error.to_string()))
        });
        match owners {
            Ok(owners) => self.owners.store(Some(Arc::new(owners))),
            // A stale map is still mostly right, and a call it misleads is sent again.
            Err(error) => tracing::warn!(%error, "reading the cluster's slot map failed"),
        }
    }

    /// Keeps the map fresh while the store lives (the task holds the topology only while it
    /// reads the map).
    pub fn keep_fresh(topology: Weak<Self>, current: Current, period: Duration) {
        let Some(stale) = topology
            .upgrade()
            .map(|topology| Arc::clone(&topology.stale))
        else {
            return;
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SLOT_MAP_MIN_GAP.min(period)).await;
                tokio::select! {
                    _ = tokio::time::sleep(period.saturating_sub(SLOT_MAP_MIN_GAP)) => {}
                    _ = stale.notified() => {}
                }
                let Some(topology) = topology.upgrade() else {
                    return;
                };
                if topology.cross_slot.load(Ordering::Acquire) == REFUSED {
                    return;
                }
                if let Some(connection) = current() {
                    topology.refresh(&connection).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Params};
    use crate::storage::Role;
    use crate::storage::keys::{EntryValue, counter_key};
    use redis::cluster_routing::Slot;

    fn hit(user: &str) -> Hit {
        let params = Params {
            algorithm: Algorithm::default(),
            requests: 10,
            window: 1_000_000,
        };
        Hit {
            descriptor: 0,
            key: counter_key("d", [("user", EntryValue::Actual(user))], &params),
            params,
            hits: 1,
            role: Role::Enforced,
            charge: crate::algorithm::Charge::IfAllowed,
            lease: crate::limit::Lease::AsConfigured,
        }
    }

    fn int(value: i64) -> Value {
        Value::Int(value)
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(host.into()),
            int(port),
            Value::BulkString(id.into()),
        ])
    }

    /// Three masters: a 0-5460, c 10923-16383, b 5461-10922 (in that order).
    fn three_masters() -> SlotOwners {
        let range = |start, end, master| Value::Array(vec![int(start), int(end), master]);
        SlotOwners::from_cluster_slots(&Value::Array(vec![
            range(0, 5460, node("127.0.0.1", 7000, "a")),
            range(10923, 16383, node("127.0.0.1", 7002, "c")),
            range(5461, 10922, node("127.0.0.1", 7001, "b")),
        ]))
        .unwrap()
    }

    #[test]
    fn slots_are_the_ones_redis_computes() {
        for key in [
            "",
            "a",
            "user:1",
            "{tag}x",
            "x{tag}",
            "{}x",
            "{x",
            "tollgate:v1:{ab}:fw",
        ] {
            assert_eq!(Some(Slot::for_key(key)), Slot::new(slot_of(key)), "{key}");
        }
        // Redis's own documentation: "123456789" hashes to 0x31C3, and a hash tag decides.
        assert_eq!(slot_of("123456789"), 0x31C3);
        assert_eq!(slot_of("{123456789}.following"), 0x31C3);
    }

    #[test]
    fn cluster_slots_give_each_slot_its_master() {
        let owners = three_masters();
        assert_eq!(owners.owner(0), Some(0));
        assert_eq!(owners.owner(5460), Some(0));
        assert_eq!(owners.owner(10923), Some(1), "numbered in the order named");
        assert_eq!(owners.owner(5461), Some(2));
        assert_eq!(owners.owner(16383), Some(1));
        assert_eq!(owners.address(1), Some(("127.0.0.1", 7002)));
        assert_eq!(owners.address(3), None);

        let partial = SlotOwners::from_cluster_slots(&Value::Array(vec![
            Value::Array(vec![int(0), int(99), node("h", 1, "")]),
            Value::Array(vec![int(100), int(199), node("", 2, "x")]),
        ]))
        .unwrap();
        assert_eq!(partial.owner(99), Some(0));
        assert_eq!(
            partial.owner(100),
            None,
            "no host: no address to call it by"
        );
        assert_eq!(partial.owner(200), None, "no master");

        for bad in [
            Value::Okay,
            Value::Array(vec![int(1)]),
            Value::Array(vec![Value::Array(vec![int(5), int(4), node("h", 1, "a")])]),
            Value::Array(vec![Value::Array(vec![
                int(0),
                int(16384),
                node("h", 1, "a"),
            ])]),
        ] {
            assert!(SlotOwners::from_cluster_slots(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hits_group_by_master_when_known_else_by_slot() {
        let hits: Vec<Hit> = (0..12).map(|i| hit(&format!("u{i}"))).collect();
        let owners = three_masters();
        let node_of = |index: usize| owners.owner(slot_of(hits[index].key.as_str()));

        let by_node = plan(&hits, Some(&owners));
        let distinct_nodes: std::collections::HashSet<_> = (0..12).map(node_of).collect();
        assert_eq!(by_node.len(), distinct_nodes.len());
        let mut seen: Vec<usize> = Vec::new();
        for group in &by_node {
            let node = node_of(group.indices[0]);
            assert!(group.indices.iter().all(|&i| node_of(i) == node));
            assert_eq!(group.node, node.and_then(|node| owners.address(node)));
            assert!(
                group.indices.windows(2).all(|w| w[0] < w[1]),
                "request order"
            );
            let slots: std::collections::HashSet<u16> = group
                .indices
                .iter()
                .map(|&i| slot_of(hits[i].key.as_str()))
                .collect();
            assert_eq!(group.cross_slot, slots.len() > 1);
            seen.extend(&group.indices);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..12).collect::<Vec<_>>(), "every hit exactly once");

        let by_slot = plan(&hits, None);
        let distinct_slots: std::collections::HashSet<u16> =
            hits.iter().map(|h| slot_of(h.key.as_str())).collect();
        assert_eq!(by_slot.len(), distinct_slots.len());
        assert!(by_slot.iter().all(|group| !group.cross_slot));

        for group in by_node.iter().filter(|group| group.cross_slot) {
            assert!(group.node.is_some());
            let split = split_by_slot(&group.indices, &hits);
            assert!(split.len() > 1 && split.iter().all(|g| !g.cross_slot));
            let mut indices: Vec<usize> = split.iter().flat_map(|g| g.indices.clone()).collect();
            indices.sort_unstable();
            assert_eq!(indices, group.indices);
        }
    }
}
