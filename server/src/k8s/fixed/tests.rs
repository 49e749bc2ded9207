use super::*;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn sts_pod(name: &str, fixed: &str) -> Pod {
    pod(json!({"metadata": {"namespace": "db", "name": name,
        "annotations": {FIXED: fixed},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1", "controller": true}]}}))
}

#[test]
fn a_statefulset_pod_is_keyed_by_its_ordinal_and_a_launcher_pod_by_its_vm() {
    let f = fixed(&sts_pod("web-3", "true"), "p").unwrap().unwrap();
    assert_eq!(f.owner.to_string(), "StatefulSet/db/web/3");
    assert!(f.covers("any"));
    let f = fixed(&sts_pod("web-0", " macvlan , side "), "p")
        .unwrap()
        .unwrap();
    assert_eq!(f.networks, Some(vec!["macvlan".into(), "side".into()]));
    assert!(f.covers("side") && !f.covers("pods"));
    assert_eq!(fixed(&sts_pod("web-0", "false"), "p"), Ok(None));
    let vmi = json!([{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "name": "a", "uid": "i1", "controller": true}]);
    let vm = pod(
        json!({"metadata": {"namespace": "vms", "name": "virt-launcher-a-x1",
        "annotations": {FIXED: "true"}, "labels": {VM_LABEL: "a"}, "ownerReferences": vmi}}),
    );
    let f = fixed(&vm, "p").unwrap().unwrap();
    assert_eq!(f.owner.to_string(), "VirtualMachine/vms/a");
    // The label alone (any pod may carry it) does not make a launcher pod.
    let spoof = pod(json!({"metadata": {"namespace": "vms", "name": "x",
        "annotations": {FIXED: "true"}, "labels": {VM_LABEL: "a"}}}));
    assert!(fixed(&spoof, "p").is_err());
    let none = pod(json!({"metadata": {"namespace": "vms", "name": "x"}}));
    assert_eq!(fixed(&none, "p"), Ok(None));
}

/// A launcher's instance is its controller's uid, a target's migration KubeVirt's label;
/// a migration is under way while its object, found by that uid, names the VM and is not
/// over.
#[test]
fn a_migration_is_the_vms_own_and_not_over() {
    let vmi = json!([{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "name": "a", "uid": "i1", "controller": true}]);
    let launcher = pod(
        json!({"metadata": {"namespace": "vms", "name": "virt-launcher-a-x1",
        "annotations": {FIXED: "true"}, "labels": {VM_LABEL: "a", MIGRATION_LABEL: "m1"},
        "ownerReferences": vmi}}),
    );
    let f = fixed(&launcher, "p").unwrap().unwrap();
    assert_eq!(
        (f.instance.as_deref(), f.migration.as_deref()),
        (Some("i1"), Some("m1"))
    );
    let sts = fixed(&sts_pod("web-0", "true"), "p").unwrap().unwrap();
    assert_eq!((sts.instance, sts.migration), (None, None));
    let obj = |uid: &str, vmi: &str, phase: &str| -> kube::api::DynamicObject {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration",
            "metadata": {"namespace": "vms", "name": "mig", "uid": uid},
            "spec": {"vmiName": vmi}, "status": {"phase": phase}}))
        .unwrap()
    };
    assert!(under_way(&obj("m1", "a", "Scheduling"), "m1", "a"));
    assert!(under_way(&obj("m1", "a", ""), "m1", "a"), "no phase yet");
    assert!(
        !under_way(&obj("m2", "a", "Running"), "m1", "a"),
        "another migration"
    );
    assert!(
        !under_way(&obj("m1", "b", "Running"), "m1", "a"),
        "another VM's"
    );
    assert!(!under_way(&obj("m1", "a", "Succeeded"), "m1", "a"));
    assert!(!under_way(&obj("m1", "a", "Failed"), "m1", "a"));
}

#[test]
fn ips_by_ordinal_gives_each_ordinal_its_address_and_names_what_is_wrong() {
    let with = |name: &str, list: &str| {
        let mut p = sts_pod(name, "true");
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(IPS_BY_ORDINAL.into(), list.into());
        fixed(&p, "pod db/x")
    };
    let f = with("web-1", "10.0.0.240, 10.0.0.241,10.0.0.242").unwrap();
    assert_eq!(f.unwrap().address, Some("10.0.0.241".parse().unwrap()));
    assert_eq!(
        fixed(&sts_pod("web-1", "true"), "p")
            .unwrap()
            .unwrap()
            .address,
        None
    );
    let e = with("web-3", "10.0.0.240,10.0.0.241").unwrap_err();
    assert!(
        e.0.contains("none for ordinal 3") && e.0.contains("pod db/x"),
        "{e}"
    );
    let e = with("web-0", "10.0.0.240,ten").unwrap_err();
    assert!(e.0.contains("\"ten\" is not an IP address"), "{e}");
    let e = with("web-0", "10.0.0.240,10.0.0.240").unwrap_err();
    assert!(e.0.contains("listed twice"), "{e}");
    let vmi = json!([{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "name": "a", "uid": "i1", "controller": true}]);
    let vm = pod(
        json!({"metadata": {"namespace": "vms", "name": "virt-launcher-a-x1",
        "annotations": {FIXED: "true", IPS_BY_ORDINAL: "10.0.0.9"},
        "labels": {VM_LABEL: "a"}, "ownerReferences": vmi}}),
    );
    let e = fixed(&vm, "p").unwrap_err();
    assert!(e.0.contains("for a StatefulSet's pods"), "{e}");
}

#[test]
fn a_bad_value_or_a_pod_of_neither_kind_is_an_error_naming_it() {
    let e = fixed(&sts_pod("web-0", "yes please"), "pod db/web-0").unwrap_err();
    assert!(
        e.0.contains("pod db/web-0") && e.0.contains("yes please"),
        "{e}"
    );
    let e = fixed(&sts_pod("web-0", ","), "p").unwrap_err();
    assert!(e.0.contains("names no network"), "{e}");
    let e = fixed(&sts_pod("other-0", "true"), "p").unwrap_err();
    assert!(e.0.contains("StatefulSet \"web\""), "{e}");
    let lone =
        pod(json!({"metadata": {"namespace": "a", "name": "x", "annotations": {FIXED: "true"}}}));
    let e = fixed(&lone, "p").unwrap_err();
    assert!(e.0.contains("neither"), "{e}");
}
