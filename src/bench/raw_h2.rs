//! HTTP/2 frames written by hand, for a client that writes and never reads, which no HTTP/2
//! library is (`hostile.rs`, and the tests of what such a client can hold).

/// The one method the frames call.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const INITIAL_WINDOW_SIZE: u16 = 0x4;
const LARGEST_WINDOW: u32 = (1 << 31) - 1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes();
    let mut out = vec![length[1], length[2], length[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The client's preface, with the largest windows, so that nothing but the socket holds
/// the server's answers back.
pub fn preface() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    let mut settings = INITIAL_WINDOW_SIZE.to_be_bytes().to_vec();
    settings.extend_from_slice(&LARGEST_WINDOW.to_be_bytes());
    out.extend(frame(SETTINGS, 0, 0, &settings));
    let increment = LARGEST_WINDOW - 65_535;
    out.extend(frame(WINDOW_UPDATE, 0, 0, &increment.to_be_bytes()));
    out
}

/// One whole unary call on stream `id`: its headers (HPACK literals) and `message`.
pub fn request(id: u32, message: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "tollgate"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        // A literal header field without indexing, new name; lengths under 127.
        block.push(0x00);
        for text in [name, value] {
            block.push(u8::try_from(text.len()).unwrap_or(127).min(127));
            block.extend_from_slice(text.as_bytes());
        }
    }
    let mut out = frame(HEADERS, END_HEADERS, id, &block);
    out.extend(frame(DATA, END_STREAM, id, message));
    out
}
