//! Inputs a careless operator or a hostile caller sends: refused or named,
//! and nothing allocated is lost.

use super::*;

#[tokio::test]
async fn a_network_whose_subnet_overlaps_another_is_refused() {
    let rig = Rig::new("[[network]]\nname = \"pods\"\nranges = [[{ subnet = \"10.50.0.0/24\" }]]");
    rig.ipam
        .add(req("pods", "a", r#"{"type":"ipool"}"#))
        .await
        .expect("add");
    let e = rig
        .ipam
        .add(req("other", "b", r#"{"subnet":"10.50.0.0/25"}"#))
        .await
        .expect_err("overlap");
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(
        e.to_string()
            .contains("10.50.0.0/25 overlaps subnet 10.50.0.0/24 of network \"pods\""),
        "{e}"
    );
    assert!(rig.ipam.pool_status(Some("other")).is_empty());
    // At runtime too.
    rig.ipam.add(req("m", "c", V4)).await.expect("add");
    let e = rig
        .ipam
        .set_ranges(
            "m",
            vec![vec![crate::range::RangeSpec {
                subnet: "10.50.0.0/16".into(),
                range_start: None,
                range_end: None,
                gateway: None,
            }]],
        )
        .await
        .expect_err("overlap");
    assert!(e.to_string().contains("of network \"pods\""), "{e}");
    assert_eq!(rig.ipam.attachments(None).len(), 2);
}

#[tokio::test]
async fn names_past_their_limits_are_refused_briefly() {
    let rig = Rig::new("");
    let long = "x".repeat(100_000);
    let mut pod = req("n", "a", V4);
    pod.pod.name = long.clone();
    let mut netns = req("n", "a", V4);
    netns.netns = format!("/proc/{long}");
    for r in [req(&long, "a", V4), req("n", &long, V4), pod, netns] {
        let e = rig.ipam.add(r).await.expect_err("too long");
        assert!(matches!(e, Error::InvalidRequest(_)), "{e}");
        assert!(e.to_string().contains("too long"), "{e}");
        assert!(e.to_string().len() < 300, "{e}");
    }
    assert!(rig.ipam.pool_status(None).is_empty());
}

/// Two definitions that differ only in rangeEnd are told apart in the message.
#[tokio::test]
async fn a_redefinition_names_what_differs() {
    let rig = Rig::new("");
    let old = r#"{"ranges":[[{"subnet":"10.1.0.0/24","rangeEnd":"10.1.0.50"}]]}"#;
    let new = r#"{"ranges":[[{"subnet":"10.1.0.0/24","rangeEnd":"10.1.0.60"}]]}"#;
    rig.ipam.add(req("n", "a", old)).await.expect("add");
    let e = rig
        .ipam
        .add(req("n", "b", new))
        .await
        .expect_err("conflict");
    assert!(
        e.to_string().contains("10.1.0.50") && e.to_string().contains("10.1.0.60"),
        "{e}"
    );
}

/// A page is the first `limit` matches after the token, in key order: paging through gives
/// every attachment once.
#[tokio::test]
async fn pages_cover_every_attachment_once_in_order() {
    let rig = Rig::new("");
    for i in 0..37 {
        let (net, json) = match i % 3 {
            0 => ("m", r#"{"subnet":"10.2.0.0/24"}"#),
            _ => ("n", V4),
        };
        rig.ipam
            .add(req(net, &format!("c{i:02}"), json))
            .await
            .expect("add");
    }
    let all = rig.ipam.attachments(None);
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = rig.ipam.find(&Filter {
            after: after.clone(),
            limit: 5,
            ..Filter::default()
        });
        assert!(page.len() <= 5);
        after = page.last().map(|r| r.key.clone());
        let done = page.len() < 5;
        paged.extend(page);
        if done {
            break;
        }
    }
    assert_eq!(paged, all);
    let keys: Vec<_> = all.iter().map(|r| r.key.clone()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    let m = rig.ipam.find(&Filter {
        network: Some("m".into()),
        limit: 100,
        ..Filter::default()
    });
    assert_eq!(m.len(), 13);
}

/// A network a CNI config declared and that holds nothing gives its subnet to the next network
/// a CNI config declares over it (test suites reuse one subnet under several names); its
/// cooling addresses stay cooling there. Once that one holds addresses, the first is refused.
#[tokio::test]
async fn an_empty_cni_network_gives_way_to_the_next_that_declares_its_subnet() {
    let rig = Rig::new("[defaults]\ncooldown_secs = 60");
    let a = rig.ipam.add(req("one", "a", V4)).await.expect("add");
    assert_eq!(ips(&a), vec![ip("10.1.0.2")]);
    rig.ipam.del(&key("one", "a")).await.expect("del"); // 10.1.0.2 cooling
    let b = rig
        .ipam
        .add(req("two", "b", V4))
        .await
        .expect("declared over it");
    assert_eq!(
        ips(&b),
        vec![ip("10.1.0.3")],
        "the cooling address is not reused"
    );
    assert!(rig.ipam.pool_status(Some("one")).is_empty());
    let snap = rig.store.load().expect("load");
    assert!(
        snap.networks.iter().all(|d| d.name != "one"),
        "{:?}",
        snap.networks
    );
    assert_eq!(snap.idle.len(), 1);
    assert_eq!(
        (snap.idle[0].0.as_str(), snap.idle[0].1),
        ("two", ip("10.1.0.2"))
    );
    let e = rig
        .ipam
        .add(req("one", "c", V4))
        .await
        .expect_err("two holds an address");
    assert!(e.to_string().contains("of network \"two\""), "{e}");
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(ipam.pool_status(Some("two"))[0].in_use, 1);
    assert!(ipam.pool_status(Some("one")).is_empty());
}
