//! Compiles tollgate's own RLS v3 proto subset (proto/) into Rust, and keeps the encoded file
//! descriptors for gRPC reflection. protox parses the files in pure Rust, so building tollgate
//! needs no `protoc` on the machine.

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("tollgate_descriptor.bin"), files.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(files)?;
    Ok(())
}
