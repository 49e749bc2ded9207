//! Blocks coming and going under held addresses, each found by the simulation:
//! blocks of another size over addresses held here (a pool made anew with other block sizes
//! while this node still held addresses in a block of the old pool: the new block's allocator
//! knew nothing of the old block's addresses, so it could hand out an address a pod here held,
//! and after a restart the daemon refused to start); and a block dropped and claimed again
//! before the engine struck its record.

use super::tests::{block, ip, land, net, node, source, synced};
use super::*;
use crate::cluster::work::Outcome;
use crate::source::BlockSource;

/// A serving node's source, `blocks` (at revision 7) synced as its own when given.
fn serving(blocks: &[&str]) -> (Arc<ClusterNode>, ClusterSource) {
    let n = node("");
    n.pretend_renewed(std::time::Duration::ZERO);
    let mut s = source(&n);
    if !blocks.is_empty() {
        let listed: Vec<_> = blocks.iter().map(|b| block(b, 7)).collect();
        synced(&mut s, &n, &listed);
    }
    (n, s)
}

/// A claim in the pool's 10.0.0.0/24 lands: `won` (at revision 9) is this node's.
fn claim_lands(s: &mut ClusterSource, won: &str) {
    land(
        s,
        Work::Claim {
            cidrs: vec![net("10.0.0.0/24")],
        },
        Ok(Outcome::Claimed(block(won, 9))),
    )
    .expect("claimed");
}

/// A source that holds `held` in `old` (lost: the store no longer has it) and then wins `new`.
fn lost_then_claimed(old: &str, held: &[&str], new: &str) -> (Arc<ClusterNode>, ClusterSource) {
    let (n, mut s) = serving(&[old]);
    for h in held {
        s.occupy(ip(h)).expect("held here");
    }
    // Gone from the store (a forced release), and no block of the pool as it is now.
    synced(&mut s, &n, &[]);
    assert_eq!(s.blocks[&net(old)].state, BlockState::Reclaiming);
    land(
        &mut s,
        Work::Reclaim(net(old)),
        Ok(Outcome::Taken(
            "nobody: it is not a block of the pool".into(),
        )),
    )
    .expect_err("lost");
    claim_lands(&mut s, new);
    (n, s)
}

/// What a restart of the daemon rebuilds: the recorded blocks, then the held addresses.
fn restarted(n: &Arc<ClusterNode>, s: &ClusterSource, held: &[&str]) -> ClusterSource {
    let mut again = source(n);
    for b in s.recorded_blocks() {
        again.restore_block(b).expect("a recorded block");
    }
    for h in held {
        again
            .occupy(ip(h))
            .expect("every held address lies in a block");
    }
    again
}

#[test]
fn a_bigger_block_over_a_lost_one_takes_its_addresses_over() {
    let held = ["10.0.0.18", "10.0.0.19"];
    let (n, mut s) = lost_then_claimed("10.0.0.16/28", &held, "10.0.0.0/27");
    // The engine writes the new block as held and strikes the old one, in one change set.
    assert_eq!(s.record(), vec![net("10.0.0.0/27")]);
    assert_eq!(s.forget(), vec![net("10.0.0.16/28")]);
    let next = s.peek_next_n(40);
    assert!(!next.is_empty());
    for h in held {
        assert!(!next.contains(&ip(h)), "{h} is held here: {next:?}");
        assert!(
            s.withheld(ip(h)).is_none(),
            "{h} is in a block of this node's now"
        );
    }
    let again = restarted(&n, &s, &held);
    assert!(again.contains(ip("10.0.0.18")));
}

#[test]
fn a_smaller_block_inside_a_lost_one_hands_out_nothing_held_here() {
    // 10.0.0.16 is the new block's own network address: it stays with the old block.
    let held = ["10.0.0.16", "10.0.0.20", "10.0.0.40"];
    let (n, s) = lost_then_claimed("10.0.0.0/26", &held, "10.0.0.16/28");
    let next = s.peek_next_n(40);
    assert!(!next.is_empty());
    for h in held {
        assert!(!next.contains(&ip(h)), "{h} is held here: {next:?}");
    }
    assert!(s.withheld(ip("10.0.0.20")).is_none(), "in the new block");
    assert!(
        s.withheld(ip("10.0.0.40")).is_some(),
        "only in the lost block"
    );
    let mut again = restarted(&n, &s, &held);
    // A DEL of each frees it where it is held.
    for h in held {
        assert!(again.vacate(ip(h)), "{h}");
    }
}

#[test]
fn after_a_restart_the_block_confirmed_takes_over_what_was_restored_into_old_ones() {
    let (n, mut s) = serving(&[]);
    // Recorded before the restart: the new /26 and an old /27 inside it, both holding.
    s.restore_block(net("10.0.0.0/26")).expect("restored");
    s.restore_block(net("10.0.0.0/27")).expect("restored");
    for h in ["10.0.0.2", "10.0.0.3", "10.0.0.40"] {
        s.occupy(ip(h)).expect("held");
    }
    synced(&mut s, &n, &[block("10.0.0.0/26", 9)]);
    let next = s.peek_next_n(60);
    for h in ["10.0.0.2", "10.0.0.3", "10.0.0.40"] {
        assert!(!next.contains(&ip(h)), "{h} is held here: {next:?}");
    }
    assert!(
        !s.blocks.contains_key(&net("10.0.0.0/27")),
        "emptied, dropped"
    );
}

#[test]
fn a_block_claimed_back_takes_over_too() {
    let (n, mut s) = serving(&[]);
    s.restore_block(net("10.0.0.0/26")).expect("restored");
    s.restore_block(net("10.0.0.0/27")).expect("restored");
    s.occupy(ip("10.0.0.2")).expect("held, in the /27");
    s.occupy(ip("10.0.0.40")).expect("held, in the /26");
    // The store lists neither: both are claimed back; the /26 is won back.
    synced(&mut s, &n, &[]);
    land(
        &mut s,
        Work::Reclaim(net("10.0.0.0/26")),
        Ok(Outcome::Reclaimed(super::tests::rev(12))),
    )
    .expect("claimed back");
    let next = s.peek_next_n(60);
    assert!(next.len() > 50, "{next:?}");
    assert!(!next.contains(&ip("10.0.0.2")) && !next.contains(&ip("10.0.0.40")));
    assert!(
        !s.blocks.contains_key(&net("10.0.0.0/27")),
        "emptied, dropped"
    );
}

#[test]
fn a_smaller_block_claimed_inside_a_confirmed_one_leaves_the_bigger_one_serving_nothing() {
    // The pool moved to smaller blocks while this node served a bigger one it had not yet
    // synced (a forced release): the new block wins; the old one serves nothing more.
    let (_n, mut s) = serving(&["10.0.0.0/27"]);
    s.occupy(ip("10.0.0.2")).expect("held");
    s.occupy(ip("10.0.0.20")).expect("held");
    claim_lands(&mut s, "10.0.0.16/28");
    let next = s.peek_next_n(40);
    assert!(!next.is_empty());
    assert!(
        next.iter().all(|a| net("10.0.0.16/28").contains(a)),
        "only the new block serves: {next:?}"
    );
    assert!(!next.contains(&ip("10.0.0.20")));
    assert!(
        s.withheld(ip("10.0.0.5")).is_some(),
        "the old block serves nothing"
    );
}

#[test]
fn a_block_dropped_and_claimed_again_before_the_engine_struck_it_is_not_struck() {
    // Found by the simulation: the engine writes what `forget` returns in its background pass;
    // a block dropped and claimed again before that pass had its new record struck, and the
    // daemon refused to start (its pods' addresses lay in no block it could restore).
    let (n, mut s) = serving(&["10.0.0.16/28"]);
    s.take_next(ip("10.0.0.18"))
        .expect("taken: the block is recorded");
    assert!(s.vacate(ip("10.0.0.18")));
    // Not listed any more, and empty: dropped, to be struck.
    synced(&mut s, &n, &[]);
    assert!(s.blocks.is_empty());
    // Claimed again before the engine's pass.
    claim_lands(&mut s, "10.0.0.16/28");
    assert_eq!(s.forget(), Vec::<IpNet>::new());
}

/// A sync's outcome: `mine` this node's, `orphaned` of a pool gone or made anew.
fn synced_with_orphans(
    s: &mut ClusterSource,
    n: &ClusterNode,
    mine: &[crate::cluster::vocab::Block],
    orphaned: &[crate::cluster::vocab::Block],
) {
    let e = super::tests::epoch(n);
    let trusted = super::tests::trusted(s);
    land(
        s,
        Work::Sync {
            epoch: e,
            trusted,
            pins: false,
            orphaned: Vec::new(),
        },
        Ok(Outcome::Synced(crate::cluster::work::Synced {
            mine: mine.to_vec(),
            orphaned: orphaned.to_vec(),
            ..Default::default()
        })),
    )
    .expect("synced");
}

/// A block of the old size, created late (its claim's answer never came) after the pool was
/// made anew with bigger blocks, lies under this node's block of the new pool: it is given
/// back, and the new block serves its addresses. Before, each sync's takeover by the new
/// block dropped it from the source without a give-back, and the next sync found and
/// settled it again, for good.
#[test]
fn a_late_block_of_the_old_size_under_a_new_one_is_given_back() {
    let (n, mut s) = serving(&["10.0.0.0/27"]);
    s.occupy(ip("10.0.0.3")).expect("in use");
    for _ in 0..2 {
        synced_with_orphans(
            &mut s,
            &n,
            &[block("10.0.0.0/27", 7)],
            &[block("10.0.0.0/28", 11)],
        );
    }
    assert_eq!(
        s.blocks.get(&net("10.0.0.0/28")).map(|b| b.state.clone()),
        Some(BlockState::Orphaned(super::tests::rev(11))),
        "kept as orphaned until given back"
    );
    // Addresses in both are the new block's: handed out from it, never from the orphan.
    let next = s.peek_next_n(8);
    assert!(!next.contains(&ip("10.0.0.3")));
    assert!(next.iter().all(|a| s.withheld(*a).is_none()), "{next:?}");
    assert_eq!(
        super::tests::next_work(&mut s),
        Some(Work::GiveBack(net("10.0.0.0/28"), super::tests::rev(11)))
    );
}
