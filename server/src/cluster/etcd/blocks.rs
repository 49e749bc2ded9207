//! Blocks in etcd: listed (a malformed key reported and counted as occupied), claimed with one
//! create-if-absent transaction conditioned on the pool as it was read, given back with one
//! delete conditioned on the key being the one its owner created.

use ipnet::IpNet;

use super::request::{self, cmp, op};
use super::{
    now_ms, parse_block_part, Block, Claimed, ClusterError, ClusterStore, MalformedKey, Owner,
};

/// Blocks as listed: those with an owner, and keys that name none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub blocks: Vec<Block>,
    pub malformed: Vec<MalformedKey>,
}

impl ClusterStore {
    /// Owned blocks, of one pool and/or one node. Keys that hold no owner are in `malformed`
    /// (whatever the node asked for: nobody can tell whose they are).
    pub async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError> {
        let root = format!("{}/blocks/", self.prefix);
        let prefix = match pool {
            Some(p) => self.blocks_prefix(p),
            None => root.clone(),
        };
        let r = self.client.range(request::get_prefix(prefix)).await?;
        let mut out = Listing::default();
        for item in &r.kvs {
            let key = String::from_utf8_lossy(&item.key).into_owned();
            let rest = key.strip_prefix(&root).unwrap_or(&key);
            let Some((pool_name, part)) = rest.split_once('/') else {
                out.malformed.push(MalformedKey {
                    why: "no pool in the key".into(),
                    key,
                    block: None,
                });
                continue;
            };
            let Some(block) = parse_block_part(part) else {
                out.malformed.push(MalformedKey {
                    why: "no block in the key".into(),
                    key,
                    block: None,
                });
                continue;
            };
            let owner = match serde_json::from_slice::<Owner>(&item.value) {
                Ok(o) => o,
                Err(e) => {
                    out.malformed.push(MalformedKey {
                        why: format!("no owner in the value: {e}"),
                        key,
                        block: Some(block),
                    });
                    continue;
                }
            };
            if node.is_some_and(|n| n != owner.node) {
                continue;
            }
            out.blocks.push(Block {
                pool: pool_name.to_string(),
                block,
                owner,
                create_revision: item.create_revision,
            });
        }
        Ok(out)
    }

    /// Claims `block` of `pool` for `node`: one transaction, won only when no one owns it and
    /// the pool is still as it was at `pool_revision` (its key's mod revision when read).
    pub async fn claim(
        &self,
        pool: &str,
        pool_revision: i64,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError> {
        let key = self.block_key(pool, block);
        let pool_key = self.pool_key(pool);
        let owner = Owner {
            node: node.to_string(),
            claimed_at_ms: now_ms(),
        };
        let value = serde_json::to_vec(&owner).expect("an owner serializes");
        let txn = request::txn(
            [
                cmp::version(key.clone(), cmp::Equal, 0),
                cmp::version(pool_key.clone(), cmp::Greater, 0),
                cmp::mod_revision(pool_key.clone(), cmp::Equal, pool_revision),
            ],
            [op::put(key.clone(), value, 0)],
            [op::get(key.clone()), op::get(pool_key.clone())],
        );
        let r = self.client.txn(txn).await?;
        if r.succeeded {
            let revision = r.header.map(|h| h.revision).unwrap_or_default();
            return Ok(Claimed::Won(Block {
                pool: pool.to_string(),
                block: *block,
                owner,
                create_revision: revision,
            }));
        }
        let mut held = None;
        let mut pool_there = false;
        for kv in request::txn_reads(&r) {
            if kv.key == key.as_bytes() {
                held = Some(match serde_json::from_slice::<Owner>(&kv.value) {
                    Ok(o) => o.node,
                    Err(e) => format!("a malformed key ({e})"),
                });
            } else if kv.key == pool_key.as_bytes() {
                pool_there = true;
            }
        }
        Ok(match (held, pool_there) {
            (Some(holder), _) => Claimed::Lost(holder),
            (None, false) => Claimed::NoPool,
            (None, true) => Claimed::PoolChanged,
        })
    }

    /// Gives `b` back, only if it is still the key its owner created and, with `while_absent`,
    /// only while that key (a node's `alive`, say) does not exist. False: it was not given
    /// back.
    pub async fn give_back(
        &self,
        b: &Block,
        while_absent: Option<&str>,
    ) -> Result<bool, ClusterError> {
        let key = self.block_key(&b.pool, &b.block);
        let mut when = vec![cmp::create_revision(
            key.clone(),
            cmp::Equal,
            b.create_revision,
        )];
        if let Some(k) = while_absent {
            when.push(cmp::version(k, cmp::Equal, 0));
        }
        let txn = request::txn(when, [op::delete(key)], []);
        Ok(self.client.txn(txn).await?.succeeded)
    }
}
