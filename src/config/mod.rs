//! Loading the rules: every `*.yaml`/`*.yml` file under a directory, one domain per file, in
//! the envoyproxy/ratelimit format (plus tollgate's extensions). Loading is all-or-nothing: any
//! error in any file rejects the whole set, so a caller keeps whatever it had before.
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

use std::path::{Path, PathBuf};

use crate::rules::RuleSet;
pub use error::{ConfigError, ConfigErrors};

/// Loads and validates every config file under `dir` (or the one file `dir` names).
pub fn load_dir(dir: &Path) -> Result<RuleSet, ConfigErrors> {
    let files = config_files(dir).map_err(|error| ConfigErrors(vec![error]))?;
    let mut errors = Vec::new();
    let mut domains: Vec<(PathBuf, crate::rules::DomainRules)> = Vec::new();
    for path in files {
        let parsed = std::fs::read_to_string(&path)
            .map_err(|error| io_error(&path, &error))
            .and_then(|text| file::parse(&path, &text));
        match parsed {
            Ok(domain) => {
                if let Some((first, _)) = domains.iter().find(|(_, d)| d.name == domain.name) {
                    errors.push(ConfigError {
                        file: path.clone(),
                        line: Some(1),
                        path: format!("domain {:?}", domain.name),
                        reason: format!("duplicate domain, already defined in {}", first.display()),
                    });
                } else {
                    domains.push((path, domain));
                }
            }
            Err(error) => errors.push(error),
        }
    }
    if errors.is_empty() {
        Ok(RuleSet::new(domains.into_iter().map(|(_, domain)| domain)))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The config files under `dir`, recursively, sorted so that errors come in a stable order;
/// or `dir` itself when it names a file.
fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    Ok(listing(dir)?.0)
}

/// The files under `dir` that loading leaves out because their names do not end in `.yaml` or
/// `.yml` (dot entries, such as a ConfigMap's `..data`, are left out silently: they are
/// copies). For `tollgate check` and the start-up log, so that a rule file named without the
/// extension is not skipped unnoticed.
pub fn skipped_files(dir: &Path) -> Vec<PathBuf> {
    listing(dir).map(|(_, skipped)| skipped).unwrap_or_default()
}

/// The YAML files under `dir`, recursively, and the other files, each sorted.
fn listing(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), ConfigError> {
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
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            // `metadata` follows symbolic links, as ConfigMap volumes need.
            let metadata = std::fs::metadata(&path).map_err(|error| io_error(&path, &error))?;
            if metadata.is_dir() {
                pending.push(path);
            } else if is_yaml(&path) {
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
