//! The counter code as it lives on a Redis server. The Lua files (`lua/`: the prelude, the
//! request rule, the state format, one file per algorithm, each with the `decide` and
//! `give_back` of its Rust twin in src/algorithm/, and one file per call layout of `call/`)
//! are joined two ways:
//!
//! - a **function library** (Redis 7+): loaded once per server by FUNCTION LOAD, one function
//!   per layout (and per cross-slot form) called by FCALL. Its helpers are defined when it
//!   loads, so a call runs only the decision; as a script, redefining them cost more than the
//!   whole floor of an atomic counter.
//! - **scripts** for servers without functions (Redis before 7, or a user refused FUNCTION or
//!   FCALL), one per function: called by EVALSHA, sent whole by EVAL on NOSCRIPT.
//!
//! Library and function names carry a digest of the code, so replicas of two tollgate
//! versions sharing a Redis during a rollout each call their own. Functions are replicated
//! and persisted like data, so a promoted replica has them; a server that lost them
//! (restarted without persistence, FUNCTION FLUSH) answers "Function not found" and gets them
//! again from the call that found out.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind};

use super::call::Layout;

/// The parts, in the order the code needs them: helpers, the rule and the state format, one
/// file per algorithm (each registers itself by its code), how counters are read and written,
/// one file per layout.
const SOURCE: [&str; 17] = [
    include_str!("lua/prelude.lua"),
    include_str!("lua/rule.lua"),
    include_str!("lua/state.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/concurrency.lua"),
    include_str!("lua/window_counters.lua"),
    include_str!("lua/count_one.lua"),
    include_str!("lua/count.lua"),
    include_str!("lua/decide_one.lua"),
    include_str!("lua/apply.lua"),
    include_str!("lua/give_back.lua"),
    include_str!("lua/lease.lua"),
    include_str!("lua/lease_return.lua"),
];

static CODE: LazyLock<String> = LazyLock::new(|| SOURCE.join("\n"));

/// The first 12 hex digits of the code's SHA1: this version of the code.
static VERSION: LazyLock<String> = LazyLock::new(|| Script::new(&CODE).get_hash()[..12].to_owned());

/// One function of the library: a layout's entry point, with declared keys or across slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Function {
    pub layout: Layout,
    pub cross_slot: bool,
}

impl Function {
    /// Every function the library registers.
    pub fn all() -> impl Iterator<Item = Function> {
        Layout::ALL.into_iter().flat_map(|layout| {
            [false, true]
                .into_iter()
                .map(move |cross_slot| Function { layout, cross_slot })
                .filter(|function| function.entry().is_some())
        })
    }

    fn entry(self) -> Option<&'static str> {
        self.layout.entry(self.cross_slot)
    }

    /// Its name on the server.
    pub fn name(self) -> &'static str {
        NAMES.get(&self).map_or("tollgate_unknown", String::as_str)
    }

    /// Its script, where functions cannot run, and the script's text.
    pub fn script(self) -> Option<(&'static Script, &'static str)> {
        SCRIPTS
            .get(&self)
            .map(|(script, text)| (script, text.as_str()))
    }
}

static NAMES: LazyLock<HashMap<Function, String>> = LazyLock::new(|| {
    Function::all()
        .map(|function| {
            let kind = if function.cross_slot {
                "_cross_slot"
            } else {
                ""
            };
            let name = format!("tollgate_{}{kind}_{}", function.layout.name(), *VERSION);
            (function, name)
        })
        .collect()
});

/// Cross-slot scripts are declared `allow-cross-slot-keys` (Redis 7+; older versions cannot
/// even compile them): on a cluster they may touch the counters of every slot their node
/// serves.
static SCRIPTS: LazyLock<HashMap<Function, (Script, String)>> = LazyLock::new(|| {
    Function::all()
        .filter_map(|function| {
            let flags = if function.cross_slot {
                "#!lua flags=allow-cross-slot-keys\n"
            } else {
                ""
            };
            let text = format!(
                "{flags}{}\nreturn {}(KEYS, ARGV)\n",
                *CODE,
                function.entry()?
            );
            Some((function, (Script::new(&text), text)))
        })
        .collect()
});

static LIBRARY_TEXT: LazyLock<String> = LazyLock::new(|| {
    let mut text = format!("#!lua name=tollgate_{}\n{}\n", *VERSION, *CODE);
    for function in Function::all() {
        let flags = if function.cross_slot {
            ", flags = { 'allow-cross-slot-keys' }"
        } else {
            ""
        };
        if let Some(entry) = function.entry() {
            text.push_str(&format!(
                "redis.register_function{{function_name = '{}', callback = {entry}{flags}}}\n",
                function.name(),
            ));
        }
    }
    text
});

/// A cross-slot script: whether a cluster can load it tells whether it can run cross-slot
/// calls at all.
pub fn cross_slot_probe() -> Option<&'static Script> {
    Function {
        layout: Layout::Apply,
        cross_slot: true,
    }
    .script()
    .map(|(script, _)| script)
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
    fn every_layout_is_a_function_carrying_the_version_and_cross_slot_forms_are_flagged() {
        assert_eq!(VERSION.len(), 12);
        assert!(LIBRARY_TEXT.starts_with(&format!("#!lua name=tollgate_{}\n", *VERSION)));
        let functions: Vec<Function> = Function::all().collect();
        assert_eq!(functions.len(), 9);
        for layout in Layout::ALL {
            let name = Function {
                layout,
                cross_slot: false,
            }
            .name();
            assert_eq!(name, format!("tollgate_{}_{}", layout.name(), *VERSION));
        }
        for function in functions {
            let registered = format!("function_name = '{}'", function.name());
            assert_eq!(LIBRARY_TEXT.matches(&registered).count(), 1, "{function:?}");
            let (_, text) = function.script().unwrap();
            assert_eq!(
                text.starts_with("#!lua flags=allow-cross-slot-keys\n"),
                function.cross_slot
            );
        }
        assert_eq!(
            LIBRARY_TEXT
                .matches("flags = { 'allow-cross-slot-keys' }")
                .count(),
            2
        );
    }
}
