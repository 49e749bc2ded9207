//! What the store's watches say, taken in by a [`ClusterSource`] (`take_in_watched`): a block
//! of its no longer the node's stops serving at once and a sync follows; its own give-back
//! changes nothing; a watch that started over makes every source sync.

use std::time::Duration;

use super::tests::{block, ip, land, mine, net, next_work, node, source, synced};
use super::*;
use crate::cluster::datastore::Watched;
use crate::cluster::work::Outcome;
use crate::source::BlockSource;

fn gone(pool: &str, cidr: &str) -> Watched {
    Watched::BlockGone {
        pool: pool.into(),
        block: net(cidr),
    }
}

/// A serving source holding block 10.0.0.0/28 (confirmed at revision 5), nothing to do.
fn serving() -> (Arc<ClusterNode>, ClusterSource) {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    synced(&mut s, &n, &[block("10.0.0.0/28", 5)]);
    assert_eq!(next_work(&mut s), None);
    assert!(s.withheld(ip("10.0.0.2")).is_none());
    (n, s)
}

#[test]
fn a_block_the_watch_says_is_gone_stops_serving_at_once_and_a_sync_follows() {
    let (n, mut s) = serving();
    // Another pool's block, or one this source does not hold: nothing to do.
    n.hear(gone("q", "10.0.0.0/28"));
    n.hear(gone("p", "10.0.0.64/28"));
    assert_eq!(next_work(&mut s), None);
    assert!(s.withheld(ip("10.0.0.2")).is_none());
    n.hear(gone("p", "10.0.0.0/28"));
    let w = next_work(&mut s);
    assert!(
        matches!(&w, Some(Work::Sync { trusted, .. }) if trusted.is_empty()),
        "{w:?}"
    );
    assert!(s.withheld(ip("10.0.0.2")).is_some(), "nothing more from it");
    assert!(matches!(
        s.next(),
        Next::Pending(_) | Next::Unavailable(_) | Next::Exhausted
    ));
    // The sync no longer lists it: empty, it is dropped.
    let e = n.serving().unwrap();
    land(
        &mut s,
        Work::Sync {
            epoch: e,
            trusted: Vec::new(),
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(mine(Vec::new()))),
    )
    .expect("synced");
    assert!(!s.contains(ip("10.0.0.2")));
}

#[test]
fn heard_while_a_sync_is_on_its_way_the_block_waits_for_the_next_one() {
    let (n, mut s) = serving();
    s.next_sync = Some(Instant::now());
    let Some(Work::Sync { epoch, trusted, .. }) = next_work(&mut s) else {
        panic!("a resync");
    };
    assert_eq!(trusted.len(), 1);
    // The watch hears of it while the sync, which listed it before, is on its way.
    n.hear(gone("p", "10.0.0.0/28"));
    land(
        &mut s,
        Work::Sync {
            epoch,
            trusted,
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(mine(vec![block("10.0.0.0/28", 5)]))),
    )
    .expect("synced");
    assert!(
        s.withheld(ip("10.0.0.2")).is_some(),
        "a listing older than the watch's news does not confirm it"
    );
    assert!(matches!(next_work(&mut s), Some(Work::Sync { trusted, .. }) if trusted.is_empty()));
}

#[test]
fn its_own_give_back_heard_changes_nothing() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    next_work(&mut s);
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 5), block("10.0.0.16/28", 6)],
    );
    // Both empty past the hold-down: one is given back (the other kept).
    let Some(Work::GiveBack(returning, _)) = next_work(&mut s) else {
        panic!("a give-back");
    };
    n.hear(gone("p", &returning.to_string()));
    land(
        &mut s,
        Work::GiveBack(returning, super::tests::rev(6)),
        Ok(Outcome::GaveBack(true)),
    )
    .expect("given back");
    assert_eq!(next_work(&mut s), None, "no sync for its own give-back");
}

#[test]
fn a_watch_that_started_over_makes_every_source_sync_once() {
    let (n, mut s) = serving();
    let mut other = source(&n);
    next_work(&mut other);
    synced(&mut other, &n, &[block("10.0.0.32/28", 7)]);
    n.hear(Watched::Restarted);
    for src in [&mut s, &mut other] {
        let Some(Work::Sync { epoch, trusted, .. }) = next_work(src) else {
            panic!("a sync");
        };
        land(
            src,
            Work::Sync {
                epoch,
                trusted,
                pins: false,
                orphaned: Vec::new(),
            },
            Ok(Outcome::Synced(mine(Vec::new()))),
        )
        .expect("synced");
        assert!(!matches!(next_work(src), Some(Work::Sync { .. })), "once");
    }
}

#[test]
fn a_block_claimed_before_the_news_that_it_is_gone_lands_unconfirmed() {
    let (n, mut s) = serving();
    // Wants more: a claim is on its way when the watch hears that the block it won is gone.
    s.threshold = 100;
    let Some(Work::Claim { cidrs }) = next_work(&mut s) else {
        panic!("a claim");
    };
    n.hear(gone("p", "10.0.0.16/28"));
    land(
        &mut s,
        Work::Claim { cidrs },
        Ok(Outcome::Claimed(block("10.0.0.16/28", 9))),
    )
    .expect("claimed");
    assert!(s.withheld(ip("10.0.0.18")).is_some(), "not served");
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
}

#[test]
fn news_heard_while_work_is_on_its_way_stop_the_block_at_once_and_apply_to_what_lands() {
    let (n, mut s) = serving();
    s.threshold = 100;
    let Some(Work::Claim { cidrs }) = next_work(&mut s) else {
        panic!("a claim");
    };
    // While the claim is on its way: the held block is gone, and so is the one being won.
    n.hear(gone("p", "10.0.0.0/28"));
    n.hear(gone("p", "10.0.0.16/28"));
    assert!(s.start_claim().is_none(), "the claim is still on its way");
    assert!(s.withheld(ip("10.0.0.2")).is_some(), "stopped at once");
    land(
        &mut s,
        Work::Claim { cidrs },
        Ok(Outcome::Claimed(block("10.0.0.16/28", 9))),
    )
    .expect("claimed");
    assert!(
        s.withheld(ip("10.0.0.18")).is_some(),
        "the block won is not served"
    );
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
}

#[test]
fn its_pool_written_makes_a_source_with_blocks_in_doubt_sync_at_once() {
    let (n, mut s) = serving();
    s.next_sync = Some(Instant::now());
    let Some(Work::Sync { epoch, trusted, .. }) = next_work(&mut s) else {
        panic!("a resync");
    };
    let listed = crate::cluster::work::Synced {
        mine: vec![block("10.0.0.0/28", 5)],
        in_doubt: vec![block("10.0.0.16/28", 6)],
        ..Default::default()
    };
    land(
        &mut s,
        Work::Sync {
            epoch,
            trusted,
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(listed)),
    )
    .expect("synced");
    assert_eq!(
        next_work(&mut s),
        None,
        "in doubt: looked at again in a while"
    );
    // Another pool written is no news here; its own is.
    n.hear(Watched::Pool("q".into()));
    assert_eq!(next_work(&mut s), None);
    n.hear(Watched::Pool("p".into()));
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
}
