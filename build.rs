//! Compiles tollgate's own RLS v3 proto subset (proto/) into Rust. protox parses the files in
//! pure Rust, so building tollgate needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(files)?;
    Ok(())
}
