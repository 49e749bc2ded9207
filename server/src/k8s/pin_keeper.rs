//! The pins of this node, kept (see [`crate::cluster::pin`]):
//! - a pin held by this node alone whose address another pod here has (its creation landed
//!   after its ADD had failed: a pod of the owner must not get that address) is deleted;
//! - a hold of this node's that no attachment here uses any more (its pod released by the pod
//!   GC, the CNI GC or a reboot, which do not run a DEL) is let go, so that the pod can take
//!   its address on another node; only once this keeper has seen it unused for [`HOLD_GRACE`]
//!   (a hold written by an ADD whose answer never came may still be used by its retry). The
//!   hold's `since_ms` is its writer's wall clock: shown, never compared;
//! - a pin made in a block of this node's, held by nobody, whose owner is gone (its
//!   StatefulSet deleted or scaled below the ordinal, its VirtualMachine and instance deleted),
//!   is deleted once the owner has been gone `[cluster] pin_ttl_secs`: the address is free;
//! - of an owner's two pins (a creation that landed late, its block standing), the one held
//!   by nobody that a lookup by owner does not find first (or whose twin is held) is deleted;
//! - a pin held by nobody, void in a block of this node's (made in the block its address lay
//!   in before this node claimed it: a creation that landed late, a forced release), is
//!   deleted once the store confirms its block does not stand as made: it pins nothing, and
//!   would keep the block here.
//!
//! Each pin is read again at its address before it ends: on the Kubernetes API an owner may
//! have two pins for a while (one pin per owner is not one write there).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use tokio::time::Instant;

use crate::cluster::pin::hold::Holds;
use crate::cluster::pin::{Pin, PinOwner};
use crate::cluster::vocab::LookupFailed;
use crate::ipam::Ipam;

/// How often the pins are looked at (at most).
const EVERY: Duration = Duration::from_secs(30);
/// A hold is let go once it has been seen unused this long: its ADD may not have made its
/// attachment yet.
pub const HOLD_GRACE: Duration = Duration::from_secs(120);

/// A hold of this node's: the pin's owner, the pod's UID, and the pin's address (an owner
/// may have two pins for a while on the Kubernetes API, the same pod holding both).
type HoldKey = (PinOwner, String, IpAddr);

/// Since when this keeper has seen each of this node's holds unused, by its own monotonic
/// clock.
#[derive(Default)]
pub struct Unused {
    since: HashMap<HoldKey, Instant>,
}

impl Unused {
    /// Takes in the holds seen unused `now` (any other is forgotten: used again, or gone);
    /// those seen unused for `grace` or longer.
    pub fn due(&mut self, now: Instant, unused: Vec<HoldKey>, grace: Duration) -> Vec<HoldKey> {
        self.since.retain(|k, _| unused.contains(k));
        unused
            .into_iter()
            .filter(|k| now.duration_since(*self.since.entry(k.clone()).or_insert(now)) >= grace)
            .collect()
    }

    /// Whether a hold seen unused is waiting out its grace.
    pub fn waiting(&self) -> bool {
        !self.since.is_empty()
    }
}

/// Who says whether a pin's owner is gone: the apiserver ([`owner_gone`]), or the
/// simulation's controllers.
#[async_trait::async_trait]
pub trait Owners: Send + Sync {
    /// Why `owner` is gone, if it is; an error when it cannot be told.
    async fn gone(&self, owner: &PinOwner) -> Result<Option<String>, LookupFailed>;
}

#[async_trait::async_trait]
impl Owners for kube::Client {
    async fn gone(&self, owner: &PinOwner) -> Result<Option<String>, LookupFailed> {
        owner_gone(self, owner).await
    }
}

/// Since when (by this keeper's monotonic clock) each owner of an unheld pin here has been
/// seen gone.
pub type GoneSince = HashMap<PinOwner, Instant>;

/// Runs until the daemon stops.
pub async fn run(ipam: Ipam, holds: Holds, client: kube::Client) {
    let ttl = Duration::from_secs(holds.node().settings().pin_ttl_secs);
    // A short pin_ttl_secs is looked at more often.
    let every = EVERY.min((ttl / 2).max(Duration::from_secs(1)));
    let mut gone_since = GoneSince::new();
    let mut unused = Unused::default();
    loop {
        tokio::time::sleep(crate::cluster::jitter(every)).await;
        let_go_unused(&ipam, &holds, &mut unused).await;
        end_misheld(&ipam, &holds).await;
        end_gone_owners(&ipam, &holds, &client, ttl, &mut gone_since).await;
    }
}

/// This node's holds no attachment uses, seen so for [`HOLD_GRACE`]: let go.
pub async fn let_go_unused(ipam: &Ipam, holds: &Holds, unused: &mut Unused) {
    let me = holds.node().name().to_string();
    let pins = holds.node().pins_held_here();
    let seen: Vec<HoldKey> = pins
        .iter()
        .filter(|pin| !ipam.holds_anywhere(pin.address))
        .flat_map(|pin| {
            pin.holders
                .iter()
                .filter(|h| h.node == me)
                .filter(|h| {
                    !crate::bugs::on(crate::bugs::Bug::HoldByWallClock)
                        || h.since_ms + HOLD_GRACE.as_millis() as u64
                            <= crate::cluster::vocab::now_ms()
                })
                .map(|h| (pin.owner.clone(), h.uid.clone(), pin.address))
        })
        .collect();
    for (owner, uid, address) in unused.due(Instant::now(), seen, HOLD_GRACE) {
        let Some(pin) = pins
            .iter()
            .find(|p| p.owner == owner && p.address == address)
        else {
            continue;
        };
        // Not while an ADD or a DEL of this node's works on a pin; looked at again in the
        // turn (an ADD may have taken the address meanwhile).
        let _turn = holds.turn().await;
        if ipam.holds_anywhere(pin.address) {
            continue;
        }
        let pod = pin
            .holders
            .iter()
            .find(|h| h.uid == uid)
            .map(|h| h.pod.clone());
        match holds.let_go(&owner, &uid, |p| p.address == address).await {
            Ok(()) => {
                tracing::info!(owner = %owner, address = %pin.address, pod = ?pod, "a pin held here for a pod whose address is no longer held here (released without a DEL): let go")
            }
            Err(e) => {
                tracing::warn!(owner = %owner, address = %pin.address, error = %e, "letting go of an unused pin failed (tried again later)")
            }
        }
    }
}

/// Pins held by this node alone whose address its engine holds for another pod than theirs (a
/// creation that landed after its ADD had failed, once the address had gone to that pod):
/// deleted at once (no ADD of the pin's pod can get that address here while the other pod
/// has it, and kept, the pin would give it to the owner's next pod).
pub async fn end_misheld(ipam: &Ipam, holds: &Holds) {
    if crate::bugs::on(crate::bugs::Bug::MisheldPinsKept) {
        return;
    }
    let me = holds.node().name().to_string();
    let attached = |ip: IpAddr, uid: &str| ipam.holds_for(ip, uid);
    // Another owner's pod has the address here. A pod of the pin's own owner (a VM's launcher
    // whose hold an operator's forced release took out) is no misheld pin: ended, it would
    // leave the owner's other pods, elsewhere, on an address no pin keeps.
    let others = |pin: &Pin| match crate::bugs::on(crate::bugs::Bug::MisheldOwnPodEnded) {
        true => ipam.holds_anywhere(pin.address),
        false => ipam.holds_for_another_owner(pin.address, &pin.owner.to_string()),
    };
    let misheld = |pin: &Pin| {
        !pin.holders.is_empty()
            && pin.holders.iter().all(|h| h.node == me)
            && others(pin)
            && !pin.holders.iter().any(|h| attached(pin.address, &h.uid))
    };
    for pin in holds.node().pins_held_here() {
        if !misheld(&pin) {
            continue;
        }
        // Not while an ADD or a DEL of this node's works on a pin; looked at again in the
        // turn.
        let _turn = holds.turn().await;
        if !misheld(&pin) {
            continue;
        }
        match holds.end_misheld(&pin, attached).await {
            Ok(true) => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, "a pin held here for a pod that never got its address here, which another pod has (its creation landed after its ADD had failed): ended, the owner's next pod gets a new address")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, error = %e, "ending a pin whose address another pod has failed (tried again later)")
            }
        }
    }
}

/// Unheld pins of this node's blocks, and of addresses set aside that this node knows (it
/// held them; no block is theirs), whose owner is gone: deleted after `ttl`. And unheld pins
/// void in a block of this node's (made in the block its address lay in before the node's
/// claim of it): deleted, whoever their owner.
pub async fn end_gone_owners(
    ipam: &Ipam,
    holds: &Holds,
    owners: &dyn Owners,
    ttl: Duration,
    gone_since: &mut GoneSince,
) {
    let (mut mine, mut void) = (Vec::new(), Vec::new());
    for p in holds.node().pins_unheld() {
        if p.set_aside {
            mine.push(p);
            continue;
        }
        match ipam.block_holding(p.address) {
            Some(b) if b.net == p.block && b.created == p.block_id => mine.push(p),
            Some(_) => void.push(p),
            None => {}
        }
    }
    if !crate::bugs::on(crate::bugs::Bug::VoidPinsKept) {
        end_void(holds, void).await;
    }
    // Of an owner's two pins (a creation that landed late, its block standing), the one no
    // pod of the owner takes ends whether the owner is gone or not.
    let (second, mut mine): (Vec<Pin>, Vec<Pin>) = mine.into_iter().partition(|p| {
        holds.node().pins_known_of(&p.owner) > 1
            && !crate::bugs::on(crate::bugs::Bug::SecondPinsKept)
    });
    for pin in second {
        match holds.end_second(&pin).await {
            Ok(true) => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, "a second pin of an owner, held by nobody, ended (a creation that landed late): its address is free")
            }
            Ok(false) => mine.push(pin),
            Err(e) => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, error = %e, "ending an owner's second pin failed (tried again later)")
            }
        }
    }
    gone_since.retain(|o, _| mine.iter().any(|p| &p.owner == o));
    for pin in mine {
        let gone = match owners.gone(&pin.owner).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(owner = %pin.owner, error = %e, "cannot tell whether a pin's owner is gone");
                continue;
            }
        };
        let Some(why) = gone else {
            gone_since.remove(&pin.owner);
            continue;
        };
        let since = *gone_since
            .entry(pin.owner.clone())
            .or_insert_with(Instant::now);
        if since.elapsed() < ttl {
            continue;
        }
        match holds.end_unheld(&pin).await {
            Ok(true) => {
                gone_since.remove(&pin.owner);
                tracing::info!(owner = %pin.owner, address = %pin.address, why = %why, "a pin whose owner is gone ended: its address is free");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(owner = %pin.owner, error = %e, "ending the pin of a gone owner failed (tried again later)")
            }
        }
    }
}

/// Void pins nobody holds, in this node's blocks: each ended once the store confirms its
/// block no longer stands as the pin was made in (another, or none).
async fn end_void(holds: &Holds, void: Vec<Pin>) {
    for pin in void {
        match holds.end_void(&pin).await {
            Ok(true) => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, block = %pin.block, "a void pin nobody held ended (made in a block as it no longer stands: a creation that landed late, or a block released by force and claimed again): it pinned nothing, and kept this node's block from going back")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, error = %e, "ending a void pin failed (tried again later)")
            }
        }
    }
}

/// Why `owner` is gone, if it is; an error when the apiserver cannot say.
pub async fn owner_gone(
    client: &kube::Client,
    owner: &PinOwner,
) -> Result<Option<String>, LookupFailed> {
    let get = |group: &str, version: &str, kind: &str, plural: &str, ns: &str, name: &str| {
        let ar = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: match group {
                "" => version.to_string(),
                g => format!("{g}/{version}"),
            },
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let name = name.to_string();
        async move { api.get_opt(&name).await.map_err(|e| e.to_string()) }
    };
    match owner {
        PinOwner::StatefulSet {
            namespace,
            name,
            ordinal,
        } => {
            let Some(s) = get("apps", "v1", "StatefulSet", "statefulsets", namespace, name).await?
            else {
                return Ok(Some(format!("StatefulSet {namespace}/{name} is deleted")));
            };
            let spec = &s.data["spec"];
            let replicas = spec["replicas"].as_u64().unwrap_or(1);
            let start = spec["ordinals"]["start"].as_u64().unwrap_or(0);
            let ordinal = u64::from(*ordinal);
            Ok((ordinal < start || ordinal >= start + replicas).then(|| {
                format!(
                    "StatefulSet {namespace}/{name} keeps ordinals {start}..{} ({replicas} replicas)",
                    start + replicas
                )
            }))
        }
        PinOwner::VirtualMachine { namespace, name } => {
            let vm = get(
                "kubevirt.io",
                "v1",
                "VirtualMachine",
                "virtualmachines",
                namespace,
                name,
            )
            .await?;
            let vmi = get(
                "kubevirt.io",
                "v1",
                "VirtualMachineInstance",
                "virtualmachineinstances",
                namespace,
                name,
            )
            .await?;
            Ok((vm.is_none() && vmi.is_none())
                .then(|| format!("VirtualMachine {namespace}/{name} and its instance are deleted")))
        }
    }
}

#[cfg(test)]
mod tests;
