//! `ipoolctl cluster pins` and `cluster unpin`: fixed addresses, their owners and holders.

use std::net::IpAddr;

use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::pin::{Pin, PinRead};
use ipool_server::cluster::release::not_gone;
use ipool_server::cluster::vocab::ClusterError;

use crate::Output;

fn pin_json(p: &Pin) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    v["address"] = p.address.to_string().into();
    v["block"] = p.block.to_string().into();
    v
}

/// Every pin (or `pool`'s), by address.
pub(crate) async fn list(
    store: &dyn Datastore,
    pool: Option<&str>,
    out: Output,
) -> Result<(), ClusterError> {
    let mut pins = store.pins(pool).await?;
    pins.sort_by_key(|p| (p.pin.pool.clone(), p.pin.address));
    if out == Output::Json {
        let v: Vec<serde_json::Value> = pins.iter().map(|p| pin_json(&p.pin)).collect();
        outln!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    let rows = pins
        .iter()
        .map(|PinRead { pin: p, .. }| {
            vec![
                p.pool.clone(),
                p.address.to_string(),
                p.owner.to_string(),
                p.holders_shown(),
                match p.set_aside {
                    true => format!("set aside in {}", p.block),
                    false => p.block.to_string(),
                },
            ]
        })
        .collect();
    crate::print::table(&["POOL", "ADDRESS", "OWNER", "HELD BY", "MADE IN"], rows);
    Ok(())
}

/// Ends the pin of `address`: refused while a node holds it, unless that node is gone as
/// release-node judges one (away `absent_for` and past its fence), or with `force`.
pub(crate) async fn unpin(
    store: &dyn Datastore,
    place: &str,
    address: IpAddr,
    absent_for: u64,
    force: bool,
    out: Output,
) -> Result<(), ClusterError> {
    let Some(read) = store
        .pins(None)
        .await?
        .into_iter()
        .find(|p| p.pin.address == address)
    else {
        return Err(ClusterError::NotFound(format!(
            "no pin of {address} in {place}"
        )));
    };
    for h in &read.pin.holders {
        // What cannot be measured is no proof that the node is gone.
        let judged = match store.node_state(&h.node).await {
            Ok(state) => not_gone(&state, place, &h.node, absent_for),
            Err(e @ ClusterError::Malformed { .. }) => Some(e.to_string()),
            Err(e) => return Err(e),
        };
        if let Some(why) = judged {
            let msg = format!(
                "{address} is held by node {} for pod {}: {why}",
                h.node, h.pod
            );
            if !force {
                return Err(ClusterError::Refused(format!(
                    "{msg}; it stays pinned (delete the pod first, or --force unpins it anyway: the node's block owner may then hand it to another pod while {} still uses it)",
                    h.pod
                )));
            }
            eprintln!("ipoolctl: --force: {msg}; unpinning it anyway");
        }
    }
    if !store.delete_pin(&read).await? {
        return Err(ClusterError::Refused(format!(
            "the pin of {address} changed while it was being deleted (taken over or released): look again with `ipoolctl cluster pins`"
        )));
    }
    match out {
        Output::Json => outln!("{}", pin_json(&read.pin)),
        _ if read.pin.set_aside => outln!(
            "unpinned {address} of pool {} (owner {}); it stays set aside in {}: the next pod whose owner chooses it takes it",
            read.pin.pool,
            read.pin.owner,
            read.pin.block
        ),
        _ => outln!(
            "unpinned {address} of pool {} (owner {}); the node that owns block {} may hand it out again",
            read.pin.pool,
            read.pin.owner,
            read.pin.block
        ),
    }
    Ok(())
}
