//! The pins this node knows (see [`crate::cluster::pin`]), by pool: what its sources keep
//! from everyone but the pin's owner, on every path, and whether this node holds one. Learnt
//! from its own writes (a pin created, held, let go) and from the listings of its syncs (a
//! subnet pool's first sync of each serving epoch, and every sync while it knows a pin in the
//! pool). A listing sent before a write of this node's lands after it without undoing it: a
//! pin written here after the listing was sent stays as written, one created here is not
//! dropped for being absent from it; and a write on its way or unanswered is kept as written
//! whatever any listing says, until this node's next word on that pin. (Knowing a pin longer
//! than it stands only keeps an address out longer.)

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::ClusterNode;
use crate::cluster::ippool::Reserved;
use crate::cluster::pin::Pin;

/// The pins of every pool, as this node knows them.
#[derive(Default)]
pub(super) struct PinBook {
    /// This node's own writes so far (each stamps what it wrote).
    writes: u64,
    /// The store resets seen so far ([`ClusterNode::pins_reset`]).
    resets: u64,
    pools: HashMap<String, PoolPins>,
    /// Whether the engine holds an address for the pod of a uid here
    /// ([`ClusterNode::set_attachments`]).
    attachments: Option<Attachments>,
}

/// Whether this node's engine holds an address for the pod of a uid (in any network).
pub type Attachments = Arc<dyn Fn(IpAddr, &str) -> bool + Send + Sync>;

#[derive(Default)]
struct PoolPins {
    /// By address: the pin, and the write of this node's that last told of it (0: a listing).
    by_address: BTreeMap<IpAddr, (Pin, u64)>,
    /// The same addresses, as kept out for the sources (one address each).
    kept: Arc<Vec<Reserved>>,
}

impl PoolPins {
    fn rebuild(&mut self) {
        self.kept = Arc::new(
            self.by_address
                .iter()
                .map(|(ip, (pin, _))| Reserved {
                    cidr: IpNet::from(*ip),
                    reason: format!("pinned for {}", pin.owner),
                })
                .collect(),
        );
    }
}

/// The stamp of a pin whose write is on its way or unanswered: no listing undoes it.
const WRITING: u64 = u64::MAX;
/// The stamp of a pin known before the store was found reset (restored from an older backup,
/// which may have lost it): no listing undoes it; the next sync of its pool makes it again
/// where the store lacks it ([`ClusterNode::pins_to_assert`]), before its blocks serve.
const ASSERTING: u64 = u64::MAX - 1;

/// A listing of a pool's pins, started: where this node's writes stood when it was sent.
pub struct PinListing(u64);

impl ClusterNode {
    /// Tells this node how to ask its engine whether it holds an address for a pod (for the
    /// holds it confirms, [`ClusterNode::holds_to_confirm`]). Until it is told, it confirms
    /// none.
    pub fn set_attachments(&self, attachments: Attachments) {
        self.pins.lock().expect("pins lock").attachments = Some(attachments);
    }

    /// The holds of pins this node confirms now ([`Holder::key`]): those of its own, known as
    /// landed (not a write on its way or unanswered), whose pod holds the address here. A pin
    /// whose creation landed late (its ADD had failed, the address went to another pod) is
    /// not: another node may take over only a confirmed hold of a node gone
    /// ([`NodeState::confirms`]).
    ///
    /// [`Holder::key`]: crate::cluster::pin::Holder::key
    /// [`NodeState::confirms`]: crate::cluster::vocab::NodeState::confirms
    pub fn holds_to_confirm(&self) -> Vec<String> {
        let me = self.name();
        let (held, attached) = {
            let book = self.pins.lock().expect("pins lock");
            let held: Vec<(IpAddr, crate::cluster::pin::Holder)> = book
                .pools
                .values()
                .flat_map(|p| p.by_address.values())
                .filter(|(_, stamp)| *stamp != WRITING)
                .flat_map(|(pin, _)| {
                    pin.holders
                        .iter()
                        .filter(|h| h.node == me)
                        .map(|h| (pin.address, h.clone()))
                })
                .collect();
            (held, book.attachments.clone())
        };
        let Some(attached) = attached else {
            return Vec::new();
        };
        let mut keys: Vec<String> = held
            .into_iter()
            .filter(|(ip, h)| attached(*ip, &h.uid))
            .map(|(ip, h)| h.key(ip))
            .collect();
        keys.sort();
        keys
    }

    /// A listing of pins is being sent now.
    pub fn pins_listing(&self) -> PinListing {
        PinListing(self.pins.lock().expect("pins lock").writes)
    }

    /// What a listing of `pool`'s pins found (see the module's note on order).
    pub fn pins_listed(&self, pool: &str, listing: PinListing, pins: Vec<Pin>) {
        let mut book = self.pins.lock().expect("pins lock");
        let p = book.pools.entry(pool.to_string()).or_default();
        let listed: BTreeMap<IpAddr, Pin> = pins
            .into_iter()
            .filter(|pin| pin.pool == pool)
            .map(|pin| (pin.address, pin))
            .collect();
        // Gone from the store, unless written here since the listing was sent (or known from
        // before a reset: made again by the sync that listed it).
        p.by_address
            .retain(|ip, (_, stamp)| listed.contains_key(ip) || *stamp > listing.0);
        for (ip, pin) in listed {
            match p.by_address.get(&ip) {
                // The store has it again, with this node's holds: as it says from now on.
                Some((known, ASSERTING))
                    if known.owner == pin.owner && holds_kept(known, &pin, self.name()) =>
                {
                    p.by_address.insert(ip, (pin, 0));
                }
                Some((_, stamp)) if *stamp > listing.0 => {}
                _ => {
                    p.by_address.insert(ip, (pin, 0));
                }
            }
        }
        p.rebuild();
        self.count_pins(pool, &book);
    }

    /// The store was found reset: every pin known here is kept whatever listings say, until
    /// the sync of its pool has made it again where the store lacks it.
    pub fn pins_reset(&self) {
        // The bug, put back: the pins known here left as they were, for the first listing of
        // the reset store to drop.
        if crate::bugs::on(crate::bugs::Bug::PinsForgottenAtReset) {
            return;
        }
        let mut book = self.pins.lock().expect("pins lock");
        book.resets += 1;
        let mut kept = 0;
        for p in book.pools.values_mut() {
            for (_, stamp) in p.by_address.values_mut() {
                if *stamp != WRITING {
                    *stamp = ASSERTING;
                    kept += 1;
                }
            }
        }
        if kept > 0 {
            tracing::warn!(node = %self.name(), pins = kept, "the store was reset: the pins known here are made again where it lacks them before their blocks serve");
        }
    }

    /// The store resets seen so far: a pin's making again that began at `resets` is judged
    /// by [`ClusterNode::pin_asserted`] and [`ClusterNode::pin_unasserted_since`].
    pub fn pins_resets(&self) -> u64 {
        self.pins.lock().expect("pins lock").resets
    }

    /// The answer to a pin's making again after a reset, begun when `resets` resets had been
    /// seen: known as it says, unless the store was found reset again since (its answer tells
    /// of the store before that reset, which may have lost the pin again: it stays to be
    /// made again).
    pub fn pin_asserted(&self, pin: &Pin, resets: u64) {
        self.pin_stamped_since(pin, 0, Some(resets));
    }

    /// [`ClusterNode::pin_unasserted`], for a making again begun when `resets` resets had
    /// been seen: nothing, if the store was found reset again since.
    pub fn pin_unasserted_since(&self, pin: &Pin, resets: u64) {
        self.unasserted_since(pin, Some(resets));
    }

    /// A pin known from before a reset that this node cannot make again (the store has
    /// another there, or its block is not this node's as it was made in): known as listings
    /// say from now on.
    pub fn pin_unasserted(&self, pin: &Pin) {
        self.unasserted_since(pin, None);
    }

    fn unasserted_since(&self, pin: &Pin, resets: Option<u64>) {
        let mut book = self.pins.lock().expect("pins lock");
        if reset_since(&book, resets) {
            return;
        }
        if let Some(p) = book.pools.get_mut(&pin.pool) {
            if let Some((known, stamp)) = p.by_address.get_mut(&pin.address) {
                if known.owner == pin.owner && *stamp == ASSERTING {
                    *stamp = 0;
                }
            }
        }
    }

    /// The pins of `pool` known from before a reset that no listing since has shown.
    pub fn pins_to_assert(&self, pool: &str) -> Vec<Pin> {
        let book = self.pins.lock().expect("pins lock");
        book.pools
            .get(pool)
            .map(|p| {
                p.by_address
                    .values()
                    .filter(|(_, stamp)| *stamp == ASSERTING)
                    .map(|(pin, _)| pin.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pins of `pool` to make again after a reset that this node hosts (their address in
    /// one of `mine`, its blocks as listed) or holds. One known from a listing alone protects
    /// nothing of this node's, and made again here it would race the hand-outs of the node
    /// whose block it lies in, which knows nothing of it: known as listings say from now on.
    pub fn pins_to_assert_here(
        &self,
        pool: &str,
        mine: &[crate::cluster::vocab::Block],
    ) -> Vec<Pin> {
        let (ours, others): (Vec<Pin>, Vec<Pin>) =
            self.pins_to_assert(pool).into_iter().partition(|pin| {
                let hosted = !pin.set_aside && mine.iter().any(|b| b.block.contains(&pin.address));
                let held = pin.holders.iter().any(|h| h.node == self.name());
                hosted || held || crate::bugs::on(crate::bugs::Bug::OthersPinsReasserted)
            });
        for pin in &others {
            self.pin_unasserted(pin);
        }
        ours
    }

    /// A pin as this node is about to write it (created, held): known as written until a
    /// later word of this node's on it, whatever listings say meanwhile (the write may land
    /// after a listing read the store, or land though its answer was lost).
    pub fn pin_writing(&self, pin: &Pin) {
        self.pin_stamped(pin, WRITING);
    }

    /// A pin as this node just wrote or read it (created, held, let go).
    pub fn pin_known(&self, pin: &Pin) {
        self.pin_stamped(pin, 0);
    }

    fn pin_stamped(&self, pin: &Pin, writing: u64) {
        self.pin_stamped_since(pin, writing, None);
    }

    /// [`ClusterNode::pin_stamped`], unless the store was found reset since `resets` resets
    /// had been seen (judged under the book's lock, with the stamp).
    fn pin_stamped_since(&self, pin: &Pin, writing: u64, resets: Option<u64>) {
        let mut book = self.pins.lock().expect("pins lock");
        if reset_since(&book, resets) {
            return;
        }
        book.writes += 1;
        let stamp = book.writes.max(writing);
        let p = book.pools.entry(pin.pool.clone()).or_default();
        p.by_address.insert(pin.address, (pin.clone(), stamp));
        p.rebuild();
        self.count_pins(&pin.pool, &book);
    }

    fn count_pins(&self, pool: &str, book: &PinBook) {
        let Some(p) = book.pools.get(pool) else {
            return;
        };
        let me = self.name();
        let held = p
            .by_address
            .values()
            .filter(|(pin, _)| pin.holders.iter().any(|h| h.node == me))
            .count();
        self.metrics.cluster.pins(pool, p.by_address.len(), held);
    }

    /// A pin this node deleted (void: its block is no longer the one it was made in), or
    /// found not written: forgotten, unless the book holds another pin of its address.
    pub fn pin_gone(&self, pin: &Pin) {
        let mut book = self.pins.lock().expect("pins lock");
        book.writes += 1;
        if let Some(p) = book.pools.get_mut(&pin.pool) {
            let same = |(k, _): &(Pin, u64)| k.owner == pin.owner && k.block_id == pin.block_id;
            if p.by_address.get(&pin.address).is_some_and(same) {
                p.by_address.remove(&pin.address);
            }
            p.rebuild();
        }
        self.count_pins(&pin.pool, &book);
    }

    /// The pinned addresses of `pool`, kept out (no I/O).
    pub fn pool_pinned(&self, pool: &str) -> Arc<Vec<Reserved>> {
        self.pins
            .lock()
            .expect("pins lock")
            .pools
            .get(pool)
            .map(|p| p.kept.clone())
            .unwrap_or_default()
    }

    /// The pin of `ip` in `pool`, as known here.
    pub fn pin_at(&self, pool: &str, ip: IpAddr) -> Option<Pin> {
        self.pins
            .lock()
            .expect("pins lock")
            .pools
            .get(pool)?
            .by_address
            .get(&ip)
            .map(|(p, _)| p.clone())
    }

    /// Whether this node holds the pin of `ip` in `pool`, as known here.
    pub fn holds_pin(&self, pool: &str, ip: IpAddr) -> bool {
        self.pin_at(pool, ip)
            .is_some_and(|p| p.holders.iter().any(|h| h.node == self.name()))
    }

    /// Whether a pin of `pool` is known in `net` (a block that must not be given back).
    pub fn pinned_in(&self, pool: &str, net: &IpNet) -> bool {
        let book = self.pins.lock().expect("pins lock");
        let Some(p) = book.pools.get(pool) else {
            return false;
        };
        p.by_address
            .range(net.network()..=net.broadcast())
            .next()
            .is_some()
    }

    /// Whether a pin of `pool` is known at all.
    pub fn pool_has_pins(&self, pool: &str) -> bool {
        self.pins
            .lock()
            .expect("pins lock")
            .pools
            .get(pool)
            .is_some_and(|p| !p.by_address.is_empty())
    }

    /// The pins, as known here, that this node holds.
    pub fn pins_held_here(&self) -> Vec<Pin> {
        let me = self.name();
        self.known_pins(|p| p.holders.iter().any(|h| h.node == me))
    }

    /// The pins, as known here, that nobody holds.
    pub fn pins_unheld(&self) -> Vec<Pin> {
        self.known_pins(|p| p.holders.is_empty())
    }

    /// How many pins of `owner` are known here (more than one: a second pin, on the
    /// Kubernetes API, of a creation that landed late).
    pub fn pins_known_of(&self, owner: &crate::cluster::pin::PinOwner) -> usize {
        self.known_pins(|p| &p.owner == owner).len()
    }

    fn known_pins(&self, keep: impl Fn(&Pin) -> bool) -> Vec<Pin> {
        let book = self.pins.lock().expect("pins lock");
        book.pools
            .values()
            .flat_map(|p| p.by_address.values().map(|(pin, _)| pin))
            .filter(|p| keep(p))
            .cloned()
            .collect()
    }
}

/// Whether `stored` keeps every hold of node `me`'s that `known` has.
/// Whether the store was found reset since `resets` resets had been seen (never, for None).
fn reset_since(book: &PinBook, resets: Option<u64>) -> bool {
    resets.is_some_and(|r| r != book.resets)
        && !crate::bugs::on(crate::bugs::Bug::AssertedBeforeReset)
}

pub(crate) fn holds_kept(known: &Pin, stored: &Pin, me: &str) -> bool {
    known.holders.iter().filter(|h| h.node == me).all(|h| {
        stored
            .holders
            .iter()
            .any(|s| s.node == h.node && s.uid == h.uid)
    })
}
