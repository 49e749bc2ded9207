use std::net::IpAddr;

use crate::check::{Checker, StoreBlock};

const VM: &str = "VirtualMachine/sim/vm0";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// A launcher of VM `VM`'s instance `instance` on `node`, answered with 10.0.0.5 (pinned in
/// n1's block, hosted wherever it runs).
fn launcher(c: &mut Checker, node: &str, container: &str, instance: &str) -> Result<(), String> {
    let blocks: [StoreBlock; 1] = [(
        "10.0.0.0/28".parse().expect("a CIDR"),
        "n1".into(),
        "p".into(),
    )];
    c.added(
        0,
        node,
        container,
        vec![ip("10.0.0.5")],
        10,
        &blocks,
        |_| None,
        None,
        Some((VM.into(), Some(instance.into()))),
        &[ip("10.0.0.5")],
        false,
    )
}

#[test]
fn two_launchers_of_one_instance_share_its_address_and_of_two_do_not() {
    let mut c = Checker::default();
    launcher(&mut c, "n1", "c1", "vmi-vm0").expect("the first launcher");
    launcher(&mut c, "n2", "c2", "vmi-vm0").expect("its migration's target");
    let e = launcher(&mut c, "n3", "c3", "vmi-vm0-1")
        .expect_err("an instance made again under the VM's name while the old one runs");
    assert!(e.contains("10.0.0.5 handed out to c3"), "{e}");
    c.deleting("c1");
    c.deleting("c2");
    launcher(&mut c, "n3", "c3", "vmi-vm0-1").expect("once the old launchers are gone");
}
