//! Loading the rules: every `*.yaml`/`*.yml` file under a directory, one domain per file, in
//! the envoyproxy/ratelimit format (plus tollgate's extensions). Loading is all-or-nothing: any
//! error in any file rejects the whole set, so a caller keeps whatever it had before.
//!
//! `LoadOptions` can widen this to every file and merge files of one domain, as the
//! reference's environment asks (`--env reference`).
//!
//! Files and directories whose names start with `.` are skipped. That covers editors' swap
//! files and, importantly, a Kubernetes ConfigMap volume's `..data` and `..<timestamp>`
//! directories, whose files would otherwise appear twice (as the reference's
//! `RUNTIME_IGNOREDOTFILES=true`). Symbolic links are followed.

mod error;
pub mod file;
mod limits;
mod raw;
mod tree;
pub mod xds;

use std::path::{Path, PathBuf};

use crate::rules::{DomainRules, RuleSet};
pub use error::{ConfigError, ConfigErrors};

/// Which files make the config and how files of one domain combine: flags of `tollgate
/// serve`. The default is tollgate's own: `*.yaml`/`*.yml` files, no dot entries, one file per
/// domain. `--env reference` sets what the reference's environment asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Rules")]
pub struct LoadOptions {
    /// Read every file under --config, not only `*.yaml`/`*.yml` (as the reference does).
    #[arg(long = "config-every-file", env = "TOLLGATE_CONFIG_EVERY_FILE", value_parser = clap::builder::BoolishValueParser::new())]
    pub every_file: bool,
    /// Read dot files and dot directories under --config too (by default they are skipped:
    /// editors' swap files, a ConfigMap volume's `..data` copies).
    #[arg(long = "config-dotfiles", env = "TOLLGATE_CONFIG_DOTFILES", value_parser = clap::builder::BoolishValueParser::new())]
    pub dotfiles: bool,
    /// Merge files that name the same domain (their descriptors must differ) instead of
    /// refusing the second one (the reference's MERGE_DOMAIN_CONFIG).
    #[arg(long = "merge-domains", env = "TOLLGATE_MERGE_DOMAINS", value_parser = clap::builder::BoolishValueParser::new())]
    pub merge_domains: bool,
    /// Accept a rules directory without a rule file (every request is then unlimited). By
    /// default that is an error, at start, at a reload and for `check`: a directory caught
    /// empty while it is being replaced must not lift every limit.
    #[arg(long = "config-allow-empty", env = "TOLLGATE_CONFIG_ALLOW_EMPTY", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_empty: bool,
}

/// Loads and validates every config file under `dir` (or the one file `dir` names).
pub fn load_dir(dir: &Path) -> Result<RuleSet, ConfigErrors> {
    load(dir, LoadOptions::default())
}

/// Loads and validates the config files under `dir` that `options` select.
pub fn load(dir: &Path, options: LoadOptions) -> Result<RuleSet, ConfigErrors> {
    let files = listing(dir, options)
        .map_err(|error| ConfigErrors(vec![error]))?
        .0;
    if files.is_empty() && !options.allow_empty {
        let which = if options.every_file {
            "no file"
        } else {
            "no .yaml or .yml file"
        };
        return Err(ConfigErrors(vec![ConfigError {
            file: dir.to_path_buf(),
            line: None,
            path: String::new(),
            reason: format!(
                "{which}: every request would be unlimited (--config-allow-empty if that is intended)"
            ),
        }]));
    }
    let parsed = files.into_iter().map(|path| {
        let domain = std::fs::read_to_string(&path)
            .map_err(|error| io_error(&path, &error))
            .and_then(|text| file::parse(&path, &text));
        (path, domain)
    });
    combine(parsed, options.merge_domains)
}

/// The rule set of parsed sources (files, or xDS resources by name), one domain each: a second
/// source of a domain is an error unless `merge`, every error is kept.
fn combine(
    parsed: impl IntoIterator<Item = (PathBuf, Result<DomainRules, ConfigError>)>,
    merge: bool,
) -> Result<RuleSet, ConfigErrors> {
    let mut errors = Vec::new();
    let mut domains: Vec<(PathBuf, DomainRules)> = Vec::new();
    for (path, domain) in parsed {
        let domain = match domain {
            Ok(domain) => domain,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        let Some((first, known)) = domains.iter_mut().find(|(_, d)| d.name == domain.name) else {
            domains.push((path, domain));
            continue;
        };
        let name = format!("domain {:?}", domain.name);
        if !merge {
            let reason = format!("duplicate domain, already defined in {}", first.display());
            errors.push(ConfigError::at(&path, 1, name, reason));
        } else if let Err((key, value)) = known.root.merge(domain.root) {
            let node = if value.is_empty() {
                key
            } else {
                format!("{key}={value}")
            };
            let reason = format!(
                "descriptor {node} is also in {} (merged domains must not repeat a descriptor)",
                first.display()
            );
            errors.push(ConfigError::at(&path, 1, name, reason));
        }
    }
    if errors.is_empty() {
        Ok(RuleSet::new(domains.into_iter().map(|(_, domain)| domain)))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The files under `dir` that loading leaves out because their names do not end in `.yaml` or
/// `.yml` (dot entries, such as a ConfigMap's `..data`, are left out silently: they are
/// copies). For `tollgate check` and the start-up log, so that a rule file named without the
/// extension is not skipped unnoticed.
pub fn skipped_files(dir: &Path, options: LoadOptions) -> Vec<PathBuf> {
    listing(dir, options)
        .map(|(_, skipped)| skipped)
        .unwrap_or_default()
}

/// The config files under `dir`, recursively, and the files left out, each sorted (so that
/// errors come in a stable order); or `dir` itself when it names a file.
fn listing(dir: &Path, options: LoadOptions) -> Result<(Vec<PathBuf>, Vec<PathBuf>), ConfigError> {
    if std::fs::metadata(dir).is_ok_and(|metadata| metadata.is_file()) {
        return Ok((vec![dir.to_path_buf()], Vec::new()));
    }
    let (mut files, mut skipped) = (Vec::new(), Vec::new());
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let listing = std::fs::read_dir(&current).map_err(|error| io_error(&current, &error))?;
        for entry in listing {
            let entry = entry.map_err(|error| io_error(&current, &error))?;
            let path = entry.path();
            if !options.dotfiles && entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            // `metadata` follows symbolic links, as ConfigMap volumes need.
            let metadata = std::fs::metadata(&path).map_err(|error| io_error(&path, &error))?;
            if metadata.is_dir() {
                pending.push(path);
            } else if options.every_file || is_yaml(&path) {
                files.push(path);
            } else {
                skipped.push(path);
            }
        }
    }
    files.sort();
    skipped.sort();
    Ok((files, skipped))
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|ext| ext.to_str()),
        Some("yaml" | "yml")
    )
}

fn io_error(path: &Path, error: &std::io::Error) -> ConfigError {
    ConfigError {
        file: path.to_path_buf(),
        line: None,
        path: String::new(),
        reason: format!("cannot read: {error}"),
    }
}
