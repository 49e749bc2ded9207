//! The pins that keep a departed node's blocks: a release keeps every block a pin was made in
//! (its pinned addresses are kept there for their owners), and no node's keeper looks after
//! the pins of a node whose daemon is gone. So the look of the release of departed nodes
//! does, for the blocks of every node whose daemon does not hold its name: a pin nobody holds
//! whose owner (a StatefulSet's ordinal, a VM) has been gone `pin_ttl_secs`, as the store
//! measures the time ([`PinStore::owner_gone_for`]), is deleted, conditioned on the pin as
//! read; its block then goes back at the node's release. So is, whether its owner is gone or
//! not, an owner's second pin there (on the Kubernetes API, a creation that landed late): one
//! nobody holds while the owner's other pin is held, or sorts first (what a lookup by owner
//! finds, which the owner's next pod takes). A pin someone holds is its holder's to let go of,
//! at its pod's DEL or by its keeper.
//!
//! [`PinStore::owner_gone_for`]: crate::cluster::datastore::PinStore::owner_gone_for

use std::collections::BTreeSet;

use super::Directory;
use crate::cluster::datastore::Datastore;
use crate::cluster::pin::{Pin, PinRead};
use crate::cluster::vocab::Block;

/// What a look did with a pin nobody holds in a departed node's block.
#[derive(Debug)]
pub enum PinOutcome {
    /// Deleted: its owner has been gone long enough (why it is gone).
    Ended { pin: Pin, why: String },
    /// Kept: its owner is there, or not gone long enough yet (why).
    Waiting { pin: Pin, why: String },
    /// Its owner could not be asked, or a write failed: tried again at the next look.
    Failed { pin: Pin, why: String },
}

impl PinOutcome {
    pub fn pin(&self) -> &Pin {
        match self {
            PinOutcome::Ended { pin, .. }
            | PinOutcome::Waiting { pin, .. }
            | PinOutcome::Failed { pin, .. } => pin,
        }
    }
}

/// The pins nobody holds (of `pins`, the store's as read) made in `blocks` of the nodes in
/// `away`, or of addresses set aside (in no block: only a node that held one knows it, and
/// it may be gone), each ended once its owner has been gone `ttl` seconds.
pub async fn end_gone(
    store: &dyn Datastore,
    pins: Vec<PinRead>,
    blocks: &[Block],
    away: &BTreeSet<&String>,
    ttl: u64,
    dir: &dyn Directory,
) -> Vec<PinOutcome> {
    let theirs: Vec<&Block> = blocks
        .iter()
        .filter(|b| away.contains(&b.owner.node))
        .collect();
    let mut out = Vec::new();
    let all: Vec<Pin> = pins.iter().map(|r| r.pin.clone()).collect();
    for read in pins {
        let p = &read.pin;
        let kept = p.set_aside
            || (!crate::bugs::on(crate::bugs::Bug::DepartedPinsKept)
                && theirs
                    .iter()
                    .any(|b| b.pool == p.pool && p.made_in(&b.block, &b.revision)));
        if !kept || !p.holders.is_empty() {
            continue;
        }
        if second(p, &all) && !crate::bugs::on(crate::bugs::Bug::DepartedSecondPinsKept) {
            out.push(match store.delete_pin(&read).await {
                Ok(true) => PinOutcome::Ended {
                    pin: read.pin.clone(),
                    why: format!("a second pin of {}, whose pods take the other", p.owner),
                },
                Ok(false) => PinOutcome::Waiting {
                    pin: read.pin.clone(),
                    why: "the pin changed while it was being ended".into(),
                },
                Err(e) => PinOutcome::Failed {
                    pin: read.pin.clone(),
                    why: e.to_string(),
                },
            });
            continue;
        }
        out.push(judge(store, read, ttl, dir).await);
    }
    out
}

/// Whether `pin`, held by nobody, is its owner's second of `all`: another of the owner's is
/// held, or sorts first by name (what a lookup by owner finds).
fn second(pin: &Pin, all: &[Pin]) -> bool {
    let name = crate::cluster::pin::address_name(&pin.address);
    all.iter()
        .filter(|o| o.owner == pin.owner && o.address != pin.address)
        .any(|o| !o.holders.is_empty() || crate::cluster::pin::address_name(&o.address) < name)
}

/// One pin nobody holds: ended, kept, or not judged.
async fn judge(store: &dyn Datastore, read: PinRead, ttl: u64, dir: &dyn Directory) -> PinOutcome {
    let pin = read.pin.clone();
    let failed = |why: String| PinOutcome::Failed {
        pin: pin.clone(),
        why,
    };
    let gone = match dir.owner_gone(&pin.owner).await {
        Ok(g) => g,
        Err(e) => return failed(format!("asking whether {} is gone: {e}", pin.owner)),
    };
    let Some(why) = gone else {
        if let Err(e) = store.owner_back(&read).await {
            return failed(e.to_string());
        }
        return PinOutcome::Waiting {
            pin: pin.clone(),
            why: format!("kept for {}, which is there", pin.owner),
        };
    };
    let (for_secs, now) = match store.owner_gone_for(&read).await {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    if for_secs < ttl as i64 {
        return PinOutcome::Waiting {
            pin: pin.clone(),
            why: format!("{why} for {for_secs} s (pin_ttl_secs {ttl})"),
        };
    }
    match store.delete_pin(&now).await {
        Ok(true) => PinOutcome::Ended { pin, why },
        Ok(false) => PinOutcome::Waiting {
            pin: pin.clone(),
            why: "the pin changed while it was being ended".into(),
        },
        Err(e) => failed(e.to_string()),
    }
}
