//! What a sync's landing does, in the cases mutation testing found the simulation's short runs
//! blind to (docs/simulation.md): a race made on purpose (a block's state
//! changes between the moment a sync is sent, trusting the blocks confirmed then, and the
//! moment its listing lands), and the pace of the looks at blocks in doubt.

use std::time::Duration;

use super::tests::{block, epoch, ip, land, mine, net, node, rev, source, synced, trusted};
use super::*;
use crate::cluster::work::Outcome;
use crate::source::BlockSource;

/// A block confirmed when a sync was sent, whose give-back began before the sync landed: it
/// stays being given back (the give-back may apply at any moment), and nothing is handed out
/// from it. Before, a landing that took every listed block not "in doubt" as confirmed would
/// have made it serve again while its give-back was on its way (a mutant of `synced_with`
/// that the simulation's short runs did not catch: docs/simulation.md, mutation testing).
#[test]
fn a_sync_landing_after_a_give_back_began_does_not_serve_the_block_again() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    synced(&mut s, &n, &[block("10.0.0.0/26", 7)]);
    let sent_trusting = trusted(&s);
    assert_eq!(sent_trusting, vec![(net("10.0.0.0/26"), rev(7))]);
    s.blocks.get_mut(&net("10.0.0.0/26")).expect("held").state = BlockState::Returning(rev(7));
    let sync = Work::Sync {
        epoch: epoch(&n),
        trusted: sent_trusting,
        pins: false,
        orphaned: Vec::new(),
    };
    let listed = mine(vec![block("10.0.0.0/26", 7)]);
    land(&mut s, sync, Ok(Outcome::Synced(listed))).expect("landed");
    assert_eq!(
        s.blocks[&net("10.0.0.0/26")].state,
        BlockState::Returning(rev(7))
    );
    // And the ADD's error says why.
    let why = s
        .withheld(ip("10.0.0.5"))
        .expect("nothing handed out from it");
    assert!(
        why.contains("block 10.0.0.0/26") && why.contains("being given back"),
        "{why}"
    );
}

/// Blocks in doubt (their pool being deleted, or their CIDR on its way out) are looked at
/// again soon, then less and less often: each look settles them (a write), so the wait doubles
/// up to `resync_secs` (a pool left half deleted must not cost a write a second per block).
#[test]
fn blocks_in_doubt_are_looked_at_less_and_less_often() {
    let n = node("resync_secs = 600\n");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    let mut waits = Vec::new();
    for _ in 0..3 {
        let sync = Work::Sync {
            epoch: epoch(&n),
            trusted: Vec::new(),
            pins: false,
            orphaned: Vec::new(),
        };
        let listed = crate::cluster::work::Synced {
            in_doubt: vec![block("10.0.0.0/26", 7)],
            ..Default::default()
        };
        land(&mut s, sync, Ok(Outcome::Synced(listed))).expect("landed");
        let next = s.next_sync.expect("a look planned");
        waits.push(next.saturating_duration_since(Instant::now()));
    }
    // 1 s, 2 s, 4 s, each within the jitter's [0.8, 1.2).
    assert!(waits[0] < Duration::from_millis(1300), "{waits:?}");
    assert!(waits[2] > Duration::from_millis(3000), "{waits:?}");
}

/// `ipoolctl status`'s line for the source: each block with what it holds, and nothing about
/// malformed keys when there are none.
#[test]
fn status_says_what_each_block_holds() {
    let n = node("");
    n.pretend_renewed(Duration::ZERO);
    let mut s = source(&n);
    synced(&mut s, &n, &[block("10.0.0.0/26", 7)]);
    s.occupy(ip("10.0.0.3")).expect("in use");
    assert_eq!(
        s.describe_blocks(),
        "cluster pool \"p\": 1 block(s) here: 10.0.0.0/26 (1 used)"
    );
}
