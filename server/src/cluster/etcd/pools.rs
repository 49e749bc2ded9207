//! Pools in etcd: created only when no other pool overlaps (however creations interleave),
//! read with the revision a claim is conditioned on, changed with one transaction conditioned
//! on the pool as read (a CIDR added: on no pool written since the overlap check; one removed:
//! on no block of the pool created since the listing that found none in it), deleted only
//! when no block of theirs is owned.

use super::request::{self, cmp, op};
use super::EtcdStore;
use crate::cluster::datastore::{BlockStore, PoolStore};
use crate::cluster::ippool::{PoolChange, PoolSpec};
use crate::cluster::vocab::{ClusterError, MalformedKey, Pool, PoolPhase, Pools};

/// Listings a pool creation checks before it gives up on pools that keep changing.
const CREATE_ATTEMPTS: usize = 5;

#[async_trait::async_trait]
impl PoolStore for EtcdStore {
    /// Creates `spec`; refused when a pool of that name exists or its CIDRs overlap another
    /// pool's (or a malformed pool key stands there). The overlap check holds however
    /// creations interleave: the creation is conditioned on no pool having been written since
    /// the listing it checked.
    async fn create_pool(&self, spec: &PoolSpec) -> Result<(), ClusterError> {
        spec.validate().map_err(ClusterError::from)?;
        let key = self.pool_key(&spec.name);
        let value = serde_json::to_vec(spec).expect("a pool serializes");
        for _ in 0..CREATE_ATTEMPTS {
            let listed = self.pools().await?;
            if let Some(m) = listed.malformed.first() {
                return Err(ClusterError::Refused(format!(
                    "pool {:?}: another pool's key is malformed, so overlaps cannot be ruled out: {m} (fix or delete it)",
                    spec.name
                )));
            }
            for Pool { spec: other, .. } in listed.pools {
                for a in &spec.cidrs {
                    if let Some(b) = other.cidrs.iter().find(|b| a.contains(*b) || b.contains(a)) {
                        return Err(ClusterError::Refused(format!(
                            "pool {:?}: CIDR {a} overlaps {b} of pool {:?}",
                            spec.name, other.name
                        )));
                    }
                }
            }
            let txn = request::txn(
                [
                    cmp::version(key.clone(), cmp::Equal, 0),
                    cmp::with_prefix(cmp::mod_revision(
                        self.pools_prefix(),
                        cmp::Less,
                        listed.revision + 1,
                    )),
                ],
                [op::put(key.clone(), value.clone(), 0)],
                [op::get(key.clone())],
            );
            let r = self.client.txn(txn).await?;
            if r.succeeded {
                return Ok(());
            }
            if request::txn_reads(&r).next().is_some() {
                return Err(ClusterError::Refused(format!(
                    "pool {:?} exists already",
                    spec.name
                )));
            }
            // Another pool was written since the listing: check again.
        }
        Err(ClusterError::Refused(format!(
            "pool {:?}: other pools kept changing during {CREATE_ATTEMPTS} attempts; try again",
            spec.name
        )))
    }

    /// Every pool; a key that holds no pool is reported, not an error.
    async fn pools(&self) -> Result<Pools, ClusterError> {
        let r = self
            .client
            .range(request::get_prefix(self.pools_prefix()))
            .await?;
        let mut out = Pools {
            pools: Vec::new(),
            malformed: Vec::new(),
            revision: r.header.map(|h| h.revision).unwrap_or_default(),
        };
        for kv in &r.kvs {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            match serde_json::from_slice::<PoolSpec>(&kv.value) {
                Ok(spec) => out.pools.push(Pool {
                    spec,
                    revision: kv.mod_revision,
                    phase: PoolPhase::Ready,
                }),
                Err(e) => out.malformed.push(MalformedKey {
                    key,
                    why: e.to_string(),
                    block: None,
                }),
            }
        }
        Ok(out)
    }

    /// Pool `name` and the revision it was last written at (a claim is conditioned on it).
    async fn get_pool(&self, name: &str) -> Result<Option<Pool>, ClusterError> {
        let key = self.pool_key(name);
        let r = self.client.range(request::get(key.clone())).await?;
        let Some(kv) = r.kvs.first() else {
            return Ok(None);
        };
        let spec = parse_pool(name, key, &kv.value)?;
        Ok(Some(Pool {
            spec,
            revision: kv.mod_revision,
            phase: PoolPhase::Ready,
        }))
    }

    /// Changes pool `name`: one transaction, conditioned on the pool as read (a claim is
    /// conditioned on it too: one decided before fails after). A CIDR added must overlap no
    /// other pool (conditioned on no pool written since the listing checked); a CIDR removed
    /// must hold no block of the pool (conditioned on no block key of the pool created since
    /// the listing that found none there).
    async fn change_pool(&self, name: &str, change: &PoolChange) -> Result<PoolSpec, ClusterError> {
        let key = self.pool_key(name);
        for _ in 0..CREATE_ATTEMPTS {
            let r = self.client.range(request::get(key.clone())).await?;
            let read_at = r.header.map(|h| h.revision).unwrap_or_default();
            let Some(kv) = r.kvs.first() else {
                return Err(ClusterError::NotFound(format!("no pool {name:?}")));
            };
            let spec = parse_pool(name, key.clone(), &kv.value)?;
            let next = spec.changed(change).map_err(ClusterError::from)?;
            let mut when = vec![cmp::mod_revision(key.clone(), cmp::Equal, kv.mod_revision)];
            // And on its value as read: an etcd restored from a backup with its data copied
            // (no `--bump-revision`) numbers its writes again from the backup's revision, so
            // that a change sent before it and landing late can find the pool at the revision
            // it read, written since with another content (an acknowledged change lost).
            if !crate::bugs::on(crate::bugs::Bug::PoolChangeOnRevisionOnly) {
                when.push(cmp::value(key.clone(), cmp::Equal, kv.value.clone()));
            }
            match change {
                PoolChange::AddCidr(c) => {
                    let listed = self.pools().await?;
                    if let Some(why) = overlap(name, c, &listed) {
                        return Err(ClusterError::Refused(why));
                    }
                    when.push(cmp::with_prefix(cmp::mod_revision(
                        self.pools_prefix(),
                        cmp::Less,
                        listed.revision + 1,
                    )));
                }
                PoolChange::RemoveCidr(c) => {
                    let owned = self.list_blocks(Some(name), None).await?;
                    if let Some(why) = owned.owned_in(name, c) {
                        return Err(ClusterError::Refused(why));
                    }
                    // The addresses it sets aside in the CIDR: none pinned (the removal takes
                    // their exclusion along, and a block could be claimed over them later),
                    // conditioned on no such pin created since the listing. (None can be
                    // where no excluded range meets the CIDR.)
                    if spec.exclude.iter().any(|x| x.contains(c) || c.contains(x)) {
                        let (why, listed_at) = self.set_aside_pinned(name, Some(c)).await?;
                        if let Some(why) = why {
                            return Err(ClusterError::Refused(why));
                        }
                        when.push(cmp::with_prefix(cmp::create_revision(
                            self.set_aside_prefix(name),
                            cmp::Less,
                            listed_at + 1,
                        )));
                    }
                    // Every block key of the pool as old as the read: the listing saw them all.
                    when.push(cmp::with_prefix(cmp::create_revision(
                        self.blocks_prefix(name),
                        cmp::Less,
                        read_at + 1,
                    )));
                }
                PoolChange::Disable
                | PoolChange::Enable
                | PoolChange::Reserve(_)
                | PoolChange::Unreserve(_)
                | PoolChange::SetNodeSelector(_)
                | PoolChange::SetBlockSize { .. } => {}
            }
            let value = serde_json::to_vec(&next).expect("a pool serializes");
            let txn = request::txn(when, [op::put(key.clone(), value, 0)], []);
            if self.client.txn(txn).await?.succeeded {
                return Ok(next);
            }
            // The pool, another pool or a block of it was written since it was read: again.
        }
        Err(ClusterError::Refused(format!(
            "pool {name:?}: it kept changing during {CREATE_ATTEMPTS} attempts; try again"
        )))
    }

    /// Deletes pool `name`; refused while any of its blocks is owned.
    async fn delete_pool(&self, name: &str) -> Result<(), ClusterError> {
        let key = self.pool_key(name);
        let blocks = self.blocks_prefix(name);
        // Nor while an address it sets aside is pinned (a pool made again under its name
        // could hand it out).
        let txn = request::txn(
            [
                cmp::version(key.clone(), cmp::Greater, 0),
                cmp::with_prefix(cmp::version(blocks, cmp::Equal, 0)),
                cmp::with_prefix(cmp::version(self.set_aside_prefix(name), cmp::Equal, 0)),
            ],
            [op::delete(key)],
            [],
        );
        if self.client.txn(txn).await?.succeeded {
            return Ok(());
        }
        let Some(pool) = self.get_pool(name).await? else {
            return Err(ClusterError::NotFound(format!("no pool {name:?}")));
        };
        if !pool.spec.exclude.is_empty() {
            if let (Some(why), _) = self.set_aside_pinned(name, None).await? {
                return Err(ClusterError::Refused(why));
            }
        }
        let owned = self.list_blocks(Some(name), None).await?;
        Err(ClusterError::Refused(format!(
            "pool {name:?} still has {} owned block(s) (release them first: ipoolctl cluster release-node)",
            owned.blocks.len() + owned.malformed.len()
        )))
    }
}

impl EtcdStore {
    /// Why pool `name` may not stop setting aside its addresses (in `within`, else all): some
    /// are pinned (None: none is); and the revision the pins were listed at.
    async fn set_aside_pinned(
        &self,
        name: &str,
        within: Option<&ipnet::IpNet>,
    ) -> Result<(Option<String>, i64), ClusterError> {
        let r = self
            .client
            .range(request::get_prefix(self.set_aside_prefix(name)))
            .await?;
        let at = r.header.as_ref().map_or(0, |h| h.revision);
        let pinned: Vec<String> = r
            .kvs
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(&kv.key);
                let address: std::net::IpAddr = key.rsplit('/').next()?.parse().ok()?;
                within
                    .is_none_or(|c| c.contains(&address))
                    .then(|| address.to_string())
            })
            .collect();
        // A key that names no address counts (malformed: what it pins cannot be told).
        let malformed = r
            .kvs
            .iter()
            .filter(|kv| {
                String::from_utf8_lossy(&kv.key)
                    .rsplit('/')
                    .next()
                    .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                    .is_none()
            })
            .count();
        let why = (!pinned.is_empty() || malformed > 0).then(|| {
            format!(
                "pool {name:?} has pinned addresses among those it sets aside ({}): unpin them first (ipoolctl cluster pins --pool {name}; ipoolctl cluster unpin)",
                match malformed {
                    0 => pinned.join(", "),
                    n => format!("{}; {n} malformed", pinned.join(", ")),
                }
            )
        });
        Ok((why, at))
    }
}

/// Why CIDR `cidr` may not join pool `name`: it overlaps another listed pool (or a malformed
/// pool key rules nothing out).
pub(in crate::cluster) fn overlap(
    name: &str,
    cidr: &ipnet::IpNet,
    listed: &Pools,
) -> Option<String> {
    if let Some(m) = listed.malformed.first() {
        return Some(format!(
            "pool {name:?}: another pool's key is malformed, so overlaps cannot be ruled out: {m} (fix or delete it)"
        ));
    }
    listed
        .pools
        .iter()
        .filter(|p| p.spec.name != name)
        .find_map(|p| {
            let b = p
                .spec
                .cidrs
                .iter()
                .find(|b| cidr.contains(*b) || b.contains(cidr))?;
            Some(format!(
                "pool {name:?}: CIDR {cidr} overlaps {b} of pool {:?}",
                p.spec.name
            ))
        })
}

/// Pool `name` as its key (`key`) holds it: malformed when it holds no pool, or another's.
fn parse_pool(name: &str, key: String, value: &[u8]) -> Result<PoolSpec, ClusterError> {
    let spec: PoolSpec = serde_json::from_slice(value).map_err(|e| ClusterError::Malformed {
        what: "pool",
        key: key.clone(),
        why: e.to_string(),
    })?;
    if spec.name != name {
        return Err(ClusterError::Malformed {
            what: "pool",
            key,
            why: format!("it names pool {:?}", spec.name),
        });
    }
    Ok(spec)
}
