//! Compiles ipool/v1/*.proto with protox (pure Rust: no system `protoc` needed) and generates
//! tonic/prost code. The file descriptor set is also written to OUT_DIR for server reflection.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["ipool/v1/cni.proto", "ipool/v1/ops.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out.join("ipool_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
