//! Logging: a `tracing` subscriber writing text to stderr, filtered by `RUST_LOG` when set,
//! else by `--log-level`.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Fails on an invalid filter directive.
pub fn init(log_level: &str) -> Result<(), tracing_subscriber::filter::ParseError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::try_new(log_level)?,
    };
    // A second init (tests) keeps the first subscriber; that is fine.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    Ok(())
}
