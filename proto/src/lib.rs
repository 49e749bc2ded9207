//! Generated code of the `ipool.v1` gRPC API (see `ipool/v1/*.proto`), and of the part of
//! etcd's v3 API that cluster mode calls (see `etcd/*.proto`; clients only), and of the CRI
//! calls ipoold makes to the node's container runtime (`cri/runtime.proto`).
//!
//! # Layout
//! - [`names`]: the CNI spec's rules for the names that make up an attachment key, shared by the
//!   plugin (which checks before it calls) and the daemon (which checks what it is sent).
#![allow(clippy::all, missing_docs)]

pub mod names;

pub mod v1 {
    tonic::include_proto!("ipool.v1");

    /// Encoded `FileDescriptorSet` of `ipool.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/ipool_v1_descriptor.bin"));
}

/// etcd's v3 API, the part cluster mode calls: `etcdserverpb` (KV, Lease) and `mvccpb`.
pub mod etcd {
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
}

/// The part of the Kubernetes CRI (`runtime.v1`) ipoold asks the node's runtime (see
/// `cri/runtime.proto`).
pub mod cri {
    tonic::include_proto!("runtime.v1");
}
