//! The watches' steps in a run whose daemons watch the store, and what the checker keeps of
//! them: a block a node's watch told it is no longer the node's stops serving at once (docs/cluster-mode.md:
//! a block deleted or re-owned stops serving within a second while connected). A hand-out from
//! it, picked after the daemon was told, is no longer excused by `release-node --force`'s
//! window (which otherwise lasts until the node's next sync).

use std::net::IpAddr;

use ipnet::IpNet;
use tokio::time::Instant;

use crate::check::StoreBlock;
use crate::watch::HeardGone;
use crate::world::World;

/// How long after a watch's news a daemon's pick may still be one it made before them: the
/// news are taken in by its watch task at once, and the pick's time is the engine's clock,
/// in whole milliseconds.
const TAKEN_IN_MS: u64 = 2;

/// One block within the other (the pool made anew with blocks of another size).
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// One open watch, picked, hears what changed since it last heard.
pub(crate) fn hear(w: &mut World) {
    let n = w.net.watches(|ws| ws.count());
    if n == 0 {
        return;
    }
    let i = w.choices.pick(n as u32) as usize;
    let shared = &w.shared;
    let (from, heard) = w.net.watches(|ws| (ws.from(i), ws.hear(i, shared)));
    let Some(from) = from else {
        return;
    };
    w.heard += heard.events as u64;
    let Some(slot) = w.slots.get(from) else {
        return;
    };
    let who = slot.name.clone();
    w.note(format!(
        "{who} (slot {from})'s watch heard {} change(s){}",
        heard.events,
        match heard.gone.is_empty() {
            true => String::new(),
            false => format!(", blocks no longer its: {:?}", heard.gone),
        }
    ));
    let Some(daemon) = w.slots[from].daemon.as_ref().map(|d| d.id) else {
        return;
    };
    let now = Instant::now();
    for block in heard.gone {
        // Told late, of a block its node owns again: nothing to stop.
        let owned = w
            .seen
            .blocks
            .iter()
            .any(|(b, o, _)| overlap(b, &block) && *o == who);
        if !owned {
            w.heard_gone.push(HeardGone {
                slot: from,
                daemon,
                block,
                at: now,
            });
        }
    }
}

/// An open watch cut (its stream breaks), or the store's history compacted.
pub(crate) fn watch_fault(w: &mut World) {
    let n = w.net.watches(|ws| ws.count());
    match w.choices.pick(3) {
        0 | 1 if n > 0 => {
            let i = w.choices.pick(n as u32) as usize;
            let from = w.net.watches(|ws| {
                let from = ws.from(i);
                ws.cut(i);
                from
            });
            w.note(format!("a watch of slot {from:?} cut"));
        }
        _ => {
            w.shared.compact();
            w.note("the store's history compacted: watches from before it are told so".into());
        }
    }
}

impl World {
    /// The store after a change: a block its node owns again (or one over or within it, the
    /// pool made anew with blocks of another size) is served again.
    pub(crate) fn owned_again(&mut self, after: &[StoreBlock]) {
        let slots = &self.slots;
        self.heard_gone.retain(|h| {
            !after
                .iter()
                .any(|(b, o, _)| overlap(b, &h.block) && *o == slots[h.slot].name)
        });
    }

    /// Slot `slot`'s daemon was told, before it picked `ip` at `decided`, that the block of
    /// `ip` is no longer its node's: when.
    pub(crate) fn told_gone(&self, slot: usize, ip: IpAddr, decided: Instant) -> Option<u64> {
        let daemon = self.slots[slot].daemon.as_ref()?.id;
        self.heard_gone
            .iter()
            .filter(|h| h.slot == slot && h.daemon == daemon && h.block.contains(&ip))
            .map(|h| self.ms_of(h.at))
            .find(|at| at + TAKEN_IN_MS <= self.ms_of(decided))
    }
}
