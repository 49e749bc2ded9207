//! Nodes in etcd: the heartbeat that holds a node's name for one daemon, and giving back the
//! blocks of a node that is gone (`ipoolctl cluster release-node`). Keys, under the prefix:
//!
//! - `nodes/<node>/alive` ([`Alive`](crate::cluster::vocab::Alive)): on a lease of `heartbeat_ttl_secs` that the daemon
//!   renews. Created only when absent, or when it is this daemon's own (the same `instance`: the
//!   node's state dir); a daemon that finds another instance there holds back until that one's
//!   lease is gone. Gone within the TTL of the daemon stopping or losing etcd.
//! - `nodes/<node>/seen` ([`Seen`](crate::cluster::vocab::Seen)): on a second lease of [`SEEN_TTL_SECS`], renewed with the
//!   first: how long the node has been away is that lease's granted TTL minus what is left of
//!   it, as etcd counts (no wall clock of any machine is compared). Gone after
//!   [`SEEN_TTL_SECS`] of absence, or when the node is released.
//!
//! Both say the name of the node's Node object, where its daemon knows it
//! ([`Alive::k8s_node`](crate::cluster::vocab::Alive::k8s_node)).
//!
//! - `nodes/<node>/k8s-node`: its Node's name, on no lease, while a release left it blocks
//!   that pins keep (its `seen` key lapses after 30 days; this outlives it).
//!
//! release-node gives back each block, and ends each of the node's holds on pins, in one
//! transaction each conditioned on the node's `alive` key being absent and its `seen` key the
//! one judged: a daemon that comes back meanwhile (or comes and goes) keeps its blocks and its
//! holds. Its record goes last, on the same conditions, and only when no block nor hold is
//! left to it.

use super::request::{self, cmp, op};
use super::EtcdStore;
use crate::cluster::datastore::{BlockStore, Freed, NameStore, Release};
use crate::cluster::vocab::{
    now_ms, Acquired, Alive, ClusterError, Heartbeat, InUse, Listing, NodeSeen, NodeState, Seen,
};

/// The `seen` lease's TTL: absences up to this long are measured; past it, the key is gone and
/// the absence is at least this long.
pub const SEEN_TTL_SECS: i64 = 30 * 24 * 3600;

/// The key under a node's that holds its daemon's last report of its addresses in use.
const IN_USE: &str = "in-use";
/// The key under a node's, on no lease, that keeps its Node's name while a release leaves it
/// blocks (or holds): its `seen` key, which says it too, lapses after [`SEEN_TTL_SECS`].
const K8S_NODE: &str = "k8s-node";

impl EtcdStore {
    fn node_key(&self, node: &str, what: &str) -> String {
        self.key(&format!("nodes/{node}/{what}"))
    }

    /// The witness of `node`'s writes (see [`super::witness`]).
    fn witness_key(&self, node: &str) -> String {
        self.key(&format!("witness/{node}"))
    }

    /// The `alive` key of `node`.
    pub fn alive_key(&self, node: &str) -> String {
        self.node_key(node, "alive")
    }
}

#[async_trait::async_trait]
impl NameStore for EtcdStore {
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
        self.client()
            .set_witness(self.witness_key(node), &me.instance);
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
                // The bug, put back: the name taken whoever held it.
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
        let mut k8s_node = seen
            .as_ref()
            .and_then(|(s, _)| s.k8s_node.clone())
            .or_else(|| alive.as_ref().and_then(|a| a.k8s_node.clone()));
        if k8s_node.is_none() {
            let kept = self
                .client()
                .range(request::get(self.node_key(node, K8S_NODE)))
                .await?;
            k8s_node = kept
                .kvs
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        }
        let blocks = self.blocks_of_node(node).await?;
        Ok(NodeState {
            alive,
            seen,
            blocks,
            unproven: None,
            judged,
            k8s_node,
            confirms: None,
            watched_secs: None,
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
            if what != "alive" && what != "seen" && what != K8S_NODE {
                continue;
            }
            let entry = nodes.entry(node.to_string()).or_insert_with(|| NodeSeen {
                node: node.to_string(),
                ..NodeSeen::default()
            });
            if what == K8S_NODE {
                let kept = String::from_utf8_lossy(&kv.value).into_owned();
                entry.k8s_node = entry.k8s_node.take().or(Some(kept));
            } else if what == "alive" {
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
    /// forced) on the node still being away as judged (its `alive` key absent, its `seen` key
    /// the one judged), then ends the node's holds on pins (each conditioned on the pin as
    /// read and the same absence), then, when no block nor hold is left to it, drops its
    /// record; while it keeps some, its Node's name is kept in a key of no lease
    /// (`k8s-node`), which outlives its `seen` key. Stops with an error when the node came
    /// back.
    async fn release_node(&self, node: &str, plan: &Release<'_>) -> Result<Freed, ClusterError> {
        let seen = self.node_key(node, "seen");
        let away = match plan.force || crate::bugs::on(crate::bugs::Bug::ReleaseUnconditioned) {
            true => Vec::new(),
            false => {
                let judged = match plan.state.judged.as_deref() {
                    None => cmp::version(seen.clone(), cmp::Equal, 0),
                    Some(rev) => {
                        let rev: i64 = rev.parse().map_err(|_| ClusterError::Malformed {
                            what: "judged record",
                            key: seen.clone(),
                            why: format!("{rev:?} is not a revision"),
                        })?;
                        cmp::mod_revision(seen.clone(), cmp::Equal, rev)
                    }
                };
                vec![cmp::version(self.alive_key(node), cmp::Equal, 0), judged]
            }
        };
        let came_back = |freed: &Freed| {
            ClusterError::Refused(format!(
                "node {node:?} came back while its blocks were given back ({} given back, {} kept)",
                freed.blocks.len(),
                plan.blocks.len() - freed.blocks.len()
            ))
        };
        // Whether it is no longer away as judged (back, or back and gone again).
        let moved = || async {
            let now = self.node_state(node).await?;
            Ok::<bool, ClusterError>(now.alive.is_some() || now.judged != plan.state.judged)
        };
        let mut freed = Freed::default();
        for b in plan.blocks {
            // And no pin in it (one made after the plan read them: a forced release keeps a
            // pinned block too).
            let mut when = away.clone();
            if !crate::bugs::on(crate::bugs::Bug::PinAfterReleasePlan) {
                let pins = self.block_pins_prefix(&b.pool, &b.block);
                when.push(cmp::with_prefix(cmp::version(pins, cmp::Equal, 0)));
            }
            if self.give_back_if(b, when).await? {
                freed.blocks.push(b.clone());
                continue;
            }
            if !plan.force && moved().await? {
                return Err(came_back(&freed));
            }
        }
        for (read, pin) in plan.holds {
            match self.write_pin_if(read, pin, away.clone()).await? {
                Some(_) => freed.unheld.push(pin.clone()),
                None if !plan.force && moved().await? => return Err(came_back(&freed)),
                // The pin changed since it was read: its holders are no longer as judged.
                None => {}
            }
        }
        let k8s_node = self.node_key(node, K8S_NODE);
        let kept = plan.keeps_blocks || freed.unheld.len() < plan.holds.len();
        let ops = match (kept, &plan.state.k8s_node) {
            (true, Some(n)) => vec![op::put(k8s_node, n.clone(), 0)],
            (true, None) => Vec::new(),
            (false, _) => vec![
                op::delete(self.witness_key(node)),
                op::delete(seen),
                op::delete(k8s_node),
                op::delete(self.node_key(node, IN_USE)),
            ],
        };
        if !ops.is_empty() {
            // Not written: the daemon came back (its own record stays).
            self.client().txn(request::txn(away, ops, [])).await?;
        }
        Ok(freed)
    }
}
