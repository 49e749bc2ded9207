//! `ipoolctl cluster pool list` (and a pool changed): each pool's spec, phase and state, the
//! blocks owned in it and the addresses still free to claim.

use ipnet::IpNet;
use ipool_server::cluster::ippool::PoolSpec;
use ipool_server::cluster::vocab::{Listing, Pool, PoolPhase};

use crate::Output;

/// A pool's counts from a listing of every block: blocks owned, and free addresses (in the
/// blocks still free to claim).
pub(crate) struct Counts {
    /// The blocks its CIDRs hold (excluded ranges and CIDRs on their way in or out left out).
    blocks: usize,
    owned: usize,
    /// Blocks still free to claim.
    free_blocks: usize,
    free_addresses: u128,
}

fn counts(p: &PoolSpec, blocks: &Listing) -> Counts {
    let mine: Vec<IpNet> = blocks
        .blocks
        .iter()
        .filter(|b| b.pool == p.name)
        .map(|b| b.block)
        .collect();
    let mut free_addresses = 0u128;
    let (mut blocks_total, mut free_blocks) = (0, 0);
    if let Ok(mut sets) = p.carve() {
        for s in sets.iter_mut() {
            blocks_total += s.len() - s.used();
            for b in mine
                .iter()
                .chain(blocks.malformed.iter().filter_map(|m| m.block.as_ref()))
            {
                s.occupy(*b);
            }
            let block = p.block_for(&s.cidr());
            let per = 1u128 << (s.cidr().max_prefix_len() - block).min(127);
            free_addresses += per * (s.len() - s.used()) as u128;
            free_blocks += s.len() - s.used();
        }
    }
    Counts {
        blocks: blocks_total,
        owned: mine.len(),
        free_blocks,
        free_addresses,
    }
}

/// What a pool's state says: enabled or disabled, and CIDRs on their way in or out.
fn state(p: &PoolSpec) -> String {
    let mut s = match p.disabled {
        true => "disabled".to_string(),
        false => "enabled".to_string(),
    };
    for c in &p.adding {
        s.push_str(&format!(", adding {c}"));
    }
    for c in &p.removing {
        s.push_str(&format!(", removing {c}"));
    }
    s
}

pub(crate) fn pool_json(
    p: &PoolSpec,
    phase: PoolPhase,
    counts: Option<&Counts>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "name": p.name, "cidrs": p.cidrs, "blockSize": p.block_v4,
        "blockSizeV6": p.block_v6, "exclude": p.exclude, "phase": phase.as_str(),
        "disabled": p.disabled, "adding": p.adding, "removing": p.removing,
        "nodeSelector": p.node_selector,
    });
    if let Some(c) = counts {
        v["blocks"] = c.blocks.into();
        v["blocksOwned"] = c.owned.into();
        v["blocksFree"] = c.free_blocks.into();
        v["freeAddresses"] = c.free_addresses.to_string().into();
    }
    v
}

pub(crate) fn print_pools(pools: &[Pool], blocks: &Listing, out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = pools
            .iter()
            .map(|Pool { spec: p, phase, .. }| pool_json(p, *phase, Some(&counts(p, blocks))))
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return;
    }
    let rows = pools
        .iter()
        .map(|Pool { spec: p, phase, .. }| {
            let join = |v: &[IpNet]| {
                let s: Vec<String> = v.iter().map(|n| n.to_string()).collect();
                if s.is_empty() {
                    "-".to_string()
                } else {
                    s.join(",")
                }
            };
            let c = counts(p, blocks);
            vec![
                p.name.clone(),
                join(&p.cidrs),
                format!("/{} /{}", p.block_v4, p.block_v6),
                join(&p.exclude),
                phase.as_str().to_string(),
                p.node_selector.clone().unwrap_or_else(|| "all".into()),
                state(p),
                c.blocks.to_string(),
                c.owned.to_string(),
                c.free_blocks.to_string(),
                c.free_addresses.to_string(),
            ]
        })
        .collect();
    crate::print::table(
        &[
            "POOL",
            "CIDRS",
            "BLOCKS (v4 v6)",
            "EXCLUDED",
            "PHASE",
            "NODES",
            "STATE",
            "BLOCKS",
            "OWNED",
            "FREE BLOCKS",
            "FREE",
        ],
        rows,
    );
}
