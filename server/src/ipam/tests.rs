//! Engine tests over the in-memory store and a manual clock.

use std::net::IpAddr;
use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::config::DaemonConfig;
use crate::model::{Millis, ReservationKey};
use crate::store::{Change, MemStore, Store};

const T0: Millis = 1_700_000_000_000;

struct Rig {
    store: Arc<MemStore>,
    clock: Arc<ManualClock>,
    config: DaemonConfig,
    ipam: Ipam,
}

impl Rig {
    fn new(toml: &str) -> Rig {
        let store = Arc::new(MemStore::new());
        let clock = Arc::new(ManualClock::new(T0));
        let config = DaemonConfig::parse(toml).expect("test config");
        let ipam = Ipam::open(store.clone(), clock.clone(), &config, Some("boot-1")).expect("open");
        Rig {
            store,
            clock,
            config,
            ipam,
        }
    }

    /// A restart: a new engine over the same store.
    fn reopen(&self) -> Result<Ipam, Error> {
        Ipam::open(
            self.store.clone(),
            self.clock.clone(),
            &self.config,
            Some("boot-1"),
        )
    }
}

fn key(net: &str, cid: &str) -> AttachmentKey {
    AttachmentKey {
        network: net.into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
    }
}

fn req(net: &str, cid: &str, ipam_json: &str) -> AddRequest {
    AddRequest {
        key: key(net, cid),
        pod: Pod::default(),
        netns: format!("/var/run/netns/{cid}"),
        ipam: IpamSection::parse(ipam_json).expect("test ipam json"),
        requested: Vec::new(),
        k8s: None,
        pools: None,
        fixed: false,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn ips(r: &AddReply) -> Vec<IpAddr> {
    r.leases.iter().map(|l| l.ip).collect()
}

const V4: &str = r#"{"subnet":"10.1.0.0/24","routes":[{"dst":"0.0.0.0/0"}]}"#;

fn with_ips(mut r: AddRequest, ips: &[&str]) -> AddRequest {
    r.requested = ips.iter().map(|s| ip(s)).collect();
    r
}

/// Recovery reads the store on a thread of its own and hands the attachments over in batches:
/// every one comes back with its addresses, across full batches and a partial last one.
#[tokio::test]
async fn recovery_brings_back_every_attachment_across_load_batches() {
    // The source's token bucket out of the way: this is about recovery, not the rate policy.
    let rig = Rig::new("[defaults]\nsource_rate = 1e9\nsource_burst = 1000000000\n");
    let json = r#"{"subnet":"10.2.0.0/20"}"#;
    let n = 2 * super::recover::LOAD_BATCH + 17;
    let mut held = std::collections::BTreeMap::new();
    for i in 0..n {
        let cid = format!("c{i}");
        let r = rig.ipam.add(req("big", &cid, json)).await.expect("add");
        held.insert(cid, ips(&r));
    }
    let again = rig.reopen().expect("reopen");
    let back = again.attachments(None);
    assert_eq!(back.len(), n);
    for a in &back {
        assert_eq!(held.get(&a.key.container_id), Some(&a.addresses), "{a:?}");
    }
    // The pool knows them too: the next Add gets an address none of them holds.
    let next = ips(&again.add(req("big", "new", json)).await.expect("add"));
    assert!(
        held.values().all(|v| v != &next),
        "{next:?} was handed out twice"
    );
}

/// A store that cannot be opened fails recovery with the store's own error, and the serving
/// handle is never opened.
#[test]
fn recovery_reports_the_loaders_error() {
    let config = DaemonConfig::parse("").expect("config");
    let served = std::sync::atomic::AtomicBool::new(false);
    let e = Ipam::open_with(
        || {
            Err(crate::store::StoreError::Open {
                path: "/state/db".into(),
                msg: "it is locked by another process".into(),
            })
        },
        || {
            served.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(Arc::new(MemStore::new()))
        },
        Setup {
            config,
            clock: Arc::new(ManualClock::new(T0)),
            boot_id: None,
            metrics: Arc::default(),
            sources: Default::default(),
        },
    )
    .map(|_| ())
    .expect_err("the loader failed");
    assert!(matches!(e, Error::Store(_)), "{e}");
    assert!(e.to_string().contains("locked by another process"), "{e}");
    assert!(!served.load(std::sync::atomic::Ordering::SeqCst));
}

mod basics;
mod claims;
mod failures;
mod inputs;
mod lifecycle;
mod races;
mod ranges;
mod withheld;

/// ipoold's start-up: read through one sled handle, serve through a second one opened after the
/// first is dropped (sled locks its directory, so this also proves the reader is gone).
#[tokio::test]
async fn open_with_reads_through_one_handle_and_serves_through_another() {
    use crate::store::SledStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let config = DaemonConfig::parse("").expect("config");
    {
        let store = Arc::new(SledStore::open(dir.path()).expect("open"));
        let ipam = Ipam::open(store, clock.clone(), &config, Some("boot-1")).expect("open");
        for c in ["a", "b"] {
            ipam.add(req("n", c, V4)).await.expect("add");
        }
    }
    let path = dir.path().to_path_buf();
    let reader_path = path.clone();
    let ipam = Ipam::open_with(
        move || Ok(Arc::new(SledStore::open(&reader_path)?)),
        move || Ok(Arc::new(SledStore::open(&path)?)),
        Setup {
            config: config.clone(),
            clock: clock.clone(),
            boot_id: Some("boot-1".into()),
            metrics: Arc::default(),
            sources: Default::default(),
        },
    )
    .expect("open_with");
    assert_eq!(ipam.attachments(None).len(), 2);
    // Writes go through the serving handle and are durable there.
    let c = ips(&ipam.add(req("n", "c", "")).await.expect("add"))[0];
    assert_eq!(c, ip("10.1.0.4"));
    drop(ipam);
    let again = Ipam::open(
        Arc::new(SledStore::open(dir.path()).expect("reopen")),
        clock,
        &config,
        Some("boot-1"),
    )
    .expect("open");
    assert_eq!(again.attachments(None).len(), 3);
}
