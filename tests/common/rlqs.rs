//! Envoys with the rate_limit_quota filter (deploy/rlqs/envoy.yaml with its ports changed,
//! one tollgate endpoint or more) and an open-loop load generator that counts, second by
//! second, what each Envoy let through.

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::envoy::{loopback, run_envoy};
use super::*;

/// One Envoy: its ingress port and the process.
pub struct QuotaEnvoy {
    pub port: u16,
    pub admin: u16,
    _process: ChildGuard,
}

/// deploy/rlqs/envoy.yaml on free ports, reaching tollgate at `tollgates` (gRPC ports).
pub async fn start_quota_envoy(dir: &Path, tollgates: &[u16]) -> QuotaEnvoy {
    let (port, admin) = (free_port(), free_port());
    let mut text = std::fs::read_to_string("deploy/rlqs/envoy.yaml").unwrap();
    let endpoint = "              - endpoint:\n                  address:\n                    socket_address: {address: 127.0.0.1, port_value: 8081}\n";
    assert!(
        text.contains(endpoint),
        "deploy/rlqs/envoy.yaml's tollgate endpoint"
    );
    let endpoints: String = tollgates
        .iter()
        .map(|p| endpoint.replace("8081", &p.to_string()))
        .collect();
    text = text.replace(endpoint, &endpoints);
    for (old, new) in [(10000, port), (9901, admin)] {
        let from = format!("port_value: {old}}}");
        assert!(
            text.contains(&from),
            "deploy/rlqs/envoy.yaml uses port {old}"
        );
        text = text.replace(&from, &format!("port_value: {new}}}"));
    }
    let config = dir.join(format!("envoy-{port}.yaml"));
    std::fs::write(&config, text).unwrap();
    QuotaEnvoy {
        port,
        admin,
        _process: run_envoy(&config, admin).await,
    }
}

/// Requests admitted (200) and refused (429) in each second of an offered load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Second {
    pub admitted: u64,
    pub refused: u64,
}

/// Offers `rate` requests per second to `port` for `seconds`, open loop (each request is
/// sent at its scheduled time, over keep-alive connections, whatever the answers), with
/// `header` (`name: value`, or empty) on each; counts each second's answers by the second
/// they were due in.
pub async fn offer(port: u16, rate: u32, seconds: u64, header: &str) -> Vec<Second> {
    const CONNECTIONS: u32 = 4;
    let start = tokio::time::Instant::now();
    let request = format!("GET / HTTP/1.1\r\nHost: quota\r\n{header}\r\n\r\n")
        .replace("\r\n\r\n\r\n", "\r\n\r\n");
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|worker| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut tally = vec![Second::default(); seconds as usize];
                let mut connection: Option<BufReader<TcpStream>> = None;
                let total = u64::from(rate) * seconds;
                let mut index = u64::from(worker);
                while index < total {
                    let due = Duration::from_secs_f64(index as f64 / f64::from(rate));
                    tokio::time::sleep_until(start + due).await;
                    let status = send(&mut connection, port, &request).await;
                    let second = &mut tally[due.as_secs() as usize];
                    match status {
                        200 => second.admitted += 1,
                        429 => second.refused += 1,
                        other => panic!("envoy answered {other}"),
                    }
                    index += u64::from(CONNECTIONS);
                }
                tally
            })
        })
        .collect();
    let mut total = vec![Second::default(); seconds as usize];
    for worker in workers {
        for (sum, second) in total.iter_mut().zip(worker.await.unwrap()) {
            sum.admitted += second.admitted;
            sum.refused += second.refused;
        }
    }
    total
}

/// The status of one request with `headers`, on a connection of its own (not `Connection:
/// close`, which Envoy answers by waiting up to a second for the client to close first).
pub async fn status(port: u16, headers: &[(&str, &str)]) -> u16 {
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let request = format!("GET / HTTP/1.1\r\nHost: quota\r\n{extra}\r\n");
    send(&mut None, port, &request).await
}

/// One request on a kept-alive connection (made again if Envoy closed it); its status.
async fn send(connection: &mut Option<BufReader<TcpStream>>, port: u16, request: &str) -> u16 {
    for _ in 0..3 {
        if connection.is_none() {
            *connection = Some(BufReader::new(
                TcpStream::connect(loopback(port)).await.unwrap(),
            ));
        }
        let Some(stream) = connection.as_mut() else {
            continue;
        };
        match exchange(stream, request).await {
            Ok(status) => return status,
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
                ) =>
            {
                *connection = None;
            }
            Err(error) => panic!("request to envoy: {error}"),
        }
    }
    panic!("envoy kept closing connections");
}

async fn exchange(stream: &mut BufReader<TcpStream>, request: &str) -> std::io::Result<u16> {
    stream.get_mut().write_all(request.as_bytes()).await?;
    let mut line = String::new();
    if stream.read_line(&mut line).await? == 0 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0;
    loop {
        line.clear();
        stream.read_line(&mut line).await?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    Ok(status)
}

/// A metric's value in tollgate's exposition (the sum over its label sets matching `with`).
pub async fn metric(http: std::net::SocketAddr, name: &str, with: &str) -> f64 {
    let text = get(http, "/metrics", &[]).await.body;
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains(with))
        .filter(|line| line[name.len()..].starts_with([' ', '{']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
