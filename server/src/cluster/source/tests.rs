//! The block states of a [`ClusterSource`], driven by the outcomes that land (no etcd: the
//! claims it starts are dropped unpolled, and their results made up here).

use std::time::Duration;

use super::*;
use crate::cluster::node::Identity;
use crate::cluster::vocab::{Block, KeyRevision, Owner};
use crate::cluster::work::{Done, Outcome, Synced};
use crate::config::ClusterSettings;
use crate::range::RangeSpec;
use crate::source::{BlockSource, Landing, WorkFailed};

pub(super) fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

pub(super) fn node(extra: &str) -> Arc<ClusterNode> {
    let settings: ClusterSettings = toml::from_str(&format!(
        "etcd_endpoints = [\"http://127.0.0.1:1\"]\nheartbeat_ttl_secs = 10\nclaim_ahead = 1\nblock_hold_down_secs = 0\n{extra}"
    ))
    .expect("settings");
    let n = ClusterNode::new(settings, "n1".into(), "inst-1".into(), Arc::default()).expect("node");
    n.as_read("p", Some(&pool_p(&[])));
    n
}

/// Pool "p" (10.0.0.0/24), with `reserved` reserved.
pub(super) fn pool_p(reserved: &[&str]) -> crate::cluster::vocab::Pool {
    use crate::cluster::ippool::{PoolSpec, Reserved};
    crate::cluster::vocab::Pool {
        spec: PoolSpec {
            name: "p".into(),
            cidrs: vec![net("10.0.0.0/24")],
            block_v4: 26,
            block_v6: 122,
            reserved: reserved
                .iter()
                .map(|c| Reserved {
                    cidr: net(c),
                    reason: String::new(),
                })
                .collect(),
            ..PoolSpec::default()
        },
        revision: 1,
        phase: crate::cluster::vocab::PoolPhase::Ready,
    }
}

pub(super) fn source(node: &Arc<ClusterNode>) -> ClusterSource {
    source_wanting(node, 0)
}

/// A source that claims ahead until `min_idle` addresses are free.
pub(super) fn source_wanting(node: &Arc<ClusterNode>, min_idle: usize) -> ClusterSource {
    let range = Range::from_spec(&RangeSpec {
        subnet: "10.0.0.0/24".into(),
        range_start: None,
        range_end: None,
        gateway: None,
    })
    .expect("range");
    ClusterSource::new(node.clone(), "p", &[range], min_idle)
}

/// A key created and last written at `revision`.
pub(super) fn rev(revision: i64) -> KeyRevision {
    KeyRevision {
        create: revision,
        modified: revision,
        write: None,
    }
}

pub(super) fn block(cidr: &str, revision: i64) -> Block {
    Block {
        pool: "p".into(),
        block: net(cidr),
        owner: Owner {
            node: "n1".into(),
            claimed_at_ms: 0,
        },
        revision: rev(revision),
    }
}

pub(super) fn land(
    s: &mut ClusterSource,
    work: Work,
    result: Result<Outcome, String>,
) -> Result<String, String> {
    // A failure as the store's answer no (its words as they are).
    let result = result.map_err(crate::cluster::vocab::ClusterError::Refused);
    *s.inbox.lock().expect("inbox") = Some(Done { work, result });
    match s.land() {
        Ok(Landing::Took(what)) => Ok(what),
        Ok(Landing::Nothing) => Err("nothing landed".into()),
        Err(WorkFailed(why)) => Err(why),
    }
}

/// The work the source starts now, if it starts any (its claim is dropped: nothing runs).
pub(super) fn next_work(s: &mut ClusterSource) -> Option<Work> {
    let w = s.next_work();
    let started = s.start_claim().is_some();
    w.filter(|_| started)
}

pub(super) fn epoch(n: &ClusterNode) -> u64 {
    n.serving().expect("serving")
}

/// The blocks a sync started now would not settle: those confirmed here.
pub(super) fn trusted(s: &ClusterSource) -> Vec<(IpNet, KeyRevision)> {
    s.blocks
        .values()
        .filter_map(|b| match b.state {
            BlockState::Confirmed(r) => Some((b.net(), r)),
            _ => None,
        })
        .collect()
}

/// A sync's outcome: `blocks`, all this node's.
pub(super) fn mine(blocks: Vec<Block>) -> Synced {
    Synced {
        mine: blocks,
        ..Synced::default()
    }
}

/// A sync in the node's epoch that listed (and settled as needed) `blocks`.
pub(super) fn synced(s: &mut ClusterSource, n: &ClusterNode, blocks: &[Block]) {
    let e = epoch(n);
    let trusted = trusted(s);
    land(
        s,
        Work::Sync {
            epoch: e,
            trusted,
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(mine(blocks.to_vec()))),
    )
    .expect("synced");
}

#[test]
fn nothing_is_handed_out_before_the_node_holds_its_name_and_the_source_synced() {
    let n = node("");
    let mut s = source(&n);
    assert!(
        matches!(s.held_back(), Some(Next::Pending(w)) if w.contains("registering node name \"n1\""))
    );
    assert_eq!(
        next_work(&mut s),
        None,
        "no etcd work before the name is held"
    );
    n.pretend_identity(Identity::Taken {
        instance: "other".into(),
    });
    assert!(matches!(s.held_back(), Some(Next::Unavailable(w)) if w.contains("instance other")));
    n.pretend_renewed(Duration::ZERO);
    assert!(matches!(s.held_back(), Some(Next::Pending(w)) if w.contains("listing")));
    assert!(s.knows_its_addresses().is_err());
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    assert_eq!(s.held_back(), None);
    assert!(s.knows_its_addresses().is_ok());
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.2")));
}

#[test]
fn a_fenced_node_hands_out_nothing_until_it_renewed_and_synced_again() {
    let n = node("fence_secs = 5");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    assert_eq!(s.held_back(), None);
    // Not renewed for longer than the fence.
    n.pretend_renewed(Duration::from_secs(6));
    match s.held_back() {
        Some(Next::Refused(crate::error::Refusal::NodeFenced, why)) => {
            assert!(why.contains("fenced"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.peek_next_n(3), Vec::<IpAddr>::new());
    assert!(
        s.can_occupy(ip("10.0.0.5")).is_ok(),
        "the block is still this node's"
    );
    // Renewed: a new epoch; the old sync does not count.
    n.pretend_renewed(Duration::ZERO);
    assert!(matches!(s.held_back(), Some(Next::Pending(_))));
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    assert_eq!(s.held_back(), None);
}

#[test]
fn a_block_being_given_back_takes_nothing_in_and_an_unanswered_give_back_waits_for_a_sync() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 7), block("10.0.0.16/28", 8)],
    );
    // The second block is empty and not needed: it is given back.
    s.take_next(ip("10.0.0.2")).expect("take");
    let w = next_work(&mut s);
    assert_eq!(w, Some(Work::GiveBack(net("10.0.0.16/28"), rev(8))));
    let inside = ip("10.0.0.20");
    let e = s.can_occupy(inside).expect_err("returning");
    assert!(e.to_string().contains("being given back"), "{e}");
    assert!(s.withheld(inside).is_some());
    assert!(s
        .peek_next_n(20)
        .iter()
        .all(|a| !net("10.0.0.16/28").contains(a)));
    // etcd did not answer: the delete may have been applied.
    land(
        &mut s,
        Work::GiveBack(net("10.0.0.16/28"), rev(8)),
        Err("etcd: no answer within 2s".into()),
    )
    .expect_err("failed");
    assert!(s
        .withheld(inside)
        .is_some_and(|w| w.contains("did not answer")));
    assert!(s.detail().unwrap_or_default().contains("UNSETTLED"));
    // The next work is a sync, whatever the backoff says about claims.
    s.retry_at = None;
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    // The delete had been applied: the sync does not list it, and it is dropped.
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    assert!(!s.contains(inside));
    assert!(s.withheld(inside).is_some());
}

#[test]
fn a_give_back_that_lands_on_a_block_holding_an_address_claims_it_back() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 7), block("10.0.0.16/28", 8)],
    );
    s.take_next(ip("10.0.0.2")).expect("take");
    assert_eq!(
        next_work(&mut s),
        Some(Work::GiveBack(net("10.0.0.16/28"), rev(8)))
    );
    // A live pod's address, quarantined meanwhile: kept from everyone, even here.
    assert!(s.can_hold(ip("10.0.0.20")).is_ok());
    s.occupy(ip("10.0.0.20")).expect("kept");
    land(
        &mut s,
        Work::GiveBack(net("10.0.0.16/28"), rev(8)),
        Ok(Outcome::GaveBack(true)),
    )
    .expect_err("not given back as empty");
    assert_eq!(next_work(&mut s), Some(Work::Reclaim(net("10.0.0.16/28"))));
}

#[test]
fn a_block_etcd_gives_to_another_node_serves_nothing_and_goes_once_empty() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    s.restore_block(net("10.0.0.0/28")).expect("recorded");
    s.occupy(ip("10.0.0.3")).expect("in use");
    assert!(s
        .withheld(ip("10.0.0.3"))
        .is_some_and(|w| w.contains("not yet confirmed")));
    // etcd lists nothing as this node's: a block holding an address here is claimed back.
    synced(&mut s, &n, &[]);
    assert!(s
        .withheld(ip("10.0.0.3"))
        .is_some_and(|w| w.contains("claimed back")));
    assert_eq!(next_work(&mut s), Some(Work::Reclaim(net("10.0.0.0/28"))));
    land(
        &mut s,
        Work::Reclaim(net("10.0.0.0/28")),
        Ok(Outcome::Taken("node \"n2\"".into())),
    )
    .expect_err("a conflict");
    assert!(s.detail().unwrap_or_default().contains("CONFLICT"));
    assert!(s.can_occupy(ip("10.0.0.5")).is_err());
    // Its last address released: nothing here holds it any more; it is forgotten.
    assert!(s.vacate(ip("10.0.0.3")));
    assert!(!s.contains(ip("10.0.0.5")));
    assert_eq!(s.forget(), vec![net("10.0.0.0/28")]);
}

#[test]
fn an_empty_block_etcd_no_longer_lists_is_dropped_at_the_sync() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    s.restore_block(net("10.0.0.0/28")).expect("recorded");
    synced(&mut s, &n, &[block("10.0.0.16/28", 9)]);
    assert!(!s.contains(ip("10.0.0.2")));
    assert_eq!(s.forget(), vec![net("10.0.0.0/28")]);
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.18")));
}

/// A block in doubt (restored after a restart, or after a give-back with no answer: a
/// give-back of it may still reach etcd) is settled by the sync before it hands anything out;
/// a sync that trusted it (started before it fell in doubt) does not confirm it, and the
/// give-backs that follow are conditioned on the write that settled it.
#[test]
fn a_block_in_doubt_serves_only_after_a_sync_settled_it() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    s.restore_block(net("10.0.0.16/28")).expect("recorded");
    let doubt = net("10.0.0.16/28");
    match next_work(&mut s) {
        Some(Work::Sync { trusted, .. }) => assert_eq!(trusted, vec![]),
        other => panic!("{other:?}"),
    }
    // A sync that trusted it as listed (so did not settle it): still in doubt.
    let e = epoch(&n);
    let sync = Work::Sync {
        epoch: e,
        trusted: vec![(doubt, rev(8))],
        pins: false,
        orphaned: Vec::new(),
    };
    let listed = vec![block("10.0.0.0/28", 7), block("10.0.0.16/28", 8)];
    land(&mut s, sync, Ok(Outcome::Synced(mine(listed)))).expect("synced");
    assert!(s
        .withheld(ip("10.0.0.20"))
        .is_some_and(|w| w.contains("not yet confirmed")));
    // Settled: its key written again at revision 12.
    let mut settled = block("10.0.0.16/28", 8);
    settled.revision.modified = 12;
    let sync = Work::Sync {
        epoch: e,
        trusted: vec![(net("10.0.0.0/28"), rev(7))],
        pins: false,
        orphaned: Vec::new(),
    };
    let listed = vec![block("10.0.0.0/28", 7), settled];
    land(&mut s, sync, Ok(Outcome::Synced(mine(listed)))).expect("synced");
    assert_eq!(s.withheld(ip("10.0.0.20")), None);
    // Empty and not needed: given back, conditioned on the settling write.
    s.take_next(ip("10.0.0.2")).expect("take");
    let w = next_work(&mut s);
    let at = KeyRevision {
        create: 8,
        modified: 12,
        write: None,
    };
    assert_eq!(w, Some(Work::GiveBack(doubt, at)));
    // No answer: in doubt again, and the next sync settles it (it trusts only the other).
    land(
        &mut s,
        Work::GiveBack(doubt, at),
        Err("etcd: no answer".into()),
    )
    .expect_err("failed");
    s.retry_at = None;
    match next_work(&mut s) {
        Some(Work::Sync { trusted, .. }) => {
            assert_eq!(trusted, vec![(net("10.0.0.0/28"), rev(7))])
        }
        other => panic!("{other:?}"),
    }
}

/// The result of work started by another source (the one this replaced when the range set
/// was rebuilt) is not taken: it neither changes a block nor ends this source's own work.
#[test]
fn a_result_of_a_replaced_source_is_not_taken() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    s.restore_block(net("10.0.0.16/28")).expect("recorded");
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    assert!(s.in_flight);
    // The old source's give-back finished: its result is left with the old source.
    let old = source(&n);
    *old.inbox.lock().expect("inbox") = Some(Done {
        work: Work::GiveBack(net("10.0.0.16/28"), rev(8)),
        result: Ok(Outcome::GaveBack(true)),
    });
    assert_eq!(s.land(), Ok(Landing::Nothing));
    assert!(s.in_flight, "this source's own sync is still on its way");
    assert!(s.blocks.contains_key(&net("10.0.0.16/28")));
    assert_eq!(s.start_claim().map(|_| ()), None, "one request at a time");
}

#[test]
fn the_first_sync_of_an_epoch_trusts_no_block_so_a_give_back_sent_while_fenced_cannot_land() {
    let n = node("fence_secs = 5");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    // A resync in the same epoch trusts the block as confirmed.
    s.next_sync = None;
    match next_work(&mut s) {
        Some(Work::Sync { trusted, .. }) => {
            assert_eq!(trusted, vec![(net("10.0.0.0/28"), rev(7))])
        }
        other => panic!("{other:?}"),
    }
    // Fenced (away: release-node may have listed its blocks meanwhile), then renewed: the
    // first sync of the new epoch settles every block, confirmed or not.
    n.pretend_renewed(Duration::from_secs(6));
    n.pretend_renewed(Duration::ZERO);
    // (That sync never landed: its claim was dropped.)
    s.in_flight = false;
    match next_work(&mut s) {
        Some(Work::Sync { trusted, .. }) => assert_eq!(trusted, vec![]),
        other => panic!("{other:?}"),
    }
}

/// A claim that found the pool full, or failed, waits before the next claim; the syncs go on
/// meanwhile (a block forced away from this node is found at the next sync, not after the
/// claim's wait).
#[test]
fn a_full_pool_or_a_failed_claim_never_delays_a_sync() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source_wanting(&n, 100);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let claim = next_work(&mut s);
    assert!(matches!(claim, Some(Work::Claim { .. })), "{claim:?}");
    land(
        &mut s,
        claim.clone().expect("a claim"),
        Ok(Outcome::PoolFull("no free block".into())),
    )
    .expect_err("full");
    assert_eq!(next_work(&mut s), None, "no claim while the pool is full");
    // A resync falls due while the claim waits: it runs now.
    s.next_sync = Some(Instant::now());
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    // The same after a claim that failed.
    let mut s = source_wanting(&n, 100);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let claim = next_work(&mut s);
    assert!(matches!(claim, Some(Work::Claim { .. })), "{claim:?}");
    land(
        &mut s,
        claim.expect("a claim"),
        Err("etcd: no answer".into()),
    )
    .expect_err("failed");
    assert_eq!(next_work(&mut s), None, "no claim during its backoff");
    s.next_sync = Some(Instant::now());
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
}

/// A block whose pool is being deleted (the settle read the pool Deleting) is in doubt: it
/// serves nothing, is not given back, and the next sync (soon) looks again; once the pool is
/// Ready again it serves as before.
#[test]
fn a_block_whose_pool_is_being_deleted_is_neither_served_nor_given_back() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    s.restore_block(net("10.0.0.0/28")).expect("recorded");
    s.occupy(ip("10.0.0.3")).expect("in use");
    s.restore_block(net("10.0.0.16/28")).expect("recorded");
    let e = epoch(&n);
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    let doubt = Synced {
        in_doubt: vec![block("10.0.0.0/28", 9), block("10.0.0.16/28", 10)],
        ..Synced::default()
    };
    land(
        &mut s,
        Work::Sync {
            epoch: e,
            trusted: vec![],
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(doubt)),
    )
    .expect("synced");
    for a in ["10.0.0.3", "10.0.0.5", "10.0.0.20"] {
        assert!(
            s.withheld(ip(a))
                .is_some_and(|w| w.contains("being deleted")),
            "{a}"
        );
    }
    assert!(s.detail().unwrap_or_default().contains("DOUBT"));
    assert_eq!(s.peek_next_n(5), Vec::<IpAddr>::new());
    // Not given back (not even the empty one), not claimed back: nothing until a sync says.
    // (It looks for another block: the pool is not Ready, nothing is claimed.)
    let w = next_work(&mut s);
    assert!(matches!(w, Some(Work::Claim { .. })), "{w:?}");
    land(
        &mut s,
        w.expect("a claim"),
        Ok(Outcome::PoolNotReady("pool \"p\" is being deleted".into())),
    )
    .expect_err("not ready");
    assert_eq!(next_work(&mut s), None);
    assert_eq!(s.forget(), Vec::<IpNet>::new());
    // The next sync comes within a couple of seconds, not a resync_secs.
    assert!(s
        .next_sync
        .is_some_and(|t| t <= Instant::now() + Duration::from_millis(1300)));
    s.next_sync = Some(Instant::now());
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    // The deletion was refused: the pool is Ready, the blocks are this node's.
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 11), block("10.0.0.16/28", 12)],
    );
    assert_eq!(s.withheld(ip("10.0.0.5")), None);
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.2")));
}

/// A block of a pool that is gone is never served again, and is given back once nothing in
/// it is in use (at once when empty; else when its last address is released).
#[test]
fn a_block_of_a_pool_that_is_gone_is_given_back_once_empty() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    s.restore_block(net("10.0.0.0/28")).expect("recorded");
    s.occupy(ip("10.0.0.3")).expect("in use");
    let e = epoch(&n);
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    let gone = Synced {
        orphaned: vec![block("10.0.0.0/28", 9)],
        ..Synced::default()
    };
    land(
        &mut s,
        Work::Sync {
            epoch: e,
            trusted: vec![],
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(gone)),
    )
    .expect("synced");
    assert!(s
        .withheld(ip("10.0.0.5"))
        .is_some_and(|w| w.contains("gone")));
    let w = next_work(&mut s);
    assert!(matches!(w, Some(Work::Claim { .. })), "in use, kept: {w:?}");
    land(&mut s, w.expect("a claim"), Err("no pool \"p\"".into())).expect_err("no pool");
    assert!(s.vacate(ip("10.0.0.3")));
    assert_eq!(
        next_work(&mut s),
        Some(Work::GiveBack(net("10.0.0.0/28"), rev(9)))
    );
}

/// A block of a pool that is gone, held here while its pods run, is not settled again by
/// every later sync (a write at each resync, all an idle node would write): the sync lists it
/// as it was, and only a block written since is settled.
#[test]
fn a_block_of_a_gone_pool_is_not_settled_again_at_every_sync() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    assert!(matches!(next_work(&mut s), Some(Work::Sync { .. })));
    let gone = block("10.0.0.16/28", 9);
    let listed = Synced {
        orphaned: vec![gone.clone()],
        ..Synced::default()
    };
    let sync = Work::Sync {
        epoch: epoch(&n),
        trusted: Vec::new(),
        pins: false,
        orphaned: Vec::new(),
    };
    land(&mut s, sync, Ok(Outcome::Synced(listed))).expect("synced");
    assert!(s.withheld(ip("10.0.0.17")).is_some(), "never served again");
    s.next_sync = Some(Instant::now());
    match next_work(&mut s) {
        Some(Work::Sync { orphaned, .. }) => {
            assert_eq!(orphaned, vec![(net("10.0.0.16/28"), rev(9))])
        }
        other => panic!("{other:?}"),
    }
}
