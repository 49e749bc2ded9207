//! Generated code of the `ipool.v1` gRPC API (see `ipool/v1/*.proto`).
#![allow(clippy::all, missing_docs)]

pub mod names;

pub mod v1 {
    tonic::include_proto!("ipool.v1");

    /// Encoded `FileDescriptorSet` of `ipool.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/ipool_v1_descriptor.bin"));
}
