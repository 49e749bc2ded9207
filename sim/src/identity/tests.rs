use ipool_testkit::access::Attributes;

use super::*;

#[test]
fn a_daemon_may_not_delete_another_nodes_block_and_the_cronjob_may() {
    let access = deployed();
    let q = Default::default();
    let a = Attributes::of("DELETE", "/apis/ipool.io/v1/ipblocks/10-70-0-0-28", &q)
        .expect("a resource");
    let block = serde_json::json!({
        "apiVersion": "ipool.io/v1", "kind": "IPBlock",
        "metadata": {"name": "10-70-0-0-28", "labels": {"ipool.io/node": "n1"}},
        "spec": {"node": "n1", "pool": "p", "cidr": "10.70.0.0/28"},
    });
    let n0 = UserInfo::pod_on_node(NAMESPACE, "ipool", "ipool-n0", "n0");
    access
        .authorize(&n0, &a)
        .expect("RBAC lets ipoold delete blocks");
    let e = access.admit(&n0, &a, None, Some(&block)).unwrap_err();
    assert_eq!(e.status, 422, "{:?}", e.body);
    let n1 = UserInfo::pod_on_node(NAMESPACE, "ipool", "ipool-n1", "n1");
    access.admit(&n1, &a, None, Some(&block)).expect("its own");
    let cron = UserInfo::service_account(NAMESPACE, "ipool-operator");
    access.authorize(&cron, &a).expect("the CronJob releases");
    access
        .admit(&cron, &a, None, Some(&block))
        .expect("any node's");
}
