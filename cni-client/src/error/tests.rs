use super::*;

#[test]
fn every_grpc_code_maps_on_purpose() {
    use tonic::Code;
    for (code, cni) in [
        (Code::InvalidArgument, 7),
        (Code::NotFound, 3),
        (Code::FailedPrecondition, 102),
        (Code::ResourceExhausted, 100),
        (Code::Unavailable, 11),
        (Code::DeadlineExceeded, 11),
        (Code::Internal, 101),
        (Code::PermissionDenied, 103),
        (Code::AlreadyExists, 104),
        (Code::Unknown, 101),
    ] {
        assert_eq!(
            CniError::from_grpc(code as i32, "x".into()).code(),
            cni,
            "{code:?}"
        );
    }
    // A code from a newer gRPC is the daemon's failure, not a panic.
    assert_eq!(CniError::from_grpc(99, "x".into()).code(), 101);
}

#[test]
fn json_shape() {
    let v: serde_json::Value = serde_json::from_str(
        &CniError::InvalidEnv("CNI_IFNAME is not set".into())
            .with_version("0.4.0")
            .to_json(),
    )
    .expect("json");
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["code"], 4);
    assert_eq!(v["msg"], "invalid environment variables");
    assert_eq!(v["details"], "CNI_IFNAME is not set");
}
