//! Nodes in etcd: the heartbeat that holds a node's name for one daemon, and giving back the
//! blocks of a node that is gone (`ipoolctl cluster release-node`). Keys, under the prefix:
//!
//! - `nodes/<node>/alive` ([`Alive`](crate::cluster::model::Alive)): on a lease of `heartbeat_ttl_secs` that the daemon
//!   renews. Created only when absent, or when it is this daemon's own (the same `instance`: the
//!   node's state dir); a daemon that finds another instance there holds back until that one's
//!   lease is gone. Gone within the TTL of the daemon stopping or losing etcd.
//! - `nodes/<node>/seen` ([`Seen`](crate::cluster::model::Seen)): on a second lease of [`SEEN_TTL_SECS`], renewed with the
//!   first: how long the node has been away is that lease's granted TTL minus what is left of
//!   it, as etcd counts (no wall clock of any machine is compared). Gone after
//!   [`SEEN_TTL_SECS`] of absence, or when the node is released.
//!
//! Both say the name of the node's Node object, where its daemon knows it
//! ([`Alive::k8s_node`](crate::cluster::model::Alive::k8s_node)).
//!
//! release-node gives back each block, and ends each of the node's holds on pins, in one
//! transaction each conditioned on the node's `alive` key being absent: a daemon that comes
//! back meanwhile keeps its blocks and its holds. Its `seen` key goes last, only while it is
//! still the one judged, and only when no block is left to it.

use super::request::{self, cmp, op};
use super::ClusterStore;
use crate::cluster::datastore::{BlockStore, Freed, NameStore, Release};
use crate::cluster::model::{
    now_ms, Acquired, Alive, ClusterError, Heartbeat, InUse, Listing, NodeSeen, NodeState, Seen,
};

/// The `seen` lease's TTL: absences up to this long are measured; past it, the key is gone and
/// the absence is at least this long.
pub const SEEN_TTL_SECS: i64 = 30 * 24 * 3600;

/// The key under a node's that holds its daemon's last report of its addresses in use.
const IN_USE: &str = "in-use";

impl ClusterStore {
    fn node_key(&self, node: &str, what: &str) -> String {
        self.key(&format!("nodes/{node}/{what}"))
    }

    /// The `alive` key of `node`.
    pub fn alive_key(&self, node: &str) -> String {
        self.node_key(node, "alive")
    }
}

#[async_trait::async_trait]
impl NameStore for ClusterStore {
    /// Takes `node`'s name for `me` (an instance id): grants the leases and creates `alive`
    /// only if it is absent or `me`'s own. The leases of a start that found the name taken are
    /// revoked.
    async fn start_heartbeat(
        &self,
        node: &str,
        me: &Alive,
        ttl_secs: u64,
        renew_secs: u64,
    ) -> Result<Acquired, ClusterError> {
        let alive_key = self.alive_key(node);
        let alive_lease = self.client().lease_grant(ttl_secs as i64).await?.id;
        let value = serde_json::to_vec(me).expect("serializes");
        // Absent: create it. Present: read it (ours: take it over, on the new lease).
        let txn = request::txn(
            [cmp::version(alive_key.clone(), cmp::Equal, 0)],
            [op::put(alive_key.clone(), value.clone(), alive_lease)],
            [op::get(alive_key.clone())],
        );
        let r = self.client().txn(txn).await?;
        if !r.succeeded {
            let kv = request::txn_reads(&r).next().cloned();
            let theirs = kv
                .as_ref()
                .map(|kv| serde_json::from_slice::<Alive>(&kv.value));
            let taken = match (&kv, theirs) {
                (Some(kv), Some(Ok(a))) if a.instance == me.instance => {
                    let txn = request::txn(
                        [cmp::mod_revision(
                            alive_key.clone(),
                            cmp::Equal,
                            kv.mod_revision,
                        )],
                        [op::put(alive_key.clone(), value, alive_lease)],
                        [],
                    );
                    match self.client().txn(txn).await?.succeeded {
                        true => None,
                        // Changed under us: look again at the next start.
                        false => Some((a.instance, 0)),
                    }
                }
                // The old way: the name taken whoever held it.
                (Some(_), Some(Ok(_))) if crate::bugs::on(crate::bugs::Bug::NameNotExclusive) => {
                    let put = op::put(alive_key.clone(), value, alive_lease);
                    self.client().txn(request::txn([], [put], [])).await?;
                    None
                }
                (Some(kv), Some(Ok(a))) => Some((a.instance, kv.lease)),
                (Some(kv), Some(Err(e))) => Some((format!("unreadable ({e})"), kv.lease)),
                // Gone between the two reads.
                _ => Some((String::new(), 0)),
            };
            if let Some((instance, lease)) = taken {
                let _ = self.client().lease_revoke(alive_lease).await;
                let ttl_left = match lease {
                    0 => 0,
                    id => self.client().lease_time_to_live(id).await?.ttl,
                };
                return Ok(Acquired::Taken { instance, ttl_left });
            }
        }
        let seen_lease = self.client().lease_grant(SEEN_TTL_SECS).await?.id;
        let seen = Seen {
            instance: me.instance.clone(),
            fence_secs: me.fence_secs,
            renew_secs,
            at_ms: now_ms(),
            k8s_node: me.k8s_node.clone(),
        };
        self.client()
            .put(request::put(
                self.node_key(node, "seen"),
                serde_json::to_vec(&seen).expect("serializes"),
                seen_lease,
            ))
            .await?;
        Ok(Acquired::Held(Heartbeat {
            alive_key,
            instance: me.instance.clone(),
            alive_lease,
            seen_lease,
        }))
    }

    /// Renews both leases of `beat` and, with `check`, reads its `alive` key back; an error
    /// once the lease is gone or the key is no longer on it (etcd restored from a backup, the
    /// key deleted or replaced). The read also shows a reset etcd to the client (the revision
    /// in its answer); a lease answer shows its cluster id. Without `check` (the node's watch
    /// of the key is on and said nothing), two keep-alives and no read.
    async fn renew_heartbeat(&self, beat: &Heartbeat, check: bool) -> Result<(), ClusterError> {
        let answer = self.client().lease_keep_alive(beat.alive_lease).await?;
        if answer.ttl <= 0 {
            return Err(ClusterError::Refused(
                "the heartbeat's lease expired".into(),
            ));
        }
        self.client().lease_keep_alive(beat.seen_lease).await?;
        if !check {
            return Ok(());
        }
        let mut read = request::get(beat.alive_key.clone());
        read.keys_only = true;
        let alive = self.client().range(read).await?;
        match alive.kvs.first() {
            Some(kv) if kv.lease == beat.alive_lease => Ok(()),
            _ => Err(ClusterError::Refused(format!(
                "{} is no longer on this daemon's lease",
                beat.alive_key
            ))),
        }
    }

    /// Ends a heartbeat at once (a clean stop): the node is away from now on.
    async fn stop_heartbeat(&self, beat: &Heartbeat) -> Result<(), ClusterError> {
        self.client().lease_revoke(beat.alive_lease).await?;
        Ok(())
    }

    /// The node's `alive` and `seen` keys, how long etcd says it has been away, and its
    /// blocks.
    async fn node_state(&self, node: &str) -> Result<NodeState, ClusterError> {
        let alive = self
            .client()
            .range(request::get(self.alive_key(node)))
            .await?;
        let alive = alive.kvs.first().map(|kv| {
            serde_json::from_slice::<Alive>(&kv.value).unwrap_or(Alive {
                instance: format!("unreadable: {}", String::from_utf8_lossy(&kv.value)),
                ..Alive::default()
            })
        });
        let seen_key = self.node_key(node, "seen");
        let seen = self.client().range(request::get(seen_key.clone())).await?;
        let judged = seen.kvs.first().map(|kv| kv.mod_revision.to_string());
        let seen = match seen.kvs.first() {
            None => None,
            Some(kv) => {
                let value: Seen =
                    serde_json::from_slice(&kv.value).map_err(|e| ClusterError::Malformed {
                        what: "node's seen key",
                        key: seen_key.clone(),
                        why: e.to_string(),
                    })?;
                if kv.lease == 0 {
                    return Err(ClusterError::Malformed {
                        what: "node's seen key",
                        key: seen_key,
                        why: "it is on no lease (written by an older ipoold): how long the node has been away cannot be measured".into(),
                    });
                }
                let ttl = self.client().lease_time_to_live(kv.lease).await?;
                let away = match ttl.ttl {
                    // Expired between the two reads.
                    t if t < 0 => SEEN_TTL_SECS,
                    t => ttl.granted_ttl - t,
                };
                Some((value, away))
            }
        };
        let k8s_node = seen
            .as_ref()
            .and_then(|(s, _)| s.k8s_node.clone())
            .or_else(|| alive.as_ref().and_then(|a| a.k8s_node.clone()));
        let blocks = self.blocks_of_node(node).await?;
        Ok(NodeState {
            alive,
            seen,
            blocks,
            unproven: None,
            judged,
            k8s_node,
        })
    }

    /// Every node with an `alive` or a `seen` key (read in pages with the rest of `nodes/`),
    /// and, for one not alive, how long etcd says it has been away.
    async fn nodes_seen(&self) -> Result<Vec<NodeSeen>, ClusterError> {
        let prefix = self.key("nodes/");
        let kvs = self
            .client()
            .range_paged(request::get_prefix(prefix.clone()), 1000)
            .await?;
        let mut nodes: std::collections::BTreeMap<String, NodeSeen> = Default::default();
        let mut seen_leases = Vec::new();
        let mut reports = Vec::new();
        for kv in &kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let Some((node, what)) = key[prefix.len().min(key.len())..].split_once('/') else {
                continue;
            };
            if what == IN_USE {
                if let Ok(r) = serde_json::from_slice::<InUse>(&kv.value) {
                    reports.push((node.to_string(), r));
                }
                continue;
            }
            if what != "alive" && what != "seen" {
                continue;
            }
            let entry = nodes.entry(node.to_string()).or_insert_with(|| NodeSeen {
                node: node.to_string(),
                ..NodeSeen::default()
            });
            if what == "alive" {
                let a = serde_json::from_slice::<Alive>(&kv.value);
                entry.alive = Some(
                    a.as_ref()
                        .map_or_else(|e| format!("unreadable ({e})"), |a| a.instance.clone()),
                );
                if let Ok(a) = a {
                    entry.fence_secs = a.fence_secs;
                    entry.k8s_node = entry.k8s_node.take().or(a.k8s_node);
                }
            } else {
                if let Ok(seen) = serde_json::from_slice::<Seen>(&kv.value) {
                    entry.fence_secs = entry.fence_secs.max(seen.fence_secs);
                    entry.k8s_node = seen.k8s_node.or(entry.k8s_node.take());
                }
                if kv.lease != 0 {
                    seen_leases.push((node.to_string(), kv.lease));
                }
            }
        }
        for (node, lease) in seen_leases {
            if nodes.get(&node).is_some_and(|n| n.alive.is_none()) {
                let ttl = self.client().lease_time_to_live(lease).await?;
                let away = match ttl.ttl {
                    t if t < 0 => SEEN_TTL_SECS,
                    t => ttl.granted_ttl - t,
                };
                if let Some(n) = nodes.get_mut(&node) {
                    n.away_secs = Some(away);
                }
            }
        }
        // A report of a node with neither key (released) is left out with it.
        for (node, r) in reports {
            if let Some(n) = nodes.get_mut(&node) {
                n.in_use = Some(r);
            }
        }
        Ok(nodes.into_values().collect())
    }

    /// `nodes/<node>/in-use` on the heartbeat's `seen` lease (gone with it).
    async fn report_in_use(
        &self,
        node: &str,
        beat: &Heartbeat,
        in_use: u64,
    ) -> Result<(), ClusterError> {
        let r = InUse {
            in_use,
            at_ms: now_ms(),
        };
        self.client()
            .put(request::put(
                self.node_key(node, IN_USE),
                serde_json::to_vec(&r).expect("serializes"),
                beat.seen_lease,
            ))
            .await?;
        Ok(())
    }

    /// Every block of `node`: its index, or, for a node that never ran an ipoold with the index
    /// (no `indexed` mark), the pools' blocks read in pages.
    async fn blocks_of_node(&self, node: &str) -> Result<Listing, ClusterError> {
        let indexed = !self
            .client()
            .range(request::get(self.node_key(node, "indexed")))
            .await?
            .kvs
            .is_empty();
        match indexed {
            true => self.list_blocks(None, Some(node)).await,
            false => {
                let mut all = self.list_blocks(None, None).await?;
                all.blocks.retain(|b| b.owner.node == node);
                Ok(all)
            }
        }
    }

    /// Gives back the plan's blocks, each conditioned on its create revision and (unless
    /// forced) on the node's `alive` key being absent, then ends the node's holds on pins
    /// (each conditioned on the pin as read and the same absence), then, when no block is left
    /// to it, drops its record while its `seen` key is the one judged. Stops with an error when
    /// the node came back.
    async fn release_node(&self, node: &str, plan: &Release<'_>) -> Result<Freed, ClusterError> {
        let alive = self.alive_key(node);
        let unless = (!plan.force).then_some(alive.as_str());
        let absent = || match unless {
            Some(k) if !crate::bugs::on(crate::bugs::Bug::ReleaseUnconditioned) => {
                vec![cmp::version(k, cmp::Equal, 0)]
            }
            _ => Vec::new(),
        };
        let came_back = |freed: &Freed| {
            ClusterError::Refused(format!(
                "node {node:?} came back while its blocks were given back ({} given back, {} kept)",
                freed.blocks.len(),
                plan.blocks.len() - freed.blocks.len()
            ))
        };
        let mut freed = Freed::default();
        for b in plan.blocks {
            if self.give_back_unless(b, unless).await? {
                freed.blocks.push(b.clone());
                continue;
            }
            if !plan.force && self.node_state(node).await?.alive.is_some() {
                return Err(came_back(&freed));
            }
        }
        for (read, pin) in plan.holds {
            match self.write_pin_if(read, pin, absent()).await? {
                Some(_) => freed.unheld.push(pin.clone()),
                None if !plan.force && self.node_state(node).await?.alive.is_some() => {
                    return Err(came_back(&freed));
                }
                // The pin changed since it was read: its holders are no longer as judged.
                None => {}
            }
        }
        if plan.keeps_blocks {
            return Ok(freed);
        }
        let seen = self.node_key(node, "seen");
        let mut when = absent();
        if let Some(rev) = plan.state.judged.as_deref().filter(|_| !plan.force) {
            let rev: i64 = rev.parse().map_err(|_| ClusterError::Malformed {
                what: "judged record",
                key: seen.clone(),
                why: format!("{rev:?} is not a revision"),
            })?;
            when.push(cmp::mod_revision(seen.clone(), cmp::Equal, rev));
        }
        let drop = [op::delete(seen), op::delete(self.node_key(node, IN_USE))];
        // Not dropped: the daemon came back (its own record stays).
        self.client().txn(request::txn(when, drop, [])).await?;
        Ok(freed)
    }
}
