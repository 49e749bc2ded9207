use super::*;
use crate::cluster::pin::Holder;

fn pin() -> Pin {
    Pin {
        pool: "p".into(),
        address: "10.0.0.5".parse().unwrap(),
        owner: PinOwner::VirtualMachine {
            namespace: "ns".into(),
            name: "vm".into(),
        },
        block: "10.0.0.0/26".parse().unwrap(),
        block_id: 3,
        set_aside: false,
        holders: vec![Holder {
            node: "n".into(),
            pod: "ns/virt-launcher-vm-x".into(),
            uid: "u".into(),
            since_ms: 1,
            instance: Some("vmi-1".into()),
        }],
    }
}

/// A real apiserver drops the fields a CRD's schema does not declare: every field of a
/// pin (and of its holders) is declared in deploy/crds/ippins.yaml.
#[test]
fn every_field_written_is_in_the_crd() {
    let crd = include_str!("../../../../../deploy/crds/ippins.yaml");
    let obj = new_pin(&pin());
    let spec = obj.data["spec"].as_object().unwrap();
    let holder = spec["holders"][0].as_object().unwrap();
    for field in spec.keys().chain(holder.keys()) {
        assert!(
            crd.lines().any(|l| l.trim_start() == format!("{field}:")),
            "{field} is not declared in deploy/crds/ippins.yaml"
        );
    }
}

#[test]
fn pins_round_trip_and_a_mislabelled_one_is_malformed() {
    let mut obj = new_pin(&pin());
    obj.metadata.resource_version = Some("7".into());
    let read = parse_pin(&obj).unwrap();
    assert_eq!((read.pin, read.version.as_str()), (pin(), "7"));
    assert!(owner_label(&pin().owner).len() == 16);
    let mut other = obj.clone();
    other.metadata.name = Some("10-0-0-6".into());
    assert!(parse_pin(&other)
        .unwrap_err()
        .to_string()
        .contains("not the address"));
    let mut other = obj;
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(OWNER_LABEL.into(), "0".into());
    assert!(parse_pin(&other)
        .unwrap_err()
        .to_string()
        .contains(OWNER_LABEL));
}
