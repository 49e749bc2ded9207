//! What a pod's ADD and DEL do with its pin (the service runs these around the engine's ADD
//! and DEL; the engine knows nothing of pins, only that an address is fixed for a pod).
//!
//! ADD ([`Holds::before_add`]): the owner's pin, read from the store.
//! - None: the ADD takes an address as any other pod would, from this node's blocks, and
//!   [`Holds::pin`] then pins it, holder this node (refused, the engine's ADD is undone).
//! - Held here by this pod: served.
//! - Held by nobody, or by one node only while the owner is a VM, the pod a launcher of the
//!   same instance and the target of its migration under way as KubeVirt shows it
//!   ([`Migrations`]): this node is added to the
//!   holders by a write conditioned on the pin as read, then the pin's block is read (a pin
//!   counts only while its block stands as it was made in: one that does not is deleted, and
//!   the ADD goes on as for no pin).
//! - Held elsewhere: each holder that is gone as `release-node` would judge it (fenced and
//!   away, its name not held), or that is this node holding it for a pod whose address this
//!   node no longer holds, is dropped; any other holder refuses the ADD (retry later).
//!
//! DEL ([`Holds::let_go`]): before the engine releases the address, this node's hold for the
//! pod is removed from the pin (conditioned on the pin as read); a failure fails the DEL,
//! which the runtime retries, with nothing released.
//!
//! How holds and pins end (a DEL, an ADD undone, the pin keeper's turns): [`end`].

mod confirm;
mod end;

use std::net::IpAddr;
use std::sync::Arc;

use super::{verdict, Holder, Pin, PinCreated, PinOwner, PinRead, Verdict};
use crate::cluster::ippool::NotSetAside;
use crate::cluster::node::ClusterNode;
use crate::cluster::vocab::{now_ms, ClusterError};

/// Writes that find the pin changed since it was read, before the ADD or DEL gives up.
const ATTEMPTS: usize = 4;

/// Whether KubeVirt shows a VM's live migration (the apiserver: its
/// VirtualMachineInstanceMigration).
#[async_trait::async_trait]
pub trait Migrations: Send + Sync {
    /// Whether the migration of uid `migration` (the one a target launcher pod is labelled
    /// with) is of `owner`'s instance, and not over.
    async fn under_way(
        &self,
        owner: &PinOwner,
        migration: &str,
    ) -> Result<bool, crate::cluster::vocab::LookupFailed>;
}

/// The pins of this node's pods.
#[derive(Clone)]
pub struct Holds {
    node: Arc<ClusterNode>,
    /// One pin operation of this node's at a time (an ADD's, a DEL's, the keeper's): a hold
    /// let go for want of an attachment is not one an ADD is about to use.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// KubeVirt's word on migrations; None: no VM's pin is ever shared.
    migrations: Option<Arc<dyn Migrations>>,
}

/// What an ADD of a pod with a fixed address does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    /// The owner has no pin: an address as any, then [`Holds::pin`].
    First,
    /// The owner's pin is of a pool the network does not take (the pod's other network's):
    /// this network's address is not fixed.
    Elsewhere,
    /// This node holds the pin for the pod now: the ADD takes `address`, fixed.
    Serve {
        pool: String,
        address: IpAddr,
        /// How it came to be held here, for the metrics: held, moved, migration, taken_over.
        how: &'static str,
    },
}

/// The pod of an ADD with a fixed address.
#[derive(Clone, Copy, Debug)]
pub struct Pod<'a> {
    /// `namespace/name`.
    pub name: &'a str,
    pub uid: &'a str,
    /// A VM launcher's: its VirtualMachineInstance's uid ([`Holder::instance`]).
    pub instance: Option<&'a str>,
    /// A migration target's: the migration's uid (KubeVirt's label on the pod).
    pub migration: Option<&'a str>,
}

/// Where a pin is made: the address, and what it lies in (see [`Pin::block`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinSite {
    pub pool: String,
    pub address: IpAddr,
    pub block: ipnet::IpNet,
    pub block_id: i64,
    pub set_aside: bool,
}

/// Why a pod's pin cannot be served here now.
#[derive(Debug)]
pub enum Refused {
    /// Not now (retry later): the pin's pool, and why (pinned for another owner, its block
    /// changed meanwhile, its pool changing).
    Held { pool: String, why: String },
    /// Live pods on other nodes hold the owner's pin (its previous instance, say): the pin's
    /// pool, and who holds it. It is free once they let it go.
    HeldElsewhere { pool: String, why: String },
    /// The ADD cannot have a fixed address: why.
    Invalid(String),
    /// The store failed or did not answer.
    Store(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Held { why, .. }
            | Refused::HeldElsewhere { why, .. }
            | Refused::Store(why)
            | Refused::Invalid(why) => f.write_str(why),
        }
    }
}

impl From<ClusterError> for Refused {
    fn from(e: ClusterError) -> Refused {
        Refused::Store(e.to_string())
    }
}

impl Holds {
    pub fn new(node: Arc<ClusterNode>) -> Holds {
        Holds {
            node,
            turn: Arc::default(),
            migrations: None,
        }
    }

    /// These holds, a VM's pin shared by its two launchers when `migrations` shows the
    /// migration.
    pub fn with_migrations(self, migrations: Arc<dyn Migrations>) -> Holds {
        Holds {
            migrations: Some(migrations),
            ..self
        }
    }

    /// Whether `pod`, a launcher of `owner`'s, is the target of its migration under way, as
    /// KubeVirt shows it.
    async fn migration_target(&self, owner: &PinOwner, pod: &Pod<'_>) -> Result<bool, Refused> {
        let (Some(m), Some(migration)) = (&self.migrations, pod.migration) else {
            return Ok(false);
        };
        m.under_way(owner, migration)
            .await
            .map_err(|e| Refused::Store(format!("asking KubeVirt whether {owner} migrates: {e}")))
    }

    /// This node's turn for a pin operation (held for its whole course: the store's part and
    /// the engine's).
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    pub fn node(&self) -> &Arc<ClusterNode> {
        &self.node
    }

    fn holder(&self, pod: &Pod<'_>) -> Holder {
        Holder {
            node: self.node.name().to_string(),
            pod: pod.name.to_string(),
            uid: pod.uid.to_string(),
            since_ms: now_ms(),
            instance: pod.instance.map(str::to_string),
        }
    }

    /// Deletes the pin as read (false: it changed or went since), and forgets it if deleted.
    async fn delete(&self, read: &PinRead) -> Result<bool, ClusterError> {
        let r = read.clone();
        let deleted = self
            .node
            .call("delete_pin", |s| async move { s.delete_pin(&r).await })
            .await?;
        if deleted {
            self.node.pin_gone(&read.pin);
        }
        Ok(deleted)
    }

    /// The holders of `pin` on other nodes than this one.
    fn held_elsewhere(&self, pin: &Pin) -> Vec<Holder> {
        let me = self.node.name();
        let others = pin.holders.iter().filter(|h| h.node != me);
        others.cloned().collect()
    }

    async fn pin_of(&self, owner: &PinOwner) -> Result<Option<PinRead>, ClusterError> {
        let o = owner.clone();
        self.node
            .call("pin_of", |s| async move { s.pin_of(&o).await })
            .await
    }

    /// Whether `pin`'s block stands as the pin was made in (for an address set aside, its
    /// pool), as the store says now.
    async fn block_stands(&self, pin: &Pin) -> Result<bool, ClusterError> {
        let p = pin.clone();
        self.node
            .call("pin_block", |s| async move { s.pin_block_stands(&p).await })
            .await
    }

    async fn pins_of(&self, owner: &PinOwner) -> Result<Vec<PinRead>, ClusterError> {
        let o = owner.clone();
        self.node
            .call("pins_of", |s| async move { s.pins_of(&o).await })
            .await
    }

    async fn pin_at(&self, pin: &Pin) -> Result<Option<PinRead>, ClusterError> {
        let p = pin.clone();
        self.node
            .call("pin_at", |s| async move { s.pin_at(&p).await })
            .await
    }

    async fn write(&self, read: &PinRead, pin: &Pin) -> Result<Option<PinRead>, ClusterError> {
        let (r, p) = (read.clone(), pin.clone());
        self.node
            .call("write_pin", |s| async move { s.write_pin(&r, &p).await })
            .await
    }

    /// What the ADD of `pod`, whose fixed address belongs to `owner`, serves.
    /// `holds_here(pool, address)`: whether this node's engine holds that address now (a hold
    /// of this node's for another pod whose address it no longer holds is stale).
    /// `pools`: the cluster pools of the ADD's network.
    pub async fn before_add(
        &self,
        owner: &PinOwner,
        pod: &Pod<'_>,
        pools: &[String],
        holds_here: impl Fn(&str, IpAddr) -> bool,
    ) -> Result<Before, Refused> {
        let me = self.node.name().to_string();
        let (uid, instance) = (pod.uid, pod.instance);
        for _ in 0..ATTEMPTS {
            let Some(read) = self.pin_of(owner).await? else {
                return Ok(Before::First);
            };
            if !pools.contains(&read.pin.pool) {
                return Ok(Before::Elsewhere);
            }
            if read.pin.set_aside && self.set_aside_void(&read).await? {
                return Ok(Before::First);
            }
            let mut pin = read.pin.clone();
            let mut judged = verdict(&pin, &me, uid, instance);
            if judged == Verdict::Migration && !self.migration_target(owner, pod).await? {
                // Not a migration KubeVirt shows: the other launcher holds it, as a
                // StatefulSet's pod would.
                judged = Verdict::HeldBy(pin.holders.clone());
            }
            if judged == Verdict::Migration {
                // Shared only with a hold its node confirms (see `unconfirmed`).
                if let Some(why) = self.unconfirmed(&pin, &pin.holders[0]).await? {
                    return Err(Refused::Held {
                        pool: pin.pool,
                        why,
                    });
                }
            }
            let how = match judged {
                Verdict::Held => {
                    self.node.pin_known(&pin);
                    return Ok(Before::Serve {
                        pool: pin.pool,
                        address: pin.address,
                        how: "held",
                    });
                }
                Verdict::Free => "moved",
                Verdict::Migration => "migration",
                Verdict::HeldBy(holders) => {
                    // Holders gone, or stale here, are dropped; any other refuses.
                    let mut kept = Vec::new();
                    for h in holders {
                        let stale = h.node == me && !holds_here(&pin.pool, pin.address);
                        if stale || self.kept_hold(&pin, &h).await?.is_none() {
                            continue;
                        }
                        kept.push(h);
                    }
                    if kept.len() == pin.holders.len() {
                        let why = self.held_why(&pin, &kept).await?;
                        return Err(Refused::HeldElsewhere {
                            pool: pin.pool,
                            why,
                        });
                    }
                    pin.holders = kept;
                    match verdict(&pin, &me, uid, instance) {
                        Verdict::Free => "taken_over",
                        Verdict::Migration if self.migration_target(owner, pod).await? => {
                            "migration"
                        }
                        _ => {
                            let why = self.held_why(&pin, &pin.holders).await?;
                            return Err(Refused::Held {
                                pool: pin.pool,
                                why,
                            });
                        }
                    }
                }
            };
            pin.holders.push(self.holder(pod));
            self.may_hold()?;
            // Known as held here before it is written: unanswered, it may still land, and the
            // keeper lets go of what no attachment uses.
            self.node.pin_writing(&pin);
            let Some(written) = self.write(&read, &pin).await? else {
                continue;
            };
            // Landed: known as written (a read below that fails leaves it so, not as a write
            // on its way, which no listing would ever correct).
            if !crate::bugs::on(crate::bugs::Bug::LandedHoldKeptWriting) {
                self.node.pin_known(&written.pin);
            }
            // A pin counts only while its block stands as it was made in.
            let stands = self.block_stands(&written.pin).await?;
            if !stands {
                // Not this node's alone to delete while another holds it (deploy/'s admission
                // policy refuses it, and the holder's pod may still use the address): its own
                // hold taken back; the pin ends once its holders let go, and the pod is told.
                let others = self.held_elsewhere(&written.pin);
                let shared = !others.is_empty()
                    && !crate::bugs::on(crate::bugs::Bug::VoidPinDeletedUnderOthers);
                if shared {
                    let mut back = written.pin.clone();
                    back.holders.retain(|h| h.node != me);
                    if let Some(w) = self.write(&written, &back).await? {
                        self.node.pin_known(&w.pin);
                    }
                    let why = self.held_why(&back, &others).await?;
                    return Err(Refused::HeldElsewhere {
                        pool: written.pin.pool,
                        why: format!(
                            "the pin of {owner} is void (its block {} no longer stands as it was made in) and {why}: it ends once they let go, and the pod then gets a new address",
                            written.pin.block
                        ),
                    });
                }
                let w = written.clone();
                self.node
                    .call("delete_pin", |s| async move { s.delete_pin(&w).await })
                    .await?;
                self.node.pin_gone(&written.pin);
                tracing::warn!(owner = %owner, address = %written.pin.address, block = %written.pin.block, set_aside = written.pin.set_aside, "a pin's block (or, an address set aside, its pool) no longer stands as it was made in (released by force? made anew?): the pin was void, and is deleted; the pod gets a new address");
                return Ok(Before::First);
            }
            self.node.pin_known(&written.pin);
            return Ok(Before::Serve {
                pool: written.pin.pool,
                address: written.pin.address,
                how,
            });
        }
        Err(Refused::Store(format!(
            "the pin of {owner} kept changing while this node wrote it"
        )))
    }

    /// Whether this node may write a hold now: only while it holds its name (registered,
    /// renewed). A hold written by a node the store has no record of (its heartbeat never
    /// answered) could never be ended: nothing shows that node away, neither the release of
    /// departed nodes nor release-node.
    fn may_hold(&self) -> Result<(), Refused> {
        if crate::bugs::on(crate::bugs::Bug::HoldBeforeName) {
            return Ok(());
        }
        self.node
            .serving()
            .map(|_| ())
            .map_err(|n| Refused::Store(n.why))
    }

    async fn held_why(&self, pin: &Pin, holders: &[Holder]) -> Result<String, ClusterError> {
        let mut why = Vec::new();
        for h in holders {
            let alive = match h.node == self.node.name() {
                true => "this node, which still holds the address".to_string(),
                false => self
                    .kept_hold(pin, h)
                    .await?
                    .unwrap_or_else(|| "gone".to_string()),
            };
            why.push(format!("node {:?} for pod {} ({alive})", h.node, h.pod));
        }
        Ok(format!(
            "the fixed address {} of {} (cluster pool {:?}) is held by {}; it moves here once that pod's DEL ran there, or once the node is fenced and away",
            pin.address,
            pin.owner,
            pin.pool,
            why.join("; ")
        ))
    }

    /// Pins `site` for `owner`, held here by `pod`: an address the ADD took from a block of
    /// this node's, or one the pool sets aside that the ADD is about to take. An error: the
    /// ADD must be undone (or not be made).
    pub async fn pin(
        &self,
        owner: &PinOwner,
        site: &PinSite,
        pod: &Pod<'_>,
    ) -> Result<(), Refused> {
        let (pool, address) = (site.pool.as_str(), site.address);
        let pin = Pin {
            pool: pool.to_string(),
            address,
            owner: owner.clone(),
            block: site.block,
            block_id: site.block_id,
            set_aside: site.set_aside,
            holders: vec![self.holder(pod)],
        };
        self.may_hold()?;
        // Known before it is written: the address stays out of every other path meanwhile,
        // and after, whatever listings say, if the answer never comes (the pin may land late).
        self.node.pin_writing(&pin);
        let p = pin.clone();
        let created = self
            .node
            .call("create_pin", |s| async move { s.create_pin(&p).await })
            .await;
        let refused = match created {
            Ok(PinCreated::Created(read)) => {
                self.node.pin_known(&read.pin);
                return Ok(());
            }
            Ok(PinCreated::OwnerHas(theirs)) => {
                self.node.pin_gone(&pin);
                Refused::HeldElsewhere {
                    pool: pool.to_string(),
                    why: format!(
                        "{owner} was pinned meanwhile elsewhere ({} held by {})",
                        theirs.pin.address,
                        theirs.pin.holders_shown()
                    ),
                }
            }
            Ok(PinCreated::AddressTaken(theirs)) => {
                let void = theirs.pin.block != pin.block || theirs.pin.block_id != pin.block_id;
                match void {
                    // Left from an earlier life of the block: deleted, so that the next ADD
                    // can pin the address.
                    // Not while another node holds it (as where a takeover finds its pin void).
                    true if theirs
                        .pin
                        .holders
                        .iter()
                        .any(|h| h.node != self.node.name())
                        && !crate::bugs::on(crate::bugs::Bug::VoidPinDeletedUnderOthers) => {}
                    true => {
                        let t = theirs.clone();
                        let deleted = self
                            .node
                            .call("delete_pin", |s| async move { s.delete_pin(&t).await })
                            .await;
                        if matches!(deleted, Ok(true)) {
                            self.node.pin_gone(&pin);
                        }
                    }
                    false => self.node.pin_known(&theirs.pin),
                }
                Refused::Held {
                    pool: pool.to_string(),
                    why: match pin.set_aside {
                        true => format!(
                            "{address} is pinned already, for {} (two owners chose it? it is free once that owner is gone, pin_ttl_secs after, or by ipoolctl cluster unpin)",
                            theirs.pin.owner
                        ),
                        false => format!("{address} is pinned already, for {}", theirs.pin.owner),
                    },
                }
            }
            Ok(PinCreated::BlockChanged) => {
                self.node.pin_gone(&pin);
                Refused::Held {
                    pool: pool.to_string(),
                    why: match pin.set_aside {
                        true => format!(
                            "cluster pool {pool:?} changed while {address} was being pinned, or no longer sets it aside (deleted, being deleted, its CIDR removed); try again"
                        ),
                        false => format!(
                            "block {} is no longer the one {address} was taken from",
                            pin.block
                        ),
                    },
                }
            }
            // Written or not, it cannot tell: the address stays out until a listing says.
            Err(e) => Refused::Store(e.to_string()),
        };
        Err(refused)
    }

    /// Where a pin of `ip`, chosen by its owner, is made: the excluded range of the one pool
    /// of `pools` (the ADD's network's) that sets it aside. Refused::Invalid: none does.
    pub async fn set_aside_site(&self, pools: &[String], ip: IpAddr) -> Result<PinSite, Refused> {
        let (mut why, mut not_now) = (Vec::new(), None);
        for pool in pools {
            let (p, at) = (pool.clone(), ip);
            let site = self
                .node
                .call("set_aside_site", |s| async move {
                    s.set_aside_site(&p, at).await
                })
                .await?;
            match site {
                Ok((block, block_id)) => {
                    return Ok(PinSite {
                        pool: pool.clone(),
                        address: ip,
                        block,
                        block_id,
                        set_aside: true,
                    })
                }
                Err(NotSetAside::NotNow(w)) => not_now = Some((pool.clone(), w)),
                Err(NotSetAside::Never(w)) => why.push(w),
            }
        }
        if let Some((pool, why)) = not_now {
            return Err(Refused::Held {
                pool,
                why: format!("{why}: try again"),
            });
        }
        Err(Refused::Invalid(match why.is_empty() {
            true => format!("the network takes no cluster pool that could set {ip} aside"),
            false => why.join("; "),
        }))
    }

    /// Before `read`, a pin of an address set aside, is served: false, it may be (its pool
    /// would let it be made now); true, it was void (its pool no longer sets the address
    /// aside as it was made) and is deleted, the ADD goes on as for no pin; refused while its
    /// pool is being deleted or loses the CIDR holding it.
    async fn set_aside_void(&self, read: &PinRead) -> Result<bool, Refused> {
        let p = read.pin.clone();
        let pinnable = self
            .node
            .call("set_aside_pinnable", |s| async move {
                s.set_aside_pinnable(&p).await
            })
            .await?;
        if pinnable {
            return Ok(false);
        }
        let stands = self.block_stands(&read.pin).await?;
        if stands {
            return Err(Refused::Held {
                pool: read.pin.pool.clone(),
                why: format!(
                    "cluster pool {:?} is being deleted, or losing the CIDR that holds {}: try again",
                    read.pin.pool, read.pin.address
                ),
            });
        }
        // Not this node's alone to delete while another holds it (deploy/'s admission policy
        // refuses it, and the holder's pod may still use the address): it ends once they let
        // go, as where a pin's block no longer stands.
        let others = self.held_elsewhere(&read.pin);
        if !others.is_empty()
            && !crate::bugs::on(crate::bugs::Bug::VoidSetAsidePinDeletedUnderOthers)
        {
            let why = self.held_why(&read.pin, &others).await?;
            return Err(Refused::HeldElsewhere {
                pool: read.pin.pool.clone(),
                why: format!(
                    "the pin of {} is void (its pool no longer sets {} aside as it did) and {why}: it ends once they let go, and the pod then gets a new address",
                    read.pin.owner, read.pin.address
                ),
            });
        }
        self.delete(read).await?;
        tracing::warn!(owner = %read.pin.owner, address = %read.pin.address, pool = %read.pin.pool, "a pin of an address set aside whose pool no longer sets it aside as it did (made anew, or its CIDR removed) was void, and is deleted");
        Ok(true)
    }
}
