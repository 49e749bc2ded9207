//! ADD, DEL, CHECK, STATUS, GC and the network a CNI config declares: the engine's everyday
//! calls over the in-memory store.

use super::*;

#[tokio::test]
async fn add_is_idempotent_and_del_permissive() {
    let rig = Rig::new("");
    let a = rig.ipam.add(req("n", "c1", V4)).await.expect("add");
    assert_eq!(
        a.leases,
        vec![Lease {
            ip: ip("10.1.0.2"),
            prefix_len: 24,
            gateway: Some(ip("10.1.0.1"))
        }]
    );
    assert_eq!(a.routes.len(), 1);
    let again = rig.ipam.add(req("n", "c1", V4)).await.expect("add again");
    assert_eq!(again, a);
    // Without the ipam section the known network still serves the same key.
    let bare = rig.ipam.add(req("n", "c1", "")).await.expect("add bare");
    assert_eq!(ips(&bare), ips(&a));
    assert_eq!(rig.ipam.pool_status(None)[0].in_use, 1);

    assert_eq!(
        rig.ipam.del(&key("n", "c1")).await.expect("del"),
        vec![ip("10.1.0.2")]
    );
    assert!(rig
        .ipam
        .del(&key("n", "c1"))
        .await
        .expect("del twice")
        .is_empty());
    assert!(rig
        .ipam
        .del(&key("other", "nope"))
        .await
        .expect("del unknown")
        .is_empty());
    assert_eq!(rig.ipam.pool_status(None)[0].in_use, 0);
}

#[tokio::test]
async fn released_address_cools_down_and_survives_restart() {
    let rig = Rig::new("[defaults]\ncooldown_secs = 60");
    let first = ips(&rig.ipam.add(req("n", "c1", V4)).await.expect("add"))[0];
    rig.ipam.del(&key("n", "c1")).await.expect("del");
    let second = ips(&rig.ipam.add(req("n", "c2", V4)).await.expect("add"))[0];
    assert_ne!(
        first, second,
        "a cooling address is not reused while others are free"
    );

    // After a restart the cooldown deadline is still known.
    let ipam = rig.reopen().expect("reopen");
    let third = ips(&ipam.add(req("n", "c3", V4)).await.expect("add"))[0];
    assert!(third != first && third != second);
    rig.clock.advance(61_000);
    let fourth = ips(&ipam.add(req("n", "c4", V4)).await.expect("add"))[0];
    assert_eq!(
        fourth, first,
        "past its cooldown, the oldest released address comes first"
    );
}

#[tokio::test]
async fn restart_keeps_attachments_and_continues_the_sequence() {
    let rig = Rig::new("");
    for c in ["a", "b", "c"] {
        rig.ipam.add(req("n", c, V4)).await.expect("add");
    }
    rig.ipam.del(&key("n", "b")).await.expect("del");
    let before = rig.ipam.attachments(None);
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(ipam.attachments(None), before);
    ipam.check(&key("n", "a"), &[ip("10.1.0.2")]).expect("held");
    let status = &ipam.pool_status(Some("n"))[0];
    assert_eq!((status.in_use, status.idle, status.cooling), (2, 1, 1));
    // The source continues after .4, as host-local continues after its last reserved IP.
    let d = ips(&ipam.add(req("n", "d", "")).await.expect("add"))[0];
    assert_eq!(d, ip("10.1.0.5"));
}

#[tokio::test]
async fn dual_stack_is_all_or_nothing() {
    let rig = Rig::new("");
    // The IPv6 set has two addresses (::2, ::3); the IPv4 set has plenty.
    let ds = r#"{"ranges":[[{"subnet":"10.2.0.0/24"}],[{"subnet":"fd00::/126"}]]}"#;
    for c in ["a", "b"] {
        let r = rig.ipam.add(req("ds", c, ds)).await.expect("add");
        assert_eq!(r.leases.len(), 2);
        assert!(r.leases[0].ip.is_ipv4() && r.leases[1].ip.is_ipv6());
    }
    let e = rig
        .ipam
        .add(req("ds", "c", ds))
        .await
        .expect_err("v6 exhausted");
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::Refused {
                refusal: crate::error::Refusal::PoolExhausted,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("\"ds\" IPv6") && msg.contains("2 in use"),
        "{msg}"
    );
    let st = rig.ipam.pool_status(Some("ds"));
    assert_eq!(
        st[0].in_use, 2,
        "the IPv4 address of the failed ADD was given back"
    );
    assert_eq!(st[0].idle, 0);
    assert_eq!(rig.store.load().expect("load").attachments.len(), 2);
}

#[tokio::test]
async fn redefinition_is_refused_while_attachments_exist() {
    let rig = Rig::new("");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    let other = r#"{"subnet":"10.9.0.0/24"}"#;
    let e = rig
        .ipam
        .add(req("n", "b", other))
        .await
        .expect_err("conflict");
    assert!(matches!(e, Error::InvalidConfig(_)));
    assert!(
        e.to_string().contains("10.1.0.0/24") && e.to_string().contains("10.9.0.0/24"),
        "{e}"
    );
    // Same addresses, other spelling: fine.
    let same = r#"{"ranges":[[{"subnet":"10.1.0.0/24","gateway":"10.1.0.1"}]]}"#;
    rig.ipam
        .add(req("n", "c", same))
        .await
        .expect("same ranges");
    // Once empty, the network may be redefined.
    rig.ipam.del(&key("n", "a")).await.expect("del");
    rig.ipam.del(&key("n", "c")).await.expect("del");
    let r = rig.ipam.add(req("n", "d", other)).await.expect("redefined");
    assert_eq!(ips(&r), vec![ip("10.9.0.2")]);
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(ipam.pool_status(Some("n"))[0].ranges, "10.9.0.1-10.9.0.254");
}

#[tokio::test]
async fn config_networks_win_and_conflicts_are_errors() {
    let toml = r#"
        [[network]]
        name = "pods"
        ranges = [[{ subnet = "10.50.0.0/24", rangeStart = "10.50.0.100" }]]
        routes = [{ dst = "0.0.0.0/0", gw = "10.50.0.1" }]
    "#;
    let rig = Rig::new(toml);
    let r = rig
        .ipam
        .add(req("pods", "a", r#"{"type":"ipool"}"#))
        .await
        .expect("add");
    assert_eq!(ips(&r), vec![ip("10.50.0.100")]);
    assert_eq!(r.routes[0].gw.as_deref(), Some("10.50.0.1"));
    let e = rig
        .ipam
        .add(req("pods", "b", r#"{"subnet":"10.60.0.0/24"}"#))
        .await
        .expect_err("conflict with the config file");
    assert!(e.to_string().contains("config file"), "{e}");

    // A restart with other ranges for a network that has attachments refuses to start.
    let changed = DaemonConfig::parse(
        "[[network]]\nname = \"pods\"\nranges = [[{ subnet = \"10.70.0.0/24\" }]]",
    )
    .expect("config");
    let e = Ipam::open(
        rig.store.clone(),
        rig.clock.clone(),
        &changed,
        Some("boot-1"),
    )
    .err()
    .expect("refused");
    assert!(e.to_string().contains("1 attachment"), "{e}");
}

#[tokio::test]
async fn unknown_network_without_ranges_and_bad_keys_are_errors() {
    let rig = Rig::new("");
    let e = rig
        .ipam
        .add(req("n", "a", r#"{"type":"ipool"}"#))
        .await
        .expect_err("no ranges");
    assert!(e.to_string().contains("ipam.subnet"), "{e}");
    for (net, cid) in [("n", ""), ("n", "-x"), ("", "a"), ("n", "a b")] {
        assert!(matches!(
            rig.ipam.add(req(net, cid, V4)).await,
            Err(Error::InvalidRequest(_))
        ));
    }
    let mut r = req("n", "a", V4);
    r.key.ifname = "x".repeat(16);
    assert!(matches!(
        rig.ipam.add(r).await,
        Err(Error::InvalidRequest(_))
    ));
    assert!(
        rig.ipam.pool_status(None).is_empty(),
        "no network declared by a bad request"
    );
}

#[tokio::test]
async fn check_names_what_is_wrong() {
    let rig = Rig::new("");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.ipam.add(req("n", "b", V4)).await.expect("add");
    rig.ipam
        .check(&key("n", "a"), &[ip("10.1.0.2")])
        .expect("held");
    let e = rig
        .ipam
        .check(&key("n", "a"), &[ip("10.1.0.3")])
        .expect_err("other's");
    assert!(matches!(e, Error::Mismatch(_)));
    assert!(e.to_string().contains("held by n/b/eth0"), "{e}");
    assert!(matches!(
        rig.ipam.check(&key("n", "zz"), &[]),
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn maintenance_preloads_min_idle_durably_and_trims() {
    let toml = r#"
        [defaults]
        min_idle = 3
        max_idle = 3
        cooldown_secs = 10
        [[network]]
        name = "pre"
        ranges = [[{ subnet = "10.3.0.0/24" }]]
    "#;
    let rig = Rig::new(toml);
    assert_eq!(rig.ipam.maintain().await.expect("maintain"), (3, 0));
    assert_eq!(rig.store.load().expect("load").idle.len(), 3);
    // Preloaded addresses are handed out in source order.
    let a = ips(&rig.ipam.add(req("pre", "a", "")).await.expect("add"))[0];
    assert_eq!(a, ip("10.3.0.2"));
    assert_eq!(rig.ipam.maintain().await.expect("maintain"), (1, 0));
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(ipam.pool_status(None)[0].idle, 3);
    // Releasing pushes idle above max_idle; a cooling address does not count, so nothing
    // goes back until it has cooled.
    ipam.del(&key("pre", "a")).await.expect("del");
    assert_eq!(ipam.maintain().await.expect("maintain"), (0, 0));
    let st = &ipam.pool_status(None)[0];
    assert_eq!((st.idle, st.cooling), (4, 1), "the cooling address stays");
    rig.clock.advance(10_000);
    assert_eq!(ipam.maintain().await.expect("maintain"), (0, 1));
    let st = &ipam.pool_status(None)[0];
    assert_eq!((st.idle, st.cooling), (3, 0));
}

#[tokio::test]
async fn token_bucket_limits_source_calls() {
    let toml = "[defaults]\nsource_rate = 1.0\nsource_burst = 2\ncooldown_secs = 0";
    let rig = Rig::new(toml);
    for c in ["a", "b"] {
        rig.ipam.add(req("n", c, V4)).await.expect("within burst");
    }
    // The bucket is empty and the clock does not move: the ADD waits up to its limit, then
    // takes what the pool has. Here that is nothing: a retryable error that names the rate
    // limit, not exhaustion (252 addresses are free).
    tokio::time::pause();
    let e = rig
        .ipam
        .add(req("n", "c", V4))
        .await
        .expect_err("bucket empty");
    assert!(matches!(e, Error::Busy(_)), "{e}");
    assert!(e.to_string().contains("source_rate 1/s"), "{e}");
    assert!(!e.to_string().contains("exhausted"), "{e}");
    // A released address (cooldown 0) is served without asking the source.
    rig.ipam.del(&key("n", "a")).await.expect("del");
    let c = ips(&rig.ipam.add(req("n", "c", V4)).await.expect("from idle"))[0];
    assert_eq!(c, ip("10.1.0.2"));
    rig.clock.advance(1_000);
    rig.ipam.add(req("n", "d", V4)).await.expect("refilled");
}

#[tokio::test]
async fn static_addresses_are_claimed_or_refused_with_the_holder() {
    let rig = Rig::new("");
    let ds = r#"{"ranges":[[{"subnet":"10.4.0.0/24"}],[{"subnet":"fd04::/64"}]]}"#;
    // One set asked for, the other dynamic (as host-local does).
    let r = rig
        .ipam
        .add(with_ips(req("s", "a", ds), &["10.4.0.77"]))
        .await
        .expect("claim");
    assert_eq!(ips(&r), vec![ip("10.4.0.77"), ip("fd04::2")]);
    // The source does not hand out a claimed address later.
    let mut pod = req("s", "b", ds);
    pod.pod.name = "web-1".into();
    pod.pod.namespace = "prod".into();
    let b = rig
        .ipam
        .add(with_ips(pod, &["fd04::99"]))
        .await
        .expect("claim v6");
    assert_eq!(ips(&b), vec![ip("10.4.0.2"), ip("fd04::99")]);

    let e = rig
        .ipam
        .add(with_ips(req("s", "c", ds), &["fd04::99"]))
        .await
        .expect_err("held");
    assert!(matches!(e, Error::InUse(_)), "{e}");
    assert!(
        e.to_string().contains("s/b/eth0") && e.to_string().contains("prod/web-1"),
        "{e}"
    );
    for (asked, needle) in [
        ("10.9.9.9", "outside every range"),
        ("10.4.0.1", "never handed out"),
        ("10.4.0.255", "never handed out"),
    ] {
        let e = rig
            .ipam
            .add(with_ips(req("s", "c", ds), &[asked]))
            .await
            .expect_err(asked);
        assert!(
            matches!(e, Error::InvalidConfig(_)) && e.to_string().contains(needle),
            "{e}"
        );
    }
    let e = rig
        .ipam
        .add(with_ips(req("s", "c", ds), &["10.4.0.5", "10.4.0.6"]))
        .await
        .expect_err("two in one set");
    assert!(e.to_string().contains("same range set"), "{e}");
    // Failed claims left nothing behind; a released address can be asked for by name at once.
    let st = rig.ipam.pool_status(Some("s"));
    assert_eq!((st[0].in_use, st[1].in_use), (2, 2));
    rig.ipam.del(&key("s", "a")).await.expect("del");
    let again = rig
        .ipam
        .add(with_ips(req("s", "d", ds), &["10.4.0.77"]))
        .await
        .expect("claim from idle, cooling or not");
    assert_eq!(ips(&again)[0], ip("10.4.0.77"));
    let ipam = rig.reopen().expect("reopen");
    ipam.check(&key("s", "d"), &[ip("10.4.0.77")])
        .expect("durable");
    // The pools do not record holders; the holder is still named after a restart.
    let e = ipam
        .add(with_ips(req("s", "e", ds), &["fd04::99"]))
        .await
        .expect_err("held after restart");
    assert!(
        matches!(e, Error::InUse(_))
            && e.to_string()
                .contains("held by attachment s/b/eth0 (pod prod/web-1)"),
        "{e}"
    );
}

#[tokio::test]
async fn gc_releases_only_what_the_runtime_no_longer_lists() {
    let rig = Rig::new("[cni]\ngc_grace_secs = 0");
    for c in ["a", "b", "c"] {
        rig.ipam.add(req("g", c, V4)).await.expect("add");
    }
    rig.ipam
        .add(req("other", "a", r#"{"subnet":"10.8.0.0/24"}"#))
        .await
        .expect("add");
    let valid = [("b".to_string(), "eth0".to_string())]
        .into_iter()
        .collect();
    let released = rig.ipam.gc("g", &valid).await.expect("gc");
    let keys: Vec<String> = released
        .iter()
        .map(|r| r.key.container_id.clone())
        .collect();
    assert_eq!(keys.len(), 2);
    assert!(keys.contains(&"a".to_string()) && keys.contains(&"c".to_string()));
    assert_eq!(rig.ipam.attachments(Some("g")).len(), 1);
    assert_eq!(
        rig.ipam.attachments(Some("other")).len(),
        1,
        "other networks untouched"
    );
    let st = &rig.ipam.pool_status(Some("g"))[0];
    assert_eq!((st.in_use, st.cooling), (1, 2));
    assert!(rig.ipam.gc("g", &valid).await.expect("gc again").is_empty());
    assert_eq!(
        rig.reopen().expect("reopen").attachments(Some("g")).len(),
        1
    );
}

#[tokio::test]
async fn status_says_why_an_add_cannot_be_served() {
    let rig = Rig::new("");
    let tiny = IpamSection::parse(r#"{"subnet":"10.5.0.0/30"}"#)
        .expect("json")
        .expect("present")
        .network_def("t", rig.ipam.defaults())
        .expect("valid");
    assert_eq!(
        rig.ipam.status("t", tiny.as_ref()),
        Ok(()),
        "would be declared"
    );
    let e = rig.ipam.status("t", None).expect_err("unknown, no ranges");
    assert!(e.0.contains("unknown"), "{e}");
    rig.ipam
        .add(req("t", "a", r#"{"subnet":"10.5.0.0/30"}"#))
        .await
        .expect("add");
    let e = rig.ipam.status("t", None).expect_err("exhausted");
    assert!(
        e.0.contains("10.5.0.1-10.5.0.2") && e.0.contains("1 in use"),
        "{e}"
    );
    rig.ipam.del(&key("t", "a")).await.expect("del");
    assert_eq!(
        rig.ipam.status("t", None),
        Ok(()),
        "a cooling address can still be served"
    );
}

#[tokio::test]
async fn a_failed_add_declares_no_network() {
    let rig = Rig::new("");
    let e = rig
        .ipam
        .add(with_ips(req("fresh", "a", V4), &["10.99.0.1"]))
        .await
        .expect_err("outside");
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(rig.ipam.pool_status(None).is_empty());
    assert!(rig.store.load().expect("load").networks.is_empty());
    // The same network with a good request is declared as usual.
    rig.ipam.add(req("fresh", "a", V4)).await.expect("add");
    assert_eq!(rig.store.load().expect("load").networks.len(), 1);
}

/// A config network renamed while its pods run: the store keeps the old network (its
/// attachments hold addresses of it), and the new one with the same ranges would hand those
/// addresses out again. The start is refused, naming both; once the old network holds nothing
/// it is dropped and the new one serves.
#[tokio::test]
async fn a_renamed_network_never_hands_out_what_the_old_name_holds() {
    let rig = Rig::new("[[network]]\nname = \"k8s\"\nranges = [[{ subnet = \"10.70.0.0/24\" }]]");
    let held = ips(&rig.ipam.add(req("k8s", "a", "")).await.expect("add a"));
    let renamed = DaemonConfig::parse(
        "[[network]]\nname = \"pods\"\nranges = [[{ subnet = \"10.70.0.0/24\" }]]",
    )
    .expect("config");
    let open =
        |c: &DaemonConfig| Ipam::open(rig.store.clone(), rig.clock.clone(), c, Some("boot-1"));
    match open(&renamed) {
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("\"k8s\"") && e.contains("\"pods\""), "{e}");
        }
        Ok(ipam) => {
            let got = ips(&ipam.add(req("pods", "b", "")).await.expect("add b"));
            panic!("started; pod b got {got:?} while pod a holds {held:?}");
        }
    }
    // Pod a goes (its DEL under the old name); then the rename takes.
    let ipam = open(&rig.config).expect("the old config");
    ipam.del(&key("k8s", "a")).await.expect("del a");
    drop(ipam);
    let ipam = open(&renamed).expect("nothing holds the old name");
    ipam.add(req("pods", "b", "")).await.expect("add b");
    assert!(ipam.pool_status(None).iter().all(|s| s.network != "k8s"));
}
