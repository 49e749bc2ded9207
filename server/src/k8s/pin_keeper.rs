//! The pins of this node, kept (see [`crate::cluster::pin`]):
//! - a hold of this node's that no attachment here uses any more (its pod released by the pod
//!   GC, the CNI GC or a reboot, which do not run a DEL) is let go, so that the pod can take
//!   its address on another node; only a hold older than [`HOLD_GRACE_MS`] (an ADD writes its
//!   hold before its attachment);
//! - a pin made in a block of this node's, held by nobody, whose owner is gone (its
//!   StatefulSet deleted or scaled below the ordinal, its VirtualMachine and instance deleted),
//!   is deleted once the owner has been gone `[cluster] pin_ttl_secs`: the address is free.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use tokio::time::Instant;

use crate::cluster::model::now_ms;
use crate::cluster::pin::hold::Holds;
use crate::cluster::pin::{Pin, PinOwner};
use crate::ipam::Ipam;

/// How often the pins are looked at (at most).
const EVERY: Duration = Duration::from_secs(30);
/// A hold younger than this is left alone: its ADD may not have made its attachment yet.
pub const HOLD_GRACE_MS: u64 = 120_000;

/// Runs until the daemon stops.
pub async fn run(ipam: Ipam, holds: Holds, client: kube::Client) {
    let ttl = Duration::from_secs(holds.node().settings().pin_ttl_secs);
    // A short pin_ttl_secs is looked at more often.
    let every = EVERY.min((ttl / 2).max(Duration::from_secs(1)));
    let mut gone_since: HashMap<PinOwner, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(crate::cluster::jitter(every)).await;
        let_go_unused(&ipam, &holds).await;
        end_gone_owners(&ipam, &holds, &client, ttl, &mut gone_since).await;
    }
}

/// This node's holds no attachment uses, past their grace: let go.
pub async fn let_go_unused(ipam: &Ipam, holds: &Holds) {
    let me = holds.node().name().to_string();
    for pin in holds.node().pins_held_here() {
        // Not while an ADD or a DEL of this node's works on a pin.
        let _turn = holds.turn().await;
        if ipam.holds_anywhere(pin.address) {
            continue;
        }
        let old = pin
            .holders
            .iter()
            .filter(|h| h.node == me && now_ms().saturating_sub(h.since_ms) > HOLD_GRACE_MS);
        for h in old {
            match holds.let_go(&pin.owner, &h.uid).await {
                Ok(()) => {
                    tracing::info!(owner = %pin.owner, address = %pin.address, pod = %h.pod, "a pin held here for a pod whose address is no longer held here (released without a DEL): let go")
                }
                Err(e) => {
                    tracing::warn!(owner = %pin.owner, address = %pin.address, error = %e, "letting go of an unused pin failed (tried again later)")
                }
            }
        }
    }
}

/// Unheld pins of this node's blocks, and of addresses set aside that this node knows (it
/// held them; no block is theirs), whose owner is gone: deleted after `ttl`.
async fn end_gone_owners(
    ipam: &Ipam,
    holds: &Holds,
    client: &kube::Client,
    ttl: Duration,
    gone_since: &mut HashMap<PinOwner, Instant>,
) {
    let mine: Vec<Pin> = holds
        .node()
        .pins_unheld()
        .into_iter()
        .filter(|p| {
            p.set_aside
                || ipam
                    .block_holding(p.address)
                    .is_some_and(|(b, id)| b == p.block.to_string() && id == p.block_id)
        })
        .collect();
    gone_since.retain(|o, _| mine.iter().any(|p| &p.owner == o));
    for pin in mine {
        let gone = match owner_gone(client, &pin.owner).await {
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

/// Why `owner` is gone, if it is; an error when the apiserver cannot say.
pub async fn owner_gone(client: &kube::Client, owner: &PinOwner) -> Result<Option<String>, String> {
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
