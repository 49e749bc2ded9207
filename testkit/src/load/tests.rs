use super::*;

#[test]
fn requests_are_sorted_by_what_they_cost() {
    let lines: Vec<String> = [
        "GET /apis/ipool.io/v1/ipblocks?labelSelector=x&watch=true",
        "GET /apis/ipool.io/v1/ipblocks?labelSelector=x",
        "GET /apis/ipool.io/v1/ippools/p",
        "PUT /apis/coordination.k8s.io/v1/namespaces/ipool-system/leases/ipool-n1",
        "DELETE /apis/ipool.io/v1/ipblocks/10-0-0-0-26",
        "GET /api/v1/namespaces/default/pods",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let l = Load::of_requests(&lines, 7);
    let want = Load {
        requests: 6,
        writes: 2,
        renewals: 1,
        reads: 2,
        gets: 1,
        watches: 1,
        bytes: 7,
    };
    assert_eq!(l, want);
}

#[test]
fn etcd_counts_come_from_its_grpc_counters() {
    let body = "# HELP x\n\
        grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 5\n\
        grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 2\n\
        grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 4\n\
        grpc_server_msg_received_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 2\n\
        etcd_network_client_grpc_sent_bytes_total 1234\n";
    let l = Load::of_etcd_metrics(body);
    assert_eq!((l.reads, l.writes, l.renewals, l.watches), (5, 2, 4, 2));
    assert_eq!((l.requests, l.bytes), (13, 1234));
}

/// A transaction that changes no key (a read sent as one, with the node's witness) is a
/// read: etcd's revision did not move.
#[test]
fn etcd_transactions_that_change_nothing_are_reads() {
    let at = |txns: u64, revision: u64| {
        Load::of_etcd_metrics(&format!(
            "grpc_server_msg_received_total{{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}} 5\n\
             grpc_server_msg_received_total{{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}} {txns}\n\
             etcd_debugging_mvcc_current_revision {revision}\n"
        ))
    };
    // Ten transactions, four of them writes (the revision from 1 to 5); then six more
    // that read only.
    let (a, b) = (at(10, 5), at(16, 5));
    assert_eq!((a.writes, a.reads), (4, 11));
    assert_eq!((b.writes - a.writes, b.reads - a.reads), (0, 6));
    assert_eq!(b.requests - a.requests, 6);
}
