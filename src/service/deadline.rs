//! A client's deadline, from the `grpc-timeout` header gRPC sends it in.

use std::time::Duration;

use tokio::time::Instant;
use tonic::codegen::http;

/// When a call's answer stops being of use: its client's gRPC timeout after it reached the
/// handler. The client has given up by then, and any hits decided would count for an answer
/// nobody reads. (An instant alone: every request's future carries it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
}

impl Deadline {
    /// The deadline of a call arriving now with `metadata`'s `grpc-timeout`, if it sent one
    /// and it falls within the clock's range (a timeout of millions of years is none).
    pub fn of(metadata: &tonic::metadata::MetadataMap) -> Option<Self> {
        let timeout = grpc_timeout(metadata)?;
        Some(Self {
            at: Instant::now().checked_add(timeout)?,
        })
    }

    pub fn passed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// What remains of it.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// The header a gRPC client's deadline comes in, by a name parsed once rather than per call.
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// The `grpc-timeout` a client sent (`<digits><unit>`, units H M S m u n), if any.
pub fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let headers: &http::HeaderMap = metadata.as_ref();
    let text = headers.get(&GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = text.split_at_checked(text.len().checked_sub(1)?)?;
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_deadline_is_read_from_grpc_timeout() {
        let deadline = |value: Option<&str>| {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert("x-other", "1".parse().unwrap());
            if let Some(value) = value {
                metadata.insert("grpc-timeout", value.parse().unwrap());
            }
            grpc_timeout(&metadata)
        };
        assert_eq!(deadline(Some("250m")), Some(Duration::from_millis(250)));
        assert_eq!(deadline(Some("2S")), Some(Duration::from_secs(2)));
        assert_eq!(deadline(Some("1H")), Some(Duration::from_secs(3600)));
        assert_eq!(deadline(Some("900u")), Some(Duration::from_micros(900)));
        assert_eq!(deadline(None), None);
        assert_eq!(deadline(Some("bad")), None);
        assert_eq!(deadline(Some("5x")), None);
    }

    #[test]
    fn a_timeout_past_the_clock_s_range_is_no_deadline() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("grpc-timeout", "18446744073709551615H".parse().unwrap());
        assert_eq!(Deadline::of(&metadata), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_the_timeout_after_the_call_arrived() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("grpc-timeout", "20m".parse().unwrap());
        let arrived = Instant::now();
        assert_eq!(
            Deadline::of(&metadata),
            Some(Deadline {
                at: arrived + Duration::from_millis(20)
            })
        );
    }
}
