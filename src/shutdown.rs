//! The production shutdown trigger: the first SIGTERM or SIGINT.

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
