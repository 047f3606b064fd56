//! The production shutdown trigger, the first SIGTERM or SIGINT, and how long a graceful
//! shutdown takes (`ShutdownOptions`, flags of `tollgate serve`).

use std::time::Duration;

/// How a graceful shutdown goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Shutdown")]
pub struct ShutdownOptions {
    /// Time health reports NOT_SERVING before the listeners close on shutdown.
    #[arg(long = "shutdown-delay", env = "TOLLGATE_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    pub delay: Duration,

    /// Longest wait for in-flight calls to finish on shutdown.
    #[arg(long = "drain-timeout", env = "TOLLGATE_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

impl Default for ShutdownOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

/// Resolves when SIGTERM or SIGINT arrives, and logs which one.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut terminate, mut interrupt) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
        _ => {
            // Without signal handlers the process can still be stopped by SIGKILL; never return
            // early, which would shut down a healthy server.
            tracing::error!("cannot install signal handlers; graceful shutdown is unavailable");
            return std::future::pending().await;
        }
    };
    let name = tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutting down");
}
