//! Calls whose request is encoded once, before the run: the load generator then spends no
//! CPU encoding while it shares the machine with the server.

use prost::Message as _;
use prost::bytes::{Buf as _, BufMut as _, Bytes};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Status, client::Grpc};

use crate::pb;

/// A request as its protobuf encoding.
pub(super) fn encoded(request: &pb::RateLimitRequest) -> Bytes {
    Bytes::from(request.encode_to_vec())
}

/// A codec for calls whose request is already encoded: the bytes go out as they are, and the
/// answer is decoded as usual. Small buffers: an RLS response is tens of bytes, and tonic's
/// default reserves 8 KiB per call.
#[derive(Clone, Copy)]
struct Encoded;

impl Codec for Encoded {
    type Encode = Bytes;
    type Decode = pb::RateLimitResponse;
    type Encoder = Encoded;
    type Decoder = Encoded;

    fn encoder(&mut self) -> Self::Encoder {
        Encoded
    }

    fn decoder(&mut self) -> Self::Decoder {
        Encoded
    }
}

impl Encoder for Encoded {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(512, 32 * 1024)
    }
}

impl Decoder for Encoded {
    type Item = pb::RateLimitResponse;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let response = pb::RateLimitResponse::decode(src.copy_to_bytes(src.remaining()))
            .map_err(|error| Status::internal(format!("undecodable response: {error}")))?;
        Ok(Some(response))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(512, 32 * 1024)
    }
}

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// One call with an encoded request; the answer's overall code.
pub(super) async fn call(grpc: &mut Grpc<Channel>, request: Bytes) -> Result<i32, Status> {
    grpc.ready()
        .await
        .map_err(|error| Status::unavailable(format!("connection not ready: {error}")))?;
    let path = PathAndQuery::from_static(SHOULD_RATE_LIMIT);
    let response = grpc
        .unary(tonic::Request::new(request), path, Encoded)
        .await?;
    Ok(response.into_inner().overall_code)
}
