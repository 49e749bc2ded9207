use super::*;
use crate::store::Shared;
use ipool_server::cluster::etcd::client::Call;
use ipool_server::cluster::etcd::request;
use ipool_testkit::apiserver::Objects;
use std::collections::BTreeMap;

const KEY: &str = "/ipool/v1/nodes/n0/blocks/p/10.0.0.0-28";

fn write(e: &mut Etcd, call: Call) {
    e.apply(&call, tokio::time::Instant::now())
        .expect("applied");
}

fn created(stream: &mut EtcdStream) -> pb::WatchResponse {
    stream.try_recv().expect("an answer").expect("not an error")
}

#[tokio::test]
async fn an_etcd_watch_hears_only_when_told_and_a_compacted_one_is_told_so() {
    let mut shared = Shared::Etcd(Etcd::new(7));
    let mut ws = Watches::default();
    let prefix = b"/ipool/v1/nodes/n0/blocks/".to_vec();
    let create = pb::WatchCreateRequest {
        range_end: request::prefix_end(&prefix),
        key: prefix,
        start_revision: 0,
        progress_notify: true,
    };
    let Shared::Etcd(e) = &mut shared else {
        unreachable!()
    };
    let mut stream = ws.open_etcd(e, 0, &create);
    assert!(created(&mut stream).created);
    write(e, Call::Put(request::put(KEY, "x", 0)));
    write(e, Call::Put(request::put("/ipool/v1/pools/p", "y", 0)));
    write(e, Call::DeleteRange(request::delete(KEY)));
    assert!(stream.try_recv().is_err(), "nothing before it is told");
    assert_eq!(ws.count(), 1);
    let heard = ws.hear(0, &shared);
    let a = created(&mut stream);
    assert_eq!((heard.events, a.events.len()), (2, 2), "its prefix only");
    assert_eq!(heard.gone, vec!["10.0.0.0/28".parse::<IpNet>().unwrap()]);
    // Nothing new: a progress notification at the current revision.
    ws.hear(0, &shared);
    let p = created(&mut stream);
    assert!(p.events.is_empty() && p.header.expect("header").revision == 4);
    // Made again from before a compaction: told, and ended.
    shared.compact();
    let Shared::Etcd(e) = &mut shared else {
        unreachable!()
    };
    let again = pb::WatchCreateRequest {
        start_revision: 2,
        ..create
    };
    let mut old = ws.open_etcd(e, 0, &again);
    assert!(created(&mut old).created);
    let c = created(&mut old);
    assert!(c.canceled && c.compact_revision == 4, "{c:?}");
    assert_eq!(ws.count(), 1, "only the first is open");
    ws.cut_from(Some(0));
    assert!(stream.try_recv().expect("the break").is_err());
    assert_eq!(ws.count(), 0);
}

#[tokio::test]
async fn an_apiserver_watch_hears_its_selector_and_one_from_before_its_history_gets_410() {
    let mut objects = Objects::new(true);
    let block = |node: &str| {
        json!({"apiVersion": "ipool.io/v1", "kind": "IPBlock",
               "metadata": {"name": "10-0-0-0-28", "labels": {"ipool.io/node": node}},
               "spec": {"cidr": "10.0.0.0/28", "node": node, "pool": "p"}})
    };
    objects.put_custom("ipblocks", block("n0"));
    let mut shared = Shared::Api {
        objects,
        skew_secs: 0,
        oldest: 0,
        access: crate::identity::deployed(),
    };
    let mut ws = Watches::default();
    let q: BTreeMap<String, String> = [
        ("watch", "true"),
        ("labelSelector", "ipool.io/node=n0"),
        ("resourceVersion", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let path = "/apis/ipool.io/v1/ipblocks";
    let mut stream = ws.open_api(1, 0, 0, path, &q).expect("made");
    if let Shared::Api { objects, .. } = &mut shared {
        objects.put_custom("ipblocks", block("n1"));
    }
    let heard = ws.hear(0, &shared);
    let body = stream.try_recv().expect("a chunk").expect("not an error");
    assert!(
        String::from_utf8_lossy(&body).contains("\"DELETED\""),
        "{body:?}"
    );
    assert_eq!(heard.gone, vec!["10.0.0.0/28".parse::<IpNet>().unwrap()]);
    shared.compact();
    let Shared::Api {
        objects, oldest, ..
    } = &shared
    else {
        unreachable!()
    };
    let mut old = ws
        .open_api(objects.rv, *oldest, 0, path, &q)
        .expect("answered");
    let line = old.try_recv().expect("a line").expect("not an error");
    assert!(String::from_utf8_lossy(&line).contains("410"), "{line:?}");
}
