use super::*;

fn record(
    net: &str,
    cid: &str,
    ifname: &str,
    pod: (&str, &str, &str),
    netns: &str,
) -> AttachmentRecord {
    AttachmentRecord {
        key: AttachmentKey {
            network: net.into(),
            container_id: cid.into(),
            ifname: ifname.into(),
        },
        pod: Pod {
            namespace: pod.0.into(),
            name: pod.1.into(),
            uid: pod.2.into(),
        },
        netns: netns.into(),
        addresses: vec![
            "10.0.0.2".parse().expect("ip"),
            "fd00::2".parse().expect("ip"),
        ],
        created_at_ms: 42,
        k8s: None,
    }
}

#[test]
fn records_come_back_as_they_went_in() {
    let mut m = Attachments::default();
    let mut full = record(
        "n",
        "c1",
        "eth0",
        ("ns", "web-0", "uid-1"),
        "/proc/1/ns/net",
    );
    full.k8s = Some(PodMeta {
        owner: "StatefulSet/web".into(),
        sticky: true,
        sticky_ttl_secs: Some(5),
        fixed: Some("StatefulSet/ns/web/0".into()),
    });
    // Empty fields, and a pod field with a NUL in it: offsets, not separators.
    let odd = record("n", "c2", "net1", ("", "a\0b", ""), "");
    m.insert(&full);
    m.insert(&odd);
    assert_eq!(m.len(), 2);
    assert_eq!(m.get(&full.key).map(|a| a.to_record()), Some(full.clone()));
    assert_eq!(m.get(&odd.key).map(|a| a.to_record()), Some(odd.clone()));
    let a = m.get(&full.key).expect("present");
    assert_eq!(
        (
            a.network(),
            a.container_id(),
            a.ifname(),
            a.pod_namespace(),
            a.pod_name(),
            a.netns()
        ),
        ("n", "c1", "eth0", "ns", "web-0", "/proc/1/ns/net")
    );
    assert_eq!(a.cmp_key(&full.key), Ordering::Equal);
    assert_eq!(a.cmp_key(&odd.key), full.key.cmp(&odd.key));
    assert_eq!(
        m.holder_of("n", "fd00::2".parse().expect("ip"))
            .map(|a| a.network()),
        Some("n")
    );
    assert!(m
        .holder_of("other", "fd00::2".parse().expect("ip"))
        .is_none());
}

#[test]
fn insert_replaces_and_remove_forgets() {
    let mut m = Attachments::default();
    let a = record("n", "c1", "eth0", ("ns", "p", "u"), "/x");
    m.insert(&a);
    let mut b = a.clone();
    b.pod.name = "q".into();
    b.created_at_ms = 7;
    m.insert(&b);
    assert_eq!(m.len(), 1);
    assert_eq!(m.get(&a.key).map(|x| x.to_record()), Some(b));
    // Same network and container, other ifname: another attachment.
    let mut other = a.clone();
    other.key.ifname = "eth1".into();
    assert!(!m.contains_key(&other.key));
    assert!(m.remove(&a.key));
    assert!(!m.remove(&a.key));
    assert!(m.is_empty());
}
