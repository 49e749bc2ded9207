//! Change sets as bytes: each [`Change`] becomes a put or a removal of one key in one sled
//! tree ([`Op`]), and a change set's ops become one log record's payload ([`encode_entry`]).

use std::net::IpAddr;

use super::{Change, StoreError};

/// A change turned into bytes: a put or a removal in one tree.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Op {
    Put(usize, Vec<u8>, Vec<u8>),
    Del(usize, Vec<u8>),
}

pub(super) const NETWORKS: usize = 0;
pub(super) const ATTACHMENTS: usize = 1;
pub(super) const IDLE: usize = 2;
pub(super) const CURSORS: usize = 3;
pub(super) const RESERVATIONS: usize = 4;
pub(super) const META: usize = 5;
pub(super) const BLOCKS: usize = 6;
/// The trees, by index.
pub(super) const TREES: [&str; 7] = [
    "networks",
    "attachments",
    "idle",
    "cursors",
    "reservations",
    "meta",
    "blocks",
];

/// In `meta`: the machine's boot ID at the last start.
pub(super) const BOOT_ID: &str = "boot_id";
/// In `meta`: the engine clock's anchor (see [`crate::clock`]).
pub(super) const CLOCK: &str = "clock";
/// In `meta`: `drain\0<network>` while the network is drained.
pub(super) const DRAIN_PREFIX: &str = "drain\0";
/// In `meta`: `host-local\0<network>` once host-local's allocations of the network were taken
/// over.
pub(super) const TAKEN_OVER_PREFIX: &str = "host-local\0";

pub(super) fn ip_key(network: &str, ip: &IpAddr) -> Vec<u8> {
    format!("{network}\0{ip}").into_bytes()
}

/// The ops of a change set, in order.
pub(super) fn encode(changes: &[Change]) -> Result<Vec<Op>, CodecError> {
    fn json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, CodecError> {
        Ok(serde_json::to_vec(v)?)
    }
    changes
        .iter()
        .map(|c| {
            Ok(match c {
                Change::PutNetwork(d) => Op::Put(NETWORKS, d.name.as_bytes().to_vec(), json(d)?),
                Change::DeleteNetwork(n) => Op::Del(NETWORKS, n.as_bytes().to_vec()),
                Change::PutAttachment(a) => Op::Put(ATTACHMENTS, a.key.encode(), json(a)?),
                Change::DeleteAttachment(k) => Op::Del(ATTACHMENTS, k.encode()),
                Change::PutIdle {
                    network,
                    ip,
                    released_at,
                } => Op::Put(
                    IDLE,
                    ip_key(network, ip),
                    released_at.to_be_bytes().to_vec(),
                ),
                Change::DeleteIdle { network, ip } => Op::Del(IDLE, ip_key(network, ip)),
                Change::PutCursor {
                    network,
                    set,
                    cursor,
                } => {
                    let k = format!("{network}\0{set}").into_bytes();
                    match cursor {
                        Some(ip) => Op::Put(CURSORS, k, ip.to_string().into_bytes()),
                        None => Op::Del(CURSORS, k),
                    }
                }
                Change::PutBlock {
                    network,
                    set,
                    block,
                    held,
                } => {
                    let k = format!("{network}\0{set}\0{block}").into_bytes();
                    if *held {
                        Op::Put(BLOCKS, k, Vec::new())
                    } else {
                        Op::Del(BLOCKS, k)
                    }
                }
                Change::PutReservation(r) => Op::Put(RESERVATIONS, r.key.encode(), json(r)?),
                Change::DeleteReservation(k) => Op::Del(RESERVATIONS, k.encode()),
                Change::PutBootId(id) => {
                    Op::Put(META, BOOT_ID.as_bytes().to_vec(), id.as_bytes().to_vec())
                }
                Change::PutClock(anchor) => Op::Put(META, CLOCK.as_bytes().to_vec(), json(anchor)?),
                Change::PutDrain { network, drained } => {
                    let k = format!("{DRAIN_PREFIX}{network}").into_bytes();
                    if *drained {
                        Op::Put(META, k, b"1".to_vec())
                    } else {
                        Op::Del(META, k)
                    }
                }
                Change::PutTakenOver(network) => Op::Put(
                    META,
                    format!("{TAKEN_OVER_PREFIX}{network}").into_bytes(),
                    b"1".to_vec(),
                ),
            })
        })
        .collect()
}

/// A change set's payload: for each op, a tag (0 put, 1 remove), the tree index, the key's
/// length (u32, big-endian) and the key, and for a put the value's length and the value.
pub(super) fn encode_entry(ops: &[Op]) -> Vec<u8> {
    fn part(out: &mut Vec<u8>, p: &[u8]) {
        let len = u32::try_from(p.len()).expect("a store key or value under 4 GiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(p);
    }
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Put(idx, k, v) => {
                out.extend_from_slice(&[0, tree_byte(*idx)]);
                part(&mut out, k);
                part(&mut out, v);
            }
            Op::Del(idx, k) => {
                out.extend_from_slice(&[1, tree_byte(*idx)]);
                part(&mut out, k);
            }
        }
    }
    out
}

fn tree_byte(idx: usize) -> u8 {
    u8::try_from(idx).expect("tree indexes are below 7")
}

pub(super) fn decode_entry(mut b: &[u8]) -> Result<Vec<Op>, CodecError> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], CodecError> {
        if b.len() < n {
            return Err(CodecError::Truncated {
                wanted: n,
                left: b.len(),
            });
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn bytes(b: &mut &[u8]) -> Result<Vec<u8>, CodecError> {
        let len = take(b, 4)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        Ok(take(b, len)?.to_vec())
    }
    let mut ops = Vec::new();
    while !b.is_empty() {
        let h = take(&mut b, 2)?;
        let idx = usize::from(h[1]);
        if idx >= TREES.len() {
            return Err(CodecError::UnknownTree(idx));
        }
        match h[0] {
            0 => {
                let k = bytes(&mut b)?;
                ops.push(Op::Put(idx, k, bytes(&mut b)?));
            }
            1 => ops.push(Op::Del(idx, bytes(&mut b)?)),
            t => return Err(CodecError::UnknownOp(t)),
        }
    }
    Ok(ops)
}

/// Why a change set could not be encoded, or an entry decoded.
#[derive(Debug, thiserror::Error)]
pub(super) enum CodecError {
    #[error("encoding a record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("truncated: wanted {wanted} bytes, {left} left")]
    Truncated { wanted: usize, left: usize },
    #[error("unknown tree index {0}")]
    UnknownTree(usize),
    #[error("unknown op tag {0}")]
    UnknownOp(u8),
}

/// Decodes one log record's payload, naming the record in the error.
pub(super) fn decode_record(
    path: &std::path::Path,
    seq: u64,
    payload: &[u8],
) -> Result<Vec<Op>, StoreError> {
    decode_entry(payload).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        msg: format!("log record {seq} is whole but cannot be decoded: {e}"),
    })
}

#[cfg(test)]
mod tests;
