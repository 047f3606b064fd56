//! envoyproxy/ratelimit's environment: started as `ratelimit` (the image ships
//! `/bin/ratelimit`, a link to tollgate) or as `tollgate serve --env reference`, tollgate reads
//! the reference's environment variables, with the reference's defaults, and turns them into
//! `serve`'s flags, which then go through the same parsing as typed ones (flags given after
//! them still win). `variables.rs` lists every variable and what it becomes.
//!
//! Where the reference's default is a semantic choice, it is kept in this mode (denied hits
//! count, `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`); where it is a defect tollgate
//! fixed (counter keys that collide), the fix stays; where it only costs speed (the local
//! cache off), tollgate's own default stays, unless the variable is set. A value tollgate cannot honour stops
//! startup with a message naming the variable; a variable that tuned the reference's
//! internals is logged once as ignored.

mod prometheus_vars;
mod reader;
mod redis_vars;
mod translation;
pub mod variables;
mod xds_vars;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;

use reader::Reader;
pub use translation::{EnvError, Translation};
use variables::Treatment;

/// The command line to parse: `args` as given, or, when they ask for the reference's
/// environment, `tollgate serve`, the flags `vars` translate to, then the flags given to
/// `serve --env reference` (which win). Started as `ratelimit`, the arguments are ignored as
/// the reference ignores them (Envoy AI Gateway's manifests pass one). `None` when they do
/// not ask for the reference's environment.
pub fn command_line(
    args: &[OsString],
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Option<(Vec<OsString>, Translation)>, EnvError> {
    let vars: HashMap<String, String> = vars.into_iter().collect();
    let invoked_as_ratelimit = args
        .first()
        .and_then(|program| Path::new(program).file_name())
        .is_some_and(|name| name == "ratelimit");
    let (given, asked) = if invoked_as_ratelimit {
        (Vec::new(), true)
    } else if args.get(1).is_some_and(|command| command == "serve") {
        without_env_flag(&args[2..], vars.get("TOLLGATE_ENV").map(String::as_str))
    } else {
        (Vec::new(), false)
    };
    if !asked {
        return Ok(None);
    }
    let mut translation = translate(&vars)?;
    if invoked_as_ratelimit {
        translation.ignored_args = args
            .iter()
            .skip(1)
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
    }
    let mut line: Vec<OsString> = vec!["tollgate".into(), "serve".into()];
    line.extend(translation.args.iter().map(OsString::from));
    line.extend(given);
    Ok(Some((line, translation)))
}

/// `serve`'s arguments without `--env reference` (or `--env=reference`), and whether it (or
/// `TOLLGATE_ENV=reference`) was there.
fn without_env_flag(args: &[OsString], from_env: Option<&str>) -> (Vec<OsString>, bool) {
    let mut kept = Vec::new();
    let mut asked = from_env == Some("reference");
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--env=reference" {
            asked = true;
        } else if arg == "--env" {
            match iter.next() {
                Some(value) if value == "reference" => asked = true,
                Some(value) => kept.extend([arg.clone(), value.clone()]),
                None => kept.push(arg.clone()),
            }
        } else {
            kept.push(arg.clone());
        }
    }
    (kept, asked)
}

/// Where and how the reference's variables in `vars` say to read the rule files (for
/// `tollgate check --env reference`).
pub fn rule_files(
    vars: &HashMap<String, String>,
) -> Result<(std::path::PathBuf, crate::config::LoadOptions), EnvError> {
    let mut reader = Reader {
        vars,
        out: Translation::default(),
    };
    reader.rule_files()
}

/// The flags the reference's variables in `vars` translate to.
pub fn translate(vars: &HashMap<String, String>) -> Result<Translation, EnvError> {
    let mut reader = Reader {
        vars,
        out: Translation::default(),
    };
    reader.listeners()?;
    reader.logging()?;
    reader.config()?;
    reader.behaviour()?;
    reader.stores()?;
    reader.stats()?;
    reader.tracing()?;
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        let set = vars.get(name).is_some_and(|value| !value.is_empty());
        let treatment = variables::lookup(name).map(|variable| variable.treatment);
        if let (true, Some(Treatment::Ignored(why))) = (set, treatment) {
            reader.out.ignored.push((name.clone(), why));
        }
    }
    Ok(reader.out)
}

#[cfg(test)]
mod tests;
