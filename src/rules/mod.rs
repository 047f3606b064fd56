//! The rules of every domain, compiled once at load time into a lookup tree: per level, a map
//! from entry key to that key's nodes (exact values by hash, wildcard patterns in config order,
//! and the key-only default). `matcher::find` walks it; nothing walks YAML per request.

pub mod matcher;
#[cfg(test)]
mod tests;

use fnv::FnvHashMap;

use crate::limit::Limit;

// The maps below hash with FNV rather than std's SipHash: their keys are short names from the
// config, looked up once per level per request, where FNV costs a fraction of SipHash. A
// client cannot make lookups slow: it chooses only what is looked up, never what is stored,
// and a lookup's probe length depends on the stored keys alone.

/// Every configured domain.
#[derive(Debug)]
pub struct RuleSet {
    domains: FnvHashMap<String, DomainRules>,
    /// False for the rules in force before any were loaded (`not_loaded`).
    loaded: bool,
}

/// No domain, loaded: every request is answered OK, as for an unknown domain.
impl Default for RuleSet {
    fn default() -> Self {
        Self::new([])
    }
}

impl RuleSet {
    pub fn new(domains: impl IntoIterator<Item = DomainRules>) -> Self {
        Self {
            domains: domains
                .into_iter()
                .map(|domain| (domain.name.clone(), domain))
                .collect(),
            loaded: true,
        }
    }

    /// What is in force before any rules were loaded (a control plane's first set has not
    /// come; the files at start did not load and `--wait-for-valid-config` waits for them):
    /// every request is refused (`no rate limit configuration loaded`) and the server is not
    /// ready, until rules are loaded.
    pub fn not_loaded() -> Self {
        Self {
            domains: FnvHashMap::default(),
            loaded: false,
        }
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    pub fn domain(&self, name: &str) -> Option<&DomainRules> {
        self.domains.get(name)
    }

    /// Domains sorted by name, for stable listings.
    pub fn domains(&self) -> Vec<&DomainRules> {
        let mut domains: Vec<&DomainRules> = self.domains.values().collect();
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        domains
    }
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct DomainRules {
    pub name: String,
    pub root: Level,
}

/// The nodes of one level of the tree, grouped by entry key.
#[derive(Debug, Default)]
pub struct Level {
    by_key: FnvHashMap<String, KeyNodes>,
}

#[derive(Debug, Default)]
struct KeyNodes {
    exact: FnvHashMap<String, Node>,
    wildcards: Vec<Node>,
    default: Option<Node>,
}

/// Two nodes with the same key and value at one level.
#[derive(Debug, PartialEq, Eq)]
pub struct DuplicateNode;

impl Level {
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The nodes at this level (descriptors, at a domain's root).
    pub fn len(&self) -> usize {
        self.by_key
            .values()
            .map(|nodes| {
                nodes.exact.len() + nodes.wildcards.len() + usize::from(nodes.default.is_some())
            })
            .sum()
    }

    /// Adds a node, refusing a second node with the same key and value.
    pub fn insert(&mut self, node: Node) -> Result<(), DuplicateNode> {
        let nodes = self.by_key.entry(node.key.clone()).or_default();
        match &node.selector {
            Selector::Exact(value) => {
                if nodes.exact.contains_key(value) {
                    return Err(DuplicateNode);
                }
                nodes.exact.insert(value.clone(), node);
            }
            Selector::Wildcard(pattern) => {
                if nodes
                    .wildcards
                    .iter()
                    .any(|n| n.selector.pattern() == Some(pattern))
                {
                    return Err(DuplicateNode);
                }
                nodes.wildcards.push(node);
            }
            Selector::Any => {
                if nodes.default.is_some() {
                    return Err(DuplicateNode);
                }
                nodes.default = Some(node);
            }
        }
        Ok(())
    }

    /// Adds every node of `other` (two files of one domain merged, as the reference's
    /// MERGE_DOMAIN_CONFIG does); a node both have is refused, as within one file. The
    /// refused node is named by its key and value.
    pub fn merge(&mut self, other: Level) -> Result<(), (String, String)> {
        for (_, nodes) in other.by_key {
            let KeyNodes {
                exact,
                wildcards,
                default,
            } = nodes;
            for node in exact.into_values().chain(wildcards).chain(default) {
                let named = (node.key.clone(), node.selector.text().to_owned());
                self.insert(node).map_err(|DuplicateNode| named)?;
            }
        }
        Ok(())
    }

    /// Whether some node of this level has `key` (how a quota bucket's unordered entries are
    /// put in the order of the rules).
    pub fn has_key(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// The node for one request entry: exact value first, then wildcards in config order, then
    /// the key-only default. See `matcher` for why there is no backtracking.
    pub fn lookup(&self, key: &str, value: &str) -> Option<&Node> {
        let nodes = self.by_key.get(key)?;
        nodes
            .exact
            .get(value)
            .or_else(|| {
                nodes
                    .wildcards
                    .iter()
                    .find(|node| node.selector.pattern().is_some_and(|p| p.matches(value)))
            })
            .or(nodes.default.as_ref())
    }

    /// Every node of this level, exact ones first, for listings; order within a kind is stable.
    pub fn nodes(&self) -> Vec<&Node> {
        let mut keys: Vec<&String> = self.by_key.keys().collect();
        keys.sort();
        let mut out = Vec::new();
        for key in keys {
            let nodes = &self.by_key[key];
            let mut exact: Vec<&Node> = nodes.exact.values().collect();
            exact.sort_by(|a, b| a.selector.text().cmp(b.selector.text()));
            out.extend(exact);
            out.extend(nodes.wildcards.iter());
            out.extend(nodes.default.iter());
        }
        out
    }
}

/// One descriptor node of the config.
#[derive(Debug)]
pub struct Node {
    pub key: String,
    pub selector: Selector,
    pub rule: Option<Rule>,
    /// Every value matching the wildcard shares one counter (`share_threshold`).
    pub share_threshold: bool,
    /// Stats name this level by the client's value rather than the config's (`value_to_metric`).
    pub value_to_metric: bool,
    pub children: Level,
}

impl Node {
    /// This level's segment of the stats path: `key` for key-only nodes, else `key_value`
    /// (patterns kept as written), as the reference names its stats.
    pub fn stats_segment(&self) -> String {
        match &self.selector {
            Selector::Any => self.key.clone(),
            selector => format!("{}_{}", self.key, selector.text()),
        }
    }
}

/// Which values of the key a node matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Exact(String),
    Wildcard(Pattern),
    /// Key only: any value, with a counter per value.
    Any,
}

impl Selector {
    /// A config value: `*` anywhere makes it a wildcard; empty or absent means any value.
    pub fn from_config(value: Option<&str>) -> Self {
        match value {
            None | Some("") => Selector::Any,
            Some(value) if value.contains('*') => Selector::Wildcard(Pattern::new(value)),
            Some(value) => Selector::Exact(value.to_owned()),
        }
    }

    fn pattern(&self) -> Option<&Pattern> {
        match self {
            Selector::Wildcard(pattern) => Some(pattern),
            _ => None,
        }
    }

    /// The config text of the value ("" for key-only).
    pub fn text(&self) -> &str {
        match self {
            Selector::Exact(value) => value,
            Selector::Wildcard(pattern) => &pattern.text,
            Selector::Any => "",
        }
    }
}

/// A value pattern where each `*` matches any run of characters, possibly empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    /// The literal pieces between stars.
    pieces: Vec<String>,
}

impl Pattern {
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            pieces: text.split('*').map(str::to_owned).collect(),
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// First piece is a prefix, last a suffix, the middle ones appear in order between them.
    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return value.is_empty(),
        };
        let Some(mut remainder) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return remainder.is_empty();
        };
        for piece in middle {
            match remainder.find(piece.as_str()) {
                Some(at) => remainder = &remainder[at + piece.len()..],
                None => return false,
            }
        }
        remainder.len() >= last.len() && remainder.ends_with(last.as_str())
    }
}

/// What a node with `rate_limit` applies.
#[derive(Debug)]
pub struct Rule {
    pub policy: Policy,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// The rule's `metadata` (a map), for dynamic metadata; shared, so answers clone a pointer.
    pub metadata: Option<std::sync::Arc<serde_json::Value>>,
    /// The config path in the reference's stats notation, e.g. `api.user_alice.path`.
    pub path: String,
    /// The per-limit metric counters of `path`, found on the rule's first hit and held here.
    pub counters: crate::metrics::HeldCounters,
}

impl Rule {
    /// Whether one of this rule's limits carries `name` (what `replaces` refers to).
    pub fn is_named(&self, name: &str) -> bool {
        match &self.policy {
            Policy::Limited(limits) => limits
                .iter()
                .any(|limit| limit.name.as_deref() == Some(name)),
            Policy::Unlimited { name: own } => own.as_deref() == Some(name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// One limit (`rate_limit`) or several on one counter identity (`rate_limits`); never empty.
    Limited(Vec<Limit>),
    Unlimited {
        name: Option<String>,
    },
}
