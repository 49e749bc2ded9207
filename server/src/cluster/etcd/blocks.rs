//! Blocks in etcd: listed (a malformed key reported and counted as occupied), claimed with one
//! create-if-absent transaction conditioned on the pool as it was read, given back with one
//! delete conditioned on the key being the one its owner created.
//!
//! Each node's blocks are indexed under `nodes/<node>/blocks/<pool>/<block>`, written and
//! deleted in the same transactions as the block keys: a node's blocks are one range read of
//! its own, whatever the pool's size ([`EtcdStore::node_blocks`]). Each index entry is
//! checked against its block key when read; one that no longer matches is removed, on the
//! entry as read (its revision and the write id it holds). The entry
//! holds the id of the write that last claimed or settled the block, and a give-back compares
//! it as well as the key's revisions: revisions are not unique once etcd was restored from a
//! backup (the revision goes back, and a later write of the key can land on a revision that an
//! older write had, to which a give-back sent before the restore was conditioned).

use ipnet::IpNet;

use super::request::{self, cmp, op};
use super::{parse_block_part, EtcdStore};
use crate::cluster::datastore::BlockStore;
use crate::cluster::vocab::{
    now_ms, Block, Claimed, ClusterError, KeyRevision, Listing, MalformedKey, Owner, Settled,
};

/// Keys per page of a listing that can grow with a pool: a page of blocks is ~450 KB, far
/// under gRPC's 4 MiB, and the largest pool (2^16 blocks) is 16 pages, within the default
/// `store_burst` (20), so a joining node's first view of a full /10 waits for no token.
pub const PAGE: i64 = 4096;
/// Reads per transaction when index entries are checked against their blocks (etcd takes at
/// most 128 operations in one).
const CHECKS_PER_TXN: usize = 100;

/// The ids of block writes (a claim, or a settle): each unique to one write.
static BLOCK_WRITES: super::numbers::Numbers = super::numbers::Numbers::new();

/// The condition that a block key is as a removal of its index entry judged it: gone
/// (`revision` 0), or another node's at `revision`.
pub fn block_as_judged(
    block_key: impl Into<Vec<u8>>,
    revision: i64,
) -> ipool_proto::etcd::etcdserverpb::Compare {
    match revision {
        0 => cmp::version(block_key, cmp::Equal, 0),
        r => cmp::mod_revision(block_key, cmp::Equal, r),
    }
}

/// The index entry's value for write `id`.
fn write_mark(id: u64) -> String {
    format!("w{id:x}")
}

/// The write an index entry names: None for an entry written before the mark (empty).
fn parse_write(value: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(value).ok()?.strip_prefix('w')?;
    u64::from_str_radix(s, 16).ok()
}

impl EtcdStore {
    pub(super) fn index_prefix(&self, node: &str, pool: Option<&str>) -> String {
        match pool {
            Some(p) => self.key(&format!("nodes/{node}/blocks/{p}/")),
            None => self.key(&format!("nodes/{node}/blocks/")),
        }
    }

    pub(super) fn index_key(&self, node: &str, pool: &str, block: &IpNet) -> String {
        format!(
            "{}{}",
            self.index_prefix(node, Some(pool)),
            super::block_key_part(block)
        )
    }

    /// `node`'s blocks (of `pool`, or of every pool): its index, each entry checked against
    /// its block key (read in one transaction per hundred). An entry whose block is gone or
    /// another's is removed (conditioned on the entry being as read); a block key whose value
    /// names no owner is reported.
    pub async fn node_blocks(
        &self,
        node: &str,
        pool: Option<&str>,
    ) -> Result<Listing, ClusterError> {
        let prefix = self.index_prefix(node, None);
        let read = request::get_prefix(self.index_prefix(node, pool));
        let entries = self.client.range_paged(read, PAGE).await?;
        let mut out = Listing::default();
        let mut listed = Vec::new();
        for e in &entries {
            let key = String::from_utf8_lossy(&e.key).into_owned();
            match parse_block_key(&prefix, &key) {
                Ok((p, b)) => listed.push((
                    p.to_string(),
                    b,
                    (e.key.clone(), e.mod_revision, e.value.clone()),
                    parse_write(&e.value),
                )),
                Err(why) => out.malformed.push(MalformedKey {
                    why: why.to_string(),
                    key,
                    block: None,
                }),
            }
        }
        let mut stale = Vec::new();
        for chunk in listed.chunks(CHECKS_PER_TXN) {
            let gets = chunk
                .iter()
                .map(|(p, b, _, _)| op::get(self.block_key(p, b)));
            let r = self.client.txn(request::txn([], gets, [])).await?;
            let found: std::collections::HashMap<Vec<u8>, _> = request::txn_reads(&r)
                .map(|kv| (kv.key.clone(), kv))
                .collect();
            for (p, b, entry, write) in chunk {
                let block_key = self.block_key(p, b);
                match found.get(block_key.as_bytes()) {
                    Some(kv) => match serde_json::from_slice::<Owner>(&kv.value) {
                        Ok(owner) if owner.node == node => out.blocks.push(Block {
                            pool: p.clone(),
                            block: *b,
                            owner,
                            revision: KeyRevision {
                                create: kv.create_revision,
                                modified: kv.mod_revision,
                                write: *write,
                            },
                        }),
                        // Another's: removed while the block key is as read.
                        Ok(_) => stale.push((entry.clone(), block_key.clone(), kv.mod_revision)),
                        Err(e) => out.malformed.push(MalformedKey {
                            why: format!("no owner in the value: {e}"),
                            key: block_key,
                            block: Some(*b),
                        }),
                    },
                    // Gone: removed while it is still gone.
                    None => stale.push((entry.clone(), block_key, 0)),
                }
            }
        }
        for ((key, rev, value), block_key, block_rev) in stale {
            let block = (!crate::bugs::on(crate::bugs::Bug::IndexDroppedUnderItsBlock))
                .then(|| block_as_judged(block_key, block_rev));
            self.drop_index_entry(key, rev, value, block).await?;
        }
        Ok(out)
    }

    /// Removes an index entry as it was read (its key, mod revision and value) because its
    /// block is gone or another's; false when it changed since. The value names the write that
    /// made the entry: its revision alone is not unique once etcd was restored from a backup,
    /// and a removal sent before a restore, applied after it, would take an entry the node
    /// wrote again at the same revision for a block it claimed again (found by the
    /// simulation: the block stayed the node's, in no index, for good).
    /// `block`: the block key as the removal judged it (gone, or another's at a revision),
    /// checked too: an etcd restored meanwhile may have brought the node's block back with
    /// the entry.
    pub async fn drop_index_entry(
        &self,
        key: Vec<u8>,
        revision: i64,
        value: Vec<u8>,
        block: Option<ipool_proto::etcd::etcdserverpb::Compare>,
    ) -> Result<bool, ClusterError> {
        let mut when = vec![cmp::mod_revision(key.clone(), cmp::Equal, revision)];
        if !crate::bugs::on(crate::bugs::Bug::IndexDroppedByRevision) {
            when.push(cmp::value(key.clone(), cmp::Equal, value));
        }
        when.extend(block);
        let r = self
            .client
            .txn(request::txn(when, [op::delete(key)], []))
            .await?;
        Ok(r.succeeded)
    }

    /// Gives `b` back (and its owner's index entry), only if its key is still the write that
    /// was read (created and last written at `b.revision`) and while `also` holds (a release:
    /// the node still away as judged). False: it was not given back.
    pub(super) async fn give_back_if(
        &self,
        b: &Block,
        also: Vec<ipool_proto::etcd::etcdserverpb::Compare>,
    ) -> Result<bool, ClusterError> {
        let key = self.block_key(&b.pool, &b.block);
        let mut when = vec![cmp::create_revision(
            key.clone(),
            cmp::Equal,
            b.revision.create,
        )];
        if !crate::bugs::on(crate::bugs::Bug::GiveBackOnCreation) {
            when.push(cmp::mod_revision(
                key.clone(),
                cmp::Equal,
                b.revision.modified,
            ));
        }
        let index = self.index_key(&b.owner.node, &b.pool, &b.block);
        if let Some(w) = b
            .revision
            .write
            .filter(|_| !crate::bugs::on(crate::bugs::Bug::GiveBackOnRevisions))
        {
            when.push(cmp::value(
                index.clone(),
                cmp::Equal,
                write_mark(w).into_bytes(),
            ));
        }
        when.extend(also);
        let txn = request::txn(when, [op::delete(key), op::delete(index)], []);
        Ok(self.client.txn(txn).await?.succeeded)
    }
}

#[async_trait::async_trait]
impl BlockStore for EtcdStore {
    async fn give_back(&self, b: &Block) -> Result<bool, ClusterError> {
        self.give_back_if(b, Vec::new()).await
    }

    /// Owned blocks, of one pool and/or one node (a node's: its index, read in pages; all of a
    /// pool's: the pool's keys, read in pages). Keys that hold no owner are in `malformed`.
    async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError> {
        if let Some(n) = node {
            return self.node_blocks(n, pool).await;
        }
        let root = format!("{}/blocks/", self.prefix);
        let prefix = match pool {
            Some(p) => self.blocks_prefix(p),
            None => root.clone(),
        };
        let kvs = self
            .client
            .range_paged(request::get_prefix(prefix), PAGE)
            .await?;
        let mut out = Listing::default();
        for item in &kvs {
            let key = String::from_utf8_lossy(&item.key).into_owned();
            match parse_block_key(&root, &key) {
                Err(why) => out.malformed.push(MalformedKey {
                    why: why.to_string(),
                    key,
                    block: None,
                }),
                Ok((pool_name, block)) => match serde_json::from_slice::<Owner>(&item.value) {
                    Ok(owner) => out.blocks.push(Block {
                        pool: pool_name.to_string(),
                        block,
                        owner,
                        revision: KeyRevision {
                            create: item.create_revision,
                            modified: item.mod_revision,
                            write: None,
                        },
                    }),
                    Err(e) => out.malformed.push(MalformedKey {
                        why: format!("no owner in the value: {e}"),
                        key,
                        block: Some(block),
                    }),
                },
            }
        }
        Ok(out)
    }

    /// Claims `block` of `pool` for `node`: one transaction, won only when no one owns it and
    /// the pool is still as it was at `pool_revision` (its key's mod revision when read); the
    /// node's index entry is written with it. A block the node owns already (claimed by an
    /// older ipoold, which wrote no index) comes back as [`Claimed::Mine`], its entry written.
    async fn claim(
        &self,
        pool: &str,
        pool_revision: i64,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError> {
        let key = self.block_key(pool, block);
        let pool_key = self.pool_key(pool);
        let index = self.index_key(node, pool, block);
        let owner = Owner {
            node: node.to_string(),
            claimed_at_ms: now_ms(),
        };
        let value = serde_json::to_vec(&owner).expect("an owner serializes");
        let write = BLOCK_WRITES.next();
        let mut when = vec![
            cmp::version(key.clone(), cmp::Equal, 0),
            cmp::version(pool_key.clone(), cmp::Greater, 0),
        ];
        if !crate::bugs::on(crate::bugs::Bug::ClaimOnStalePool) {
            when.push(cmp::mod_revision(
                pool_key.clone(),
                cmp::Equal,
                pool_revision,
            ));
        }
        let txn = request::txn(
            when,
            [
                op::put(key.clone(), value, 0),
                op::put(index.clone(), write_mark(write), 0),
            ],
            [op::get(key.clone()), op::get(pool_key.clone())],
        );
        let r = self.client.txn(txn).await?;
        if r.succeeded {
            let revision = r.header.map(|h| h.revision).unwrap_or_default();
            return Ok(Claimed::Won(Block {
                pool: pool.to_string(),
                block: *block,
                owner,
                revision: KeyRevision {
                    create: revision,
                    modified: revision,
                    write: Some(write),
                },
            }));
        }
        let mut held = None;
        let mut pool_there = false;
        for kv in request::txn_reads(&r) {
            if kv.key == key.as_bytes() {
                held = Some(match serde_json::from_slice::<Owner>(&kv.value) {
                    Ok(o) => Ok((
                        o,
                        KeyRevision {
                            create: kv.create_revision,
                            modified: kv.mod_revision,
                            write: None,
                        },
                    )),
                    Err(e) => Err(format!("a malformed key ({e})")),
                });
            } else if kv.key == pool_key.as_bytes() {
                pool_there = true;
            }
        }
        Ok(match (held, pool_there) {
            (Some(Ok((o, revision))), _) if o.node == node => {
                // Ours, from before the index: its entry, and the key settled (written again:
                // no give-back of it sent before can apply), conditioned on the key as read.
                let value = serde_json::to_vec(&o).expect("an owner serializes");
                let txn = request::txn(
                    [
                        cmp::create_revision(key.clone(), cmp::Equal, revision.create),
                        cmp::mod_revision(key.clone(), cmp::Equal, revision.modified),
                    ],
                    [op::put(key, value, 0), op::put(index, write_mark(write), 0)],
                    [],
                );
                let r = self.client.txn(txn).await?;
                match r.succeeded {
                    true => Claimed::Mine(Block {
                        pool: pool.to_string(),
                        block: *block,
                        owner: o,
                        revision: KeyRevision {
                            create: revision.create,
                            modified: r.header.map(|h| h.revision).unwrap_or_default(),
                            write: Some(write),
                        },
                    }),
                    false => Claimed::Lost("another node, just now".into()),
                }
            }
            (Some(Ok((o, _))), _) => Claimed::Lost(o.node),
            (Some(Err(why)), _) => Claimed::Lost(why),
            (None, false) => Claimed::NoPool,
            (None, true) => Claimed::PoolChanged,
        })
    }

    /// Settles `b`, listed as its owner's while its state was in doubt (a give-back of it may
    /// be on its way: one whose answer never came, or one sent by a daemon killed since): its
    /// key written again, conditioned on the write that was listed. Some(the key's revision
    /// now): it is the owner's, and no give-back sent before can apply any more. None: the key
    /// changed since it was listed (such a give-back applied, or the key was claimed anew) and
    /// it is not to be used.
    async fn settle(&self, b: &Block) -> Result<Settled, ClusterError> {
        let key = self.block_key(&b.pool, &b.block);
        let index = self.index_key(&b.owner.node, &b.pool, &b.block);
        let value = serde_json::to_vec(&b.owner).expect("an owner serializes");
        let write = BLOCK_WRITES.next();
        let txn = request::txn(
            [
                cmp::create_revision(key.clone(), cmp::Equal, b.revision.create),
                cmp::mod_revision(key.clone(), cmp::Equal, b.revision.modified),
            ],
            [op::put(key, value, 0), op::put(index, write_mark(write), 0)],
            [],
        );
        let r = self.client.txn(txn).await?;
        Ok(match r.succeeded {
            // A block key exists only while its pool does (a claim is conditioned on the pool
            // key, a pool deletion on no block key): no pool to look at here.
            true => Settled::Mine(KeyRevision {
                create: b.revision.create,
                modified: r.header.map(|h| h.revision).unwrap_or_default(),
                write: Some(write),
            }),
            false => Settled::Changed,
        })
    }

    /// Makes `node`'s index complete once: a node that ran an ipoold from before the index (its
    /// `seen` key there, no `indexed` mark) has every pool's blocks read, in pages, and an
    /// entry written for each of its own (conditioned on the block as read); a node never seen
    /// has no blocks to index. Then the mark is written.
    async fn ensure_index(&self, node: &str) -> Result<usize, ClusterError> {
        let mark = self.key(&format!("nodes/{node}/indexed"));
        if !self
            .client
            .range(request::get(mark.clone()))
            .await?
            .kvs
            .is_empty()
        {
            return Ok(0);
        }
        let seen = self.key(&format!("nodes/{node}/seen"));
        let mut written = 0;
        if !self.client.range(request::get(seen)).await?.kvs.is_empty() {
            let all = self.list_blocks(None, None).await?;
            for b in all.blocks.iter().filter(|b| b.owner.node == node) {
                let key = self.block_key(&b.pool, &b.block);
                let txn = request::txn(
                    [cmp::create_revision(key, cmp::Equal, b.revision.create)],
                    [op::put(self.index_key(node, &b.pool, &b.block), "", 0)],
                    [],
                );
                written += usize::from(self.client.txn(txn).await?.succeeded);
            }
        }
        self.client.put(request::put(mark, "1", 0)).await?;
        Ok(written)
    }
}

/// `<pool>/<block>` under `root`.
pub(super) fn parse_block_key<'a>(
    root: &str,
    key: &'a str,
) -> Result<(&'a str, IpNet), BadBlockKey> {
    let rest = key.strip_prefix(root).unwrap_or(key);
    let (pool, part) = rest.split_once('/').ok_or(BadBlockKey::NoPool)?;
    let block = parse_block_part(part).ok_or(BadBlockKey::NoBlock)?;
    Ok((pool, block))
}

/// What a block's key lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum BadBlockKey {
    #[error("no pool in the key")]
    NoPool,
    #[error("no block in the key")]
    NoBlock,
}
