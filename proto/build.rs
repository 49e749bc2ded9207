//! Compiles the protos with protox (pure Rust: no system `protoc` needed) and generates
//! tonic/prost code:
//! - `ipool/v1/*.proto`: ipool's API, servers and clients; the file descriptor set is also
//!   written to OUT_DIR for server reflection;
//! - `etcd/*.proto`: the part of etcd's v3 API that cluster mode calls, clients only;
//! - `cri/runtime.proto`: the part of the Kubernetes CRI (runtime.v1) ipoold asks the node's
//!   runtime, client and server (the tests' fake runtime).
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["ipool/v1/cni.proto", "ipool/v1/ops.proto"];
    let etcd = ["etcd/kv.proto", "etcd/rpc.proto"];
    let cri = ["cri/runtime.proto"];
    for p in protos.iter().chain(&etcd).chain(&cri) {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out.join("ipool_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure().compile_fds(fds)?;

    let etcd_fds = protox::compile(etcd, ["."])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(etcd_fds)?;
    tonic_prost_build::configure().compile_fds(protox::compile(cri, ["."])?)?;
    Ok(())
}
