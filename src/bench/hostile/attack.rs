//! An attack run: its connections, each opened again when the server closes it (with
//! `--reconnect`), until its duration has passed, and what they saw.

use std::sync::{Arc, PoisonError};

use tokio::time::Instant;

use super::calls::{refunds, rlqs_buckets};
use super::sockets::{idle, idle_h2, never_read, slowloris};
use super::streams::streams;
use super::{Attack, HostileArgs, HostileReport, Shared, tally};

pub async fn run(args: &HostileArgs) -> anyhow::Result<HostileReport> {
    let report: Shared = Arc::default();
    let until = Instant::now() + args.duration;
    let mut connections = tokio::task::JoinSet::new();
    for _ in 0..args.connections {
        let (args, report) = (args.clone(), Arc::clone(&report));
        connections.spawn(async move { connection(&args, &report, until).await });
    }
    while let Some(done) = connections.join_next().await {
        if let Ok(Err(error)) = done {
            tracing::debug!(%error, "a hostile connection ended");
        }
    }
    let report = std::mem::take(&mut *report.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(report)
}

/// One connection of the attack, opened again when the server closes it, until `until`.
async fn connection(args: &HostileArgs, report: &Shared, until: Instant) -> anyhow::Result<()> {
    while Instant::now() < until {
        let socket = if args.target.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        if args.attack == Attack::NeverRead {
            // The least the kernel allows: what it would take in for a client that does
            // not read fills at once, as it would for one whose buffers had filled.
            socket.set_recv_buffer_size(4_096)?;
        }
        let tcp = socket.connect(args.target).await?;
        tally(report, |r| r.connections_opened += 1);
        let held = match args.attack {
            Attack::Idle => idle(tcp, until).await,
            Attack::IdleH2 => idle_h2(tcp, until).await,
            Attack::Slowloris => slowloris(tcp, until).await,
            Attack::NeverRead => never_read(tcp, args, until).await,
            Attack::RlqsBuckets => rlqs_buckets(args, report, until).await,
            Attack::Refunds => refunds(args, report, until).await,
            Attack::SlowBody | Attack::HeadersOnly | Attack::ZeroWindow => {
                streams(args, tcp, report, until).await
            }
        };
        if held.is_err() || Instant::now() < until {
            tally(report, |r| r.connections_closed += 1);
        }
        if !args.reconnect {
            break;
        }
    }
    Ok(())
}
