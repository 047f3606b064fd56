//! Compiles tollgate's own proto subsets (proto/) into Rust: RLS v3, RLQS, and the xDS
//! discovery stream with the rate limit configuration resource it carries; and keeps the encoded file
//! descriptors for gRPC reflection. protox parses the files in pure Rust, so building tollgate
//! needs no `protoc` on the machine.

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(
        [
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/service/rate_limit_quota/v3/rlqs.proto",
            "envoy/service/discovery/v3/discovery.proto",
            "ratelimit/config/ratelimit/v3/rls_conf.proto",
        ],
        ["proto"],
    )?;
    // Reflection describes what tollgate serves: RLS and RLQS, not the xDS stream it is a
    // client of.
    let served = protox::compile(
        [
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/service/rate_limit_quota/v3/rlqs.proto",
        ],
        ["proto"],
    )?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("tollgate_descriptor.bin"), served.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(files)?;
    Ok(())
}
