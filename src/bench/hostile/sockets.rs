//! The attacks of one socket, not of calls: held silent, held open as HTTP/2 with PINGs, a
//! Slowloris request on the admin port, and requests written without reading an answer.

use std::time::Duration;

use prost::bytes::Bytes;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{HostileArgs, attack_request, grpc_message, pacing, raw};

/// Holds `tcp` without a byte until `until`; an error if the server closed it first.
pub(super) async fn idle(mut tcp: TcpStream, until: Instant) -> anyhow::Result<()> {
    let mut byte = [0u8; 1];
    tokio::select! {
        _ = tokio::io::AsyncReadExt::read(&mut tcp, &mut byte) => anyhow::bail!("closed by the server"),
        () = tokio::time::sleep_until(until) => Ok(()),
    }
}

/// How often `idle-h2` pings and `slowloris` writes a byte.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(5);

/// Holds an HTTP/2 connection over `tcp`, PINGing it, until `until`; an error if the server
/// closed it first.
pub(super) async fn idle_h2(tcp: TcpStream, until: Instant) -> anyhow::Result<()> {
    let (_client, mut connection) = h2::client::Builder::new()
        .handshake::<_, Bytes>(tcp)
        .await?;
    let mut pings = connection
        .ping_pong()
        .ok_or_else(|| anyhow::anyhow!("no ping handle"))?;
    let mut serving = tokio::spawn(connection);
    loop {
        tokio::select! {
            _ = &mut serving => anyhow::bail!("closed by the server"),
            () = tokio::time::sleep_until(until) => break,
            () = tokio::time::sleep(KEEP_ALIVE_EVERY) => {
                pings.ping(h2::Ping::opaque()).await?;
            }
        }
    }
    serving.abort();
    Ok(())
}

/// Writes an HTTP/1.1 request over `tcp` a byte every 5 s, never its end, until `until`; an
/// error if the server closed it first.
pub(super) async fn slowloris(mut tcp: TcpStream, until: Instant) -> anyhow::Result<()> {
    let request = b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\nX-Trickle: ";
    let mut sent = 0;
    loop {
        let byte = request.get(sent).copied().unwrap_or(b'a');
        tcp.write_all(&[byte]).await?;
        sent += 1;
        let mut answer = [0u8; 1];
        tokio::select! {
            _ = tokio::io::AsyncReadExt::read(&mut tcp, &mut answer) => anyhow::bail!("closed by the server"),
            () = tokio::time::sleep_until(until) => return Ok(()),
            () = tokio::time::sleep(KEEP_ALIVE_EVERY) => {}
        }
    }
}

/// Writes requests over `tcp` until `until` or until the server gives up on it.
pub(super) async fn never_read(
    mut tcp: TcpStream,
    args: &HostileArgs,
    until: Instant,
) -> anyhow::Result<()> {
    tcp.write_all(&raw::preface()).await?;
    let message = grpc_message(&attack_request(args));
    let mut stream_id: u32 = 1;
    let mut pace = pacing(args.rate);
    while Instant::now() < until {
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        let frames = raw::request(stream_id, &message);
        tokio::select! {
            written = tcp.write_all(&frames) => written?,
            () = tokio::time::sleep_until(until) => break,
        }
        stream_id = stream_id
            .checked_add(2)
            .ok_or_else(|| anyhow::anyhow!("stream ids used up"))?;
    }
    Ok(())
}
