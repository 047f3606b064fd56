//! Finds the rule for one request descriptor, with the reference's precedence:
//!
//! 1. At each level, the entry `(key, value)` selects one node: the exact value if configured,
//!    else the first wildcard pattern (config order) that matches the value, else the key-only
//!    node. Matching is on the pair itself, not on the reference's joined `key_value` string,
//!    so `(a_b, c)` cannot match a rule for key `a`, value `b_c`.
//! 2. A rule applies only at the node reached by the descriptor's last entry; a rule on a node
//!    that more entries pass through is ignored (depth mismatch).
//! 3. There is no backtracking: once an entry selected a node, a miss further down is a miss,
//!    even if the key-only sibling would have matched the rest (reference issues #653, #287).

use smallvec::SmallVec;

use super::{DomainRules, Node, Rule};
use crate::descriptor::Entry;

/// The nodes of one match, held inline for descriptors of up to this many entries (most have
/// one or two): finding a rule allocates nothing.
const INLINE_ENTRIES: usize = 4;

/// The rule a descriptor matched, and the node each entry selected (the "why", for counter
/// identities, stats paths and logs).
#[derive(Debug)]
pub struct Match<'r> {
    pub rule: &'r Rule,
    pub nodes: SmallVec<[&'r Node; INLINE_ENTRIES]>,
}

/// Finds the rule for `entries` in `domain`, if any.
pub fn find<'r>(domain: &'r DomainRules, entries: &[Entry]) -> Option<Match<'r>> {
    let mut level = &domain.root;
    let mut nodes = SmallVec::new();
    for (index, entry) in entries.iter().enumerate() {
        let node = level.lookup(&entry.key, &entry.value)?;
        nodes.push(node);
        if index + 1 == entries.len() {
            return node.rule.as_ref().map(|rule| Match { rule, nodes });
        }
        level = &node.children;
    }
    None
}
