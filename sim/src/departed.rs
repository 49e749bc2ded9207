//! The release of departed nodes (`[cluster] release_departed_after_secs`) as the daemon that
//! leads it runs it, or (runs with [`Options::cronjob`](crate::Options::cronjob)) as
//! deploy/cluster-kubernetes's CronJob does, `ipoolctl cluster release-departed` with no daemon
//! of its own and the operator's identity: ipool's own `departed::sweep`, through the net
//! (its requests delivered, failed, lost or held as any others), its Nodes those of the slots
//! whose node is not gone, as the apiserver lists them when it starts. A node that
//! comes back meanwhile is what its conditioned writes are for; the checker judges what it
//! gave back as it judges release-node without `--force` (docs/simulation.md, rule 8).

use std::collections::BTreeSet;

use ipool_server::cluster::departed::{sweep, Directory, Outcome, Thresholds};
use ipool_server::cluster::pin::PinOwner;
use ipool_server::cluster::vocab::LookupFailed;

use crate::commands::OpDone;
use crate::world::World;
use crate::StoreKind;

/// The Nodes as listed when the look began, and the pins' owners gone then.
struct Listed(BTreeSet<String>, crate::owners::GoneOwners);

#[async_trait::async_trait]
impl Directory for Listed {
    async fn names(&self) -> Result<BTreeSet<String>, LookupFailed> {
        Ok(self.0.clone())
    }

    async fn exists(&self, name: &str) -> Result<bool, LookupFailed> {
        Ok(self.0.contains(name))
    }

    async fn owner_gone(&self, owner: &PinOwner) -> Result<Option<String>, LookupFailed> {
        use ipool_server::k8s::pin_keeper::Owners;
        self.1.gone(owner).await
    }
}

/// One look of the leader's, one command at a time with the operator's.
pub(crate) fn departed(w: &mut World) {
    if w.operator.running.is_some() {
        return;
    }
    if w.opts.cronjob {
        let after = [0u64, 30][w.choices.pick(2) as usize];
        look(w, None, after);
        return;
    }
    let live: Vec<usize> = (0..w.slots.len())
        .filter(|&i| w.slots[i].daemon.is_some())
        .collect();
    if live.is_empty() {
        return;
    }
    let me = live[w.choices.pick(live.len() as u32) as usize];
    // The threshold: none past the fence, or half a minute.
    let after = [0u64, 30][w.choices.pick(2) as usize];
    look(w, cronjob_on_kube(w, me), after);
}

/// Who looks where a daemon would lead (slot `me`'s): on the Kubernetes API the CronJob, as
/// deploy/cluster-kubernetes has it (its admission policies keep each ipoold to its own
/// node's blocks and Lease: no daemon may release another's).
pub(crate) fn cronjob_on_kube(w: &World, me: usize) -> Option<usize> {
    match w.opts.store {
        StoreKind::Kube => None,
        StoreKind::Etcd => Some(me),
    }
}

/// A look by slot `me`'s daemon (None: the CronJob's), with the threshold `after` (seconds).
pub(crate) fn look(w: &mut World, me: Option<usize>, after: u64) {
    let me = me.map(|i| w.slots[i].name.clone());
    let nodes: BTreeSet<String> = w
        .slots
        .iter()
        .filter(|s| s.twin_of.is_none() && !(s.gone && s.daemon.is_none()))
        .filter(|s| !w.nodes_deleted.contains(&s.name))
        .map(|s| w.setting.k8s_node(&s.name))
        .collect();
    let who = me.clone().unwrap_or_else(|| "the CronJob".into());
    let what = format!("{who} releases departed nodes (after {after} s; Nodes {nodes:?})");
    let role = if me.is_some() { "leader" } else { "cronjob" };
    w.note(format!("{role}: {what}"));
    let op = w.command(crate::commands::Op {
        forced: false,
        release_of: None,
        departed: true,
    });
    if me.is_none() {
        w.operator.cronjob.insert(op);
    }
    let store = match me {
        Some(_) => w.leader_store(),
        None => w.operator_store_elsewhere(false),
    };
    let (ops, kind) = (w.operator.done.clone(), w.opts.store);
    let owners = crate::owners::GoneOwners(w.owners_gone.clone());
    tokio::spawn(async move {
        let place = match kind {
            StoreKind::Etcd => "etcd",
            StoreKind::Kube => "the Kubernetes API",
        };
        let result = match store.await {
            Err(e) => Err(e),
            Ok(s) => {
                let limits = Thresholds {
                    after,
                    pin_ttl: crate::PIN_TTL_SECS,
                };
                sweep(&*s, place, me.as_deref(), limits, &Listed(nodes, owners))
                    .await
                    .map(|look| {
                        let said: Vec<String> = look
                            .nodes
                            .iter()
                            .map(|(n, o)| match o {
                                Outcome::Released(r) => {
                                    format!("{n}: {} block(s) given back", r.blocks.len())
                                }
                                Outcome::Kept(r) => {
                                    format!("{n}: {} pinned block(s) kept", r.pinned.len())
                                }
                                Outcome::Waiting(why) => format!("{n}: waits ({why})"),
                                Outcome::Refused(why) => format!("{n}: refused ({why})"),
                                Outcome::Failed(why) => format!("{n}: failed ({why})"),
                                Outcome::Unknown(why) => format!("{n}: unknown ({why})"),
                            })
                            .collect();
                        said.join("; ")
                    })
                    .map_err(|e| e.to_string())
            }
        };
        ops.lock().expect("ops").push(OpDone {
            what,
            result,
            seq: op,
            second: false,
        });
    });
}
