//! ADD and DEL of pods with a fixed address (`ipool.io/fixed`): the pin's part
//! ([`crate::cluster::pin::hold`]) around the engine's. The CNI service runs them, and so does
//! the simulation (`ipool-sim`), which calls the engine as the service does.

use std::net::IpAddr;

use crate::cluster::pin::hold::{Before, Holds, PinSite, Pod, Refused};
use crate::cluster::pin::PinOwner;
use crate::config::IpamSection;
use crate::error::Error;
use crate::ipam::{AddReply, AddRequest, Ipam};
use crate::k8s::meta::PodInfo;
use crate::model::AttachmentKey;

/// A pod's fixed address: whose it is, and the address its owner chose, if it chose one
/// (`ipool.io/ips-by-ordinal`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedFor {
    pub owner: PinOwner,
    pub chosen: Option<IpAddr>,
    /// A VM launcher's: its VirtualMachineInstance's uid.
    pub instance: Option<String>,
    /// A migration target's: the migration's uid.
    pub migration: Option<String>,
}

/// The fixed address the ADD of `info`'s pod on `network` serves, if its address there is
/// fixed; an error for an annotation that cannot be read, or one on a network whose
/// addresses cannot follow the pod.
pub(super) fn fixed_for(
    ipam: &Ipam,
    holds: Option<&Holds>,
    network: &str,
    section: Option<&IpamSection>,
    info: Option<&PodInfo>,
) -> Result<Option<FixedFor>, Error> {
    let Some(info) = info else {
        return Ok(None);
    };
    let fixed = match &info.fixed {
        Ok(Some(f)) if f.covers(network) => f,
        Ok(_) => return Ok(None),
        Err(why) if ipam.takes_cluster_pools(network, section) => {
            return Err(Error::InvalidRequest(why.0.clone()))
        }
        Err(_) => return Ok(None),
    };
    // A network of no cluster pool (host-local ranges, the node's podCIDRs) is served as any.
    if !ipam.takes_cluster_pools(network, section) {
        return Ok(None);
    }
    if !ipam.one_subnet(network, section) {
        return Err(Error::InvalidConfig(format!(
            "annotation {} ({}): network {network:?} is not addressed as one subnet of cluster pools (\"addressing\": \"subnet\"), so its addresses cannot follow a pod to another node (a routed pool's address outside the node's blocks would need a host route); name the subnet networks it is for: {}: \"<network>[,<network>]\"",
            crate::k8s::fixed::FIXED,
            fixed.owner,
            crate::k8s::fixed::FIXED,
        )));
    }
    if holds.is_none() {
        return Err(Error::InvalidConfig(format!(
            "annotation {}: a fixed address needs cluster mode ([cluster])",
            crate::k8s::fixed::FIXED
        )));
    }
    Ok(Some(FixedFor {
        owner: fixed.owner.clone(),
        chosen: fixed.address,
        instance: fixed.instance.clone(),
        migration: fixed.migration.clone(),
    }))
}

/// Where a pin of an address an ADD took from a block of this node's is made.
fn in_block(site: crate::ipam::FixedSite) -> PinSite {
    PinSite {
        pool: site.pool,
        address: site.address,
        block: site.block.net,
        block_id: site.block.created,
        set_aside: false,
    }
}

fn refused(owner: &PinOwner, e: Refused) -> Error {
    let why = format!("fixed address of {owner}: {e}");
    match e {
        Refused::Invalid(_) => Error::InvalidConfig(why),
        Refused::HeldElsewhere { .. } => Error::Refused {
            refusal: crate::error::Refusal::FixedAddressElsewhere,
            message: why,
        },
        Refused::Held { .. } | Refused::Store(_) => Error::Busy(why),
    }
}

/// The ADD `req` of a pod with a fixed address.
pub async fn add(
    ipam: &Ipam,
    holds: &Holds,
    mut req: AddRequest,
    fixed: FixedFor,
) -> Result<AddReply, Error> {
    let FixedFor {
        owner,
        chosen,
        instance,
        migration,
    } = fixed;
    if let Some(m) = req.k8s.as_mut() {
        m.fixed = Some(owner.to_string());
    }
    let name = format!("{}/{}", req.pod.namespace, req.pod.name);
    let uid = req.pod.uid.clone();
    let pod = Pod {
        name: &name,
        uid: &uid,
        instance: instance.as_deref(),
        migration: migration.as_deref(),
    };
    let network = req.key.network.clone();
    let key = req.key.clone();
    let metrics = holds.node().metrics();
    let pools = ipam.network_pools(&network, req.ipam.as_ref());
    // One pin operation of this node's at a time, through the engine's ADD.
    let _turn = holds.turn().await;
    let before = holds
        .before_add(&owner, &pod, &pools, |_, ip| ipam.in_use(&network, ip))
        .await;
    let before = match before {
        Ok(b) => b,
        Err(e) => {
            if let Refused::Held { pool, .. } | Refused::HeldElsewhere { pool, .. } = &e {
                metrics.cluster.pin_add(pool, "refused");
            }
            return Err(refused(&owner, e));
        }
    };
    match (before, chosen) {
        (Before::Elsewhere, _) => {
            if let Some(m) = req.k8s.as_mut() {
                m.fixed = None;
            }
            ipam.add(req).await
        }
        (Before::First, Some(address)) => {
            // The owner chose it: set aside by its pool, pinned before it is taken.
            let site = holds
                .set_aside_site(&pools, address)
                .await
                .map_err(|e| refused(&owner, e))?;
            holds
                .pin(&owner, &site, &pod)
                .await
                .map_err(|e| refused(&owner, e))?;
            metrics.cluster.pin_add(&site.pool, "created");
            serve(ipam, holds, req, &owner, &uid, address, None).await
        }
        (Before::Serve { address, how, .. }, Some(chose)) if address != chose => {
            // A hold taken for this ADD is given up again (one it had stays).
            if how != "held" {
                if let Err(undo) = holds.let_go(&owner, &uid, |p| p.address == address).await {
                    tracing::warn!(%owner, error = %undo, "giving up the pin's hold of an ADD that failed failed");
                }
            }
            Err(Error::InvalidConfig(format!(
                "fixed address of {owner}: it is pinned to {address}, but annotation {} now gives it {chose}; the pin is kept (end it with `ipoolctl cluster unpin {address}` once no pod holds it, and the next pod takes {chose})",
                crate::k8s::fixed::IPS_BY_ORDINAL
            )))
        }
        (Before::First, None) => {
            let reply = ipam.add(req).await?;
            let ips: Vec<_> = reply.leases.iter().map(|l| l.ip).collect();
            let site = match ipam.fixed_site(&network, &ips) {
                Some(site) => Ok(in_block(site)),
                None => Err(Refused::Invalid(format!(
                    "none of {ips:?} lies in a block of this node's of a cluster pool of one subnet"
                ))),
            };
            let pinned = match site {
                Ok(site) => holds.pin(&owner, &site, &pod).await.map(|()| site.pool),
                Err(e) => Err(e),
            };
            match pinned {
                Ok(pool) => {
                    metrics.cluster.pin_add(&pool, "created");
                    Ok(reply)
                }
                // The store did not answer: the pin may have been written. The address stays
                // with the container, and the runtime's retry of the ADD (the same container)
                // gets it again and pins it.
                Err(e @ Refused::Store(_)) => Err(refused(&owner, e)),
                Err(e) => {
                    // Refused (the owner pinned elsewhere meanwhile, or no address to pin):
                    // undone, the address goes back as after a DEL.
                    if let Err(undo) = ipam.del(&key).await {
                        tracing::warn!(container = %key.container_id, error = %undo, "undoing the ADD of a pod whose pin could not be made failed");
                    }
                    Err(refused(&owner, e))
                }
            }
        }
        (Before::Serve { pool, address, how }, _) => {
            let reply = serve(ipam, holds, req, &owner, &uid, address, Some(how)).await?;
            metrics.cluster.pin_add(&pool, how);
            Ok(reply)
        }
    }
}

/// Serves `address`, whose pin this node holds for the pod (`how` it came to: None, the pin
/// was just made for this ADD). A failure gives up a hold taken for this ADD (one it had
/// stays), and withdraws a pin made for it.
async fn serve(
    ipam: &Ipam,
    holds: &Holds,
    mut req: AddRequest,
    owner: &PinOwner,
    uid: &str,
    address: IpAddr,
    how: Option<&str>,
) -> Result<AddReply, Error> {
    req.requested = vec![address];
    req.fixed = true;
    let e = match ipam.add(req).await {
        Ok(reply) => return Ok(reply),
        Err(e) => e,
    };
    let undone = match how {
        Some("held") => Ok(()),
        Some(_) => holds.let_go(owner, uid, |p| p.address == address).await,
        None => holds.withdraw(owner, uid, address).await,
    };
    if let Err(undo) = undone {
        tracing::warn!(%owner, error = %undo, "giving up the pin's hold of an ADD that failed failed");
    }
    Err(e)
}

/// The DEL of `key`: a fixed address's hold on this node ends first, in the node's turn
/// ([`Holds::turn`]) through the engine's DEL. Returns what was released.
pub async fn del(
    ipam: &Ipam,
    holds: Option<&Holds>,
    key: &AttachmentKey,
) -> Result<Vec<std::net::IpAddr>, Error> {
    let _turn = match (holds, ipam.fixed_held(key)) {
        (Some(h), Some(_)) => Some(h.turn().await),
        _ => None,
    };
    before_del(ipam, holds, key).await?;
    ipam.del(key).await
}

/// Before the DEL of `key`: its fixed address's hold on this node ends. An error: nothing
/// may be released (the runtime retries the DEL). The caller holds the node's turn
/// ([`Holds::turn`]) through the engine's DEL.
async fn before_del(ipam: &Ipam, holds: Option<&Holds>, key: &AttachmentKey) -> Result<(), Error> {
    let (Some(holds), Some(held)) = (holds, ipam.fixed_held(key)) else {
        return Ok(());
    };
    // Another sandbox of the pod (a new one, the old one's DEL late) still holds the address:
    // the hold stays its.
    if held.addresses.iter().any(|ip| ipam.held_by_other(key, *ip)) {
        return Ok(());
    }
    let owner = match PinOwner::parse(&held.owner) {
        Ok(o) => o,
        Err(why) => {
            tracing::warn!(container = %key.container_id, error = %why, "an attachment's fixed address names no pin owner: released without its pin");
            return Ok(());
        }
    };
    // Each of the owner's pins this pod holds here, but where another attachment here holds
    // the address (a late creation's pin of another sandbox's address: that one's to let go).
    let others = |p: &crate::cluster::pin::Pin| !ipam.held_by_other(key, p.address);
    holds.let_go(&owner, &held.uid, others).await.map_err(|e| {
        Error::Busy(format!(
            "the pin of {owner} could not be let go for pod {} ({e}); nothing was released",
            held.pod
        ))
    })
}
