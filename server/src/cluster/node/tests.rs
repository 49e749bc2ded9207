//! The node's hold on its name after a store reset.

use std::time::Duration;

use tokio::time::Instant;

/// A node that sees its store reset holds its name in doubt: it hands nothing out until a
/// renewal sent after the reset succeeded (one sent before says nothing of the restored
/// store), and serves then in a new epoch. It served under its name until its next
/// renewal, and with a second daemon under the name whose key the restored etcd had, both
/// served one block (`reset-name-trusted`, found by the simulation, seed 500 158).
#[test]
fn a_reset_holds_the_name_in_doubt_until_a_renewal_sent_after_it() {
    let settings: crate::config::cluster::ClusterSettings =
        toml::from_str("etcd_endpoints = [\"http://127.0.0.1:1\"]\nheartbeat_ttl_secs = 10\n")
            .expect("settings");
    let n = super::ClusterNode::new(settings, "n1".into(), "inst-1".into(), Default::default())
        .expect("node");
    n.pretend_renewed(Duration::ZERO);
    let epoch = n.serving().expect("serving");
    let before = Instant::now();
    std::thread::sleep(Duration::from_millis(5));
    n.resets_seen(1, Some("the cluster id changed".into()));
    let e = n.serving().expect_err("in doubt");
    assert!(e.why.contains("checked again"), "{}", e.why);
    n.renewed(before);
    assert!(
        n.serving().is_err(),
        "a renewal sent before the reset lifts nothing"
    );
    n.renewed(Instant::now());
    let now = n.serving().expect("renewed since");
    assert!(
        now > epoch,
        "a new epoch: the blocks are synced again first"
    );
    // The same count again is no new reset.
    n.resets_seen(1, None);
    assert!(n.serving().is_ok());
}
