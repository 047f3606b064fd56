//! The counter code as it lives on a Redis server. The Lua files (`lua/`: the prelude, one file
//! per algorithm, each with the `decide` and `give_back` of its Rust twin in src/algorithm/,
//! and `apply.lua`, the entry point) are joined two ways:
//!
//! - a **function library** (Redis 7+): loaded once per server by FUNCTION LOAD and called by
//!   FCALL. Its helpers are defined when it loads, so a call runs only the decision; as a
//!   script, redefining them cost more than the whole floor of an atomic counter.
//! - a **script** for servers without functions (Redis before 7, or a user refused FUNCTION or
//!   FCALL): called by EVALSHA, sent whole by EVAL on NOSCRIPT.
//!
//! Library and function names carry a digest of the code, so replicas of two tollgate
//! versions sharing a Redis during a rollout each call their own. Functions are replicated
//! and persisted like data, so a promoted replica has them; a server that lost them
//! (restarted without persistence, FUNCTION FLUSH) answers "Function not found" and gets them
//! again from the call that found out.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind};

/// The parts, in the order the code needs them: helpers, one file per algorithm (each
/// registers itself by its key tag), the two entry points (`apply(KEYS, ARGV)`, the general
/// one, and `count(KEYS, ARGV)`, for calls made only of counters: `counter.rs`).
const SOURCE: [&str; 8] = [
    include_str!("lua/prelude.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/apply.lua"),
    include_str!("lua/counter.lua"),
];

static CODE: LazyLock<String> = LazyLock::new(|| SOURCE.join("\n"));

/// Which entry point a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Apply,
    Count,
}

impl Entry {
    fn name(self) -> &'static str {
        match self {
            Entry::Apply => "apply",
            Entry::Count => "count",
        }
    }
}

/// A script running one entry point, with its text and SHA1 computed once; cross-slot ones are
/// declared `allow-cross-slot-keys` (Redis 7+; older versions cannot even compile them): on a
/// cluster they may touch the counters of every slot their node serves.
struct Scripts {
    text: String,
    script: Script,
}

impl Scripts {
    fn new(entry: Entry, cross_slot: bool) -> Self {
        let flags = if cross_slot {
            "#!lua flags=allow-cross-slot-keys\n"
        } else {
            ""
        };
        let text = format!("{flags}{}\nreturn {}(KEYS, ARGV)\n", *CODE, entry.name());
        let script = Script::new(&text);
        Self { text, script }
    }
}

static APPLY: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(Entry::Apply, false));
static APPLY_CROSS_SLOT: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(Entry::Apply, true));
static COUNT: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(Entry::Count, false));
static COUNT_CROSS_SLOT: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(Entry::Count, true));

/// The general script: loaded at connect where functions cannot run.
pub static SCRIPT: LazyLock<&'static Script> = LazyLock::new(|| &APPLY.script);

/// The general cross-slot script: whether a cluster can load it tells whether it can run
/// cross-slot calls at all.
pub static CROSS_SLOT_SCRIPT: LazyLock<&'static Script> =
    LazyLock::new(|| &APPLY_CROSS_SLOT.script);

/// The first 12 hex digits of the general script's SHA1: this version of the code.
static VERSION: LazyLock<&'static str> = LazyLock::new(|| &APPLY.script.get_hash()[..12]);

/// The function of an entry point, for calls that declare their keys or cross-slot ones.
fn function_name(entry: Entry, cross_slot: bool) -> String {
    let kind = if cross_slot { "_cross_slot" } else { "" };
    format!("tollgate_{}{kind}_{}", entry.name(), *VERSION)
}

static FUNCTIONS: LazyLock<[String; 4]> = LazyLock::new(|| {
    [
        function_name(Entry::Apply, false),
        function_name(Entry::Apply, true),
        function_name(Entry::Count, false),
        function_name(Entry::Count, true),
    ]
});

static LIBRARY_TEXT: LazyLock<String> = LazyLock::new(|| {
    let mut text = format!("#!lua name=tollgate_{}\n{}\n", *VERSION, *CODE);
    for entry in [Entry::Apply, Entry::Count] {
        for cross_slot in [false, true] {
            let flags = if cross_slot {
                ", flags = { 'allow-cross-slot-keys' }"
            } else {
                ""
            };
            text.push_str(&format!(
                "redis.register_function{{function_name = '{}', callback = {}{flags}}}\n",
                function(entry, cross_slot),
                entry.name(),
            ));
        }
    }
    text
});

/// The script of an entry point and its text.
pub fn script(entry: Entry, cross_slot: bool) -> (&'static Script, &'static str) {
    let scripts = match (entry, cross_slot) {
        (Entry::Apply, false) => &*APPLY,
        (Entry::Apply, true) => &*APPLY_CROSS_SLOT,
        (Entry::Count, false) => &*COUNT,
        (Entry::Count, true) => &*COUNT_CROSS_SLOT,
    };
    (&scripts.script, scripts.text.as_str())
}

/// The function of an entry point.
pub fn function(entry: Entry, cross_slot: bool) -> &'static str {
    let index = match entry {
        Entry::Apply => 0,
        Entry::Count => 2,
    } + usize::from(cross_slot);
    &FUNCTIONS[index]
}

/// `FUNCTION LOAD` of the library (on a cluster, redis-rs sends it to every primary unless
/// routed).
pub fn load_command() -> Cmd {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LIBRARY_TEXT.as_str())
        .to_owned()
}

/// Cleared, for the rest of the process, when a server cannot run functions: every call goes
/// by script from then on. One flag for the process: its stores are meant to be one kind of
/// Redis, and scripts are correct on every kind.
static FUNCTIONS_USABLE: AtomicBool = AtomicBool::new(true);

pub fn functions_usable() -> bool {
    FUNCTIONS_USABLE.load(Ordering::Relaxed)
}

/// Whether `error` (to FUNCTION LOAD or FCALL) says functions cannot be used here: the
/// command is unknown (Redis before 7) or refused to this user. If so, calls go by script
/// from now on.
pub fn gives_up_functions(error: &RedisError) -> bool {
    let unusable = error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || error.to_string().contains("unknown command");
    if unusable && FUNCTIONS_USABLE.swap(false, Ordering::Relaxed) {
        tracing::warn!(%error, "Redis cannot run tollgate's functions; calls go by script (EVALSHA), which costs Redis more per decision");
    }
    unusable
}

/// Whether the server does not have the library (yet, or any more).
pub fn is_missing(error: &RedisError) -> bool {
    error.to_string().contains("Function not found")
}

/// Whether a FUNCTION LOAD failed only because the library is there already (another replica
/// loaded it first).
pub fn is_loaded_already(error: &RedisError) -> bool {
    error.to_string().contains("already exists")
}

/// Whether a script call found the script not cached on its server.
pub fn is_no_script(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_is_registered_under_a_name_carrying_the_version() {
        assert_eq!(VERSION.len(), 12);
        assert!(LIBRARY_TEXT.starts_with(&format!("#!lua name=tollgate_{}\n", *VERSION)));
        let names = FUNCTIONS.clone();
        assert_eq!(names[0], format!("tollgate_apply_{}", *VERSION));
        assert_eq!(names[3], format!("tollgate_count_cross_slot_{}", *VERSION));
        for name in &names {
            assert_eq!(
                LIBRARY_TEXT
                    .matches(&format!("function_name = '{name}'"))
                    .count(),
                1,
                "{name}"
            );
        }
        assert_eq!(
            LIBRARY_TEXT
                .matches("flags = { 'allow-cross-slot-keys' }")
                .count(),
            2
        );
        assert!(
            script(Entry::Count, true)
                .1
                .starts_with("#!lua flags=allow-cross-slot-keys\n")
        );
        assert!(
            script(Entry::Count, false)
                .1
                .ends_with("return count(KEYS, ARGV)\n")
        );
    }
}
