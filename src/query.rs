//! `tollgate query`: one ShouldRateLimit call, printed for a person.

use std::fmt::Write as _;

use std::time::Duration;

use crate::client::{ClientArgs, ClientError};
use crate::pb::{self, rate_limit_descriptor as desc, rate_limit_response as rls};

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("--descriptor {0:?}: expected key=value[,key=value...]")]
    BadDescriptor(String),
    #[error(transparent)]
    Connect(#[from] ClientError),
    #[error("call failed: {}: {}", .0.code(), .0.message())]
    Call(#[from] tonic::Status),
}

/// How long a one-shot command waits to connect, and for its answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Parses `key=value[,key=value...]` into a descriptor.
pub fn parse_descriptor(text: &str) -> Result<pb::RateLimitDescriptor, QueryError> {
    let entries = text
        .split(',')
        .map(|pair| {
            pair.split_once('=')
                .map(|(key, value)| desc::Entry {
                    key: key.to_owned(),
                    value: value.to_owned(),
                })
                .ok_or_else(|| QueryError::BadDescriptor(text.to_owned()))
        })
        .collect::<Result<_, _>>()?;
    Ok(pb::RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

/// Sends the request and returns the response.
pub async fn call(
    server: &ClientArgs,
    request: pb::RateLimitRequest,
) -> Result<pb::RateLimitResponse, QueryError> {
    let mut client = pb::RateLimitServiceClient::new(server.connect(TIMEOUT).await?);
    Ok(client.should_rate_limit(request).await?.into_inner())
}

/// One line per descriptor, then the overall code.
pub fn render(request: &pb::RateLimitRequest, response: &pb::RateLimitResponse) -> String {
    let mut out = String::new();
    for (descriptor, status) in request.descriptors.iter().zip(&response.statuses) {
        let entries: Vec<String> = descriptor
            .entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        let _ = write!(out, "{}: {}", entries.join(","), code(status.code));
        match &status.current_limit {
            Some(limit) => {
                let unit = rls::rate_limit::Unit::try_from(limit.unit)
                    .map_or("UNKNOWN", |u| u.as_str_name());
                let reset = status
                    .duration_until_reset
                    .as_ref()
                    .map_or(0, |d| d.seconds);
                let _ = write!(
                    out,
                    " limit={}/{} remaining={} reset={reset}s",
                    limit.requests_per_unit, unit, status.limit_remaining
                );
                if !limit.name.is_empty() {
                    let _ = write!(out, " name={}", limit.name);
                }
            }
            None if status.limit_remaining == u32::MAX => out.push_str(" unlimited"),
            None => out.push_str(" no limit"),
        }
        out.push('\n');
    }
    let _ = writeln!(out, "overall: {}", code(response.overall_code));
    out
}

fn code(code: i32) -> &'static str {
    rls::Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name())
}

/// `tollgate health`: whether the server reports SERVING for `service` on gRPC health, for
/// container health checks (the runtime image has no shell or curl).
pub async fn serving(server: &ClientArgs, service: String) -> Result<bool, QueryError> {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let channel = server.connect(Duration::from_secs(2)).await?;
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest { service })
        .await?
        .into_inner()
        .status;
    Ok(status == ServingStatus::Serving as i32)
}

/// Why `tollgate reset` failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error("--admin-addr {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("{status}: {body}")]
    Refused { status: u16, body: String },
}

/// `tollgate reset`: `POST /reset` on the admin listener at `admin` (`host:port`), with the
/// request as `/json` takes it; the server's answer.
pub async fn reset(
    admin: &str,
    token: Option<&str>,
    request: &pb::RateLimitRequest,
) -> Result<String, ResetError> {
    use hyper::body::Body as _;
    let failed = |reason: String| ResetError::Connect {
        addr: admin.to_owned(),
        reason,
    };
    let host = admin.trim_start_matches("http://").trim_end_matches('/');
    let stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|error| failed(error.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|error| failed(crate::client::causes(&error)))?;
    tokio::spawn(connection);
    let mut call = hyper::Request::post("/reset")
        .header("host", host)
        .header("content-type", "application/json");
    if let Some(token) = token {
        call = call.header("authorization", format!("Bearer {token}"));
    }
    let call = call
        .body(axum::body::Body::from(crate::admin::json::encode_request(
            request,
        )))
        .map_err(|error| failed(error.to_string()))?;
    let response = sender
        .send_request(call)
        .await
        .map_err(|error| failed(crate::client::causes(&error)))?;
    let status = response.status().as_u16();
    let size = response.body().size_hint().upper().unwrap_or(64 * 1024);
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), size as usize)
        .await
        .map_err(|error| failed(error.to_string()))?;
    let body = String::from_utf8_lossy(&body).trim_end().to_owned();
    if status == 200 {
        Ok(body)
    } else {
        Err(ResetError::Refused { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_parse_from_pairs() {
        let descriptor = parse_descriptor("user=alice,path=/a=b").unwrap();
        assert_eq!(descriptor.entries.len(), 2);
        assert_eq!(descriptor.entries[1].value, "/a=b");
        assert!(parse_descriptor("user").is_err());
    }
}
