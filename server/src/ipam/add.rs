//! ADD: one address per range set of the network, all or nothing, idempotent per attachment
//! key (the network a CNI config declares is planned in [`super::declare`]).

use std::net::IpAddr;

use super::events::{Event, EventKind};
use super::pick::pick_addresses;
use super::range_set::{From, Pick};
use super::state::{Network, State};
use super::{sticky, AddReply, AddRequest, Ipam, Pending, Step};
use crate::error::Error;
use crate::model::{AttachmentRecord, Millis, NetworkDef, PoolChoice, Reservation, ReservationKey};
use crate::pool::Since;
use crate::store::{Change, Seq};

/// The longest network namespace path (PATH_MAX).
const MAX_NETNS: usize = 4096;

/// What an ADD decided, before it is written.
struct Plan {
    record: AttachmentRecord,
    picks: Vec<Pick>,
    /// The pod's reservation, used up by this ADD; its addresses the pod did not get back go
    /// idle (range set, address).
    used: Option<(ReservationKey, Vec<(usize, IpAddr)>)>,
}

impl Ipam {
    /// Allocates one address per range set of the network, or returns the attachment's
    /// addresses if it exists (ADD is idempotent). Replies only once the allocation is durable.
    pub async fn add(&self, req: AddRequest) -> Result<AddReply, Error> {
        super::validate_key(&req.key)?;
        ipool_proto::names::check_pod(&req.pod.namespace, &req.pod.name, &req.pod.uid)
            .map_err(Error::InvalidRequest)?;
        ipool_proto::names::check_len("netns", &req.netns, MAX_NETNS)
            .map_err(Error::InvalidRequest)?;
        let declared = match &req.ipam {
            Some(s) => s.network_def(&req.key.network, self.defaults())?,
            None => None,
        };
        let routes_override = req.ipam.as_ref().and_then(|s| s.routes.clone());
        let started = tokio::time::Instant::now();
        let max_wait = self.add_wait();
        loop {
            let left = max_wait.saturating_sub(started.elapsed());
            // Registered before the state is looked at: a landing in between is not missed.
            let landed = self.shared.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            let tried = self.try_add(&req, declared.as_ref(), !left.is_zero());
            if tried.as_ref().err().is_some_and(Error::is_busy) {
                // Nothing ready (a source without addresses, a rate limit): the background
                // loop starts what the sources need now rather than at its next tick.
                self.shared.changed.notify_one();
            }
            match tried? {
                Step::Done((mut reply, seq)) => {
                    self.wait_durable(seq).await?;
                    if let Some(r) = &routes_override {
                        reply.routes = r.clone();
                    }
                    self.shared.changed.notify_one();
                    return Ok(reply);
                }
                Step::Wait(ms) => {
                    tokio::time::sleep(std::time::Duration::from_millis(ms).min(left)).await;
                }
                Step::Pending(pending) => {
                    tracing::debug!(network = %req.key.network, why = %pending.why, "ADD waits for addresses on their way");
                    self.run_claims(pending.claims);
                    // Past the wait, the next try settles for what there is, or fails.
                    let _ = tokio::time::timeout(left, landed).await;
                }
            }
        }
    }

    fn try_add(
        &self,
        req: &AddRequest,
        declared: Option<&NetworkDef>,
        may_wait: bool,
    ) -> Result<Step<(AddReply, Seq)>, Error> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(existing) = st.attachments.get(&req.key) {
            let net = st
                .networks
                .get(&req.key.network)
                .ok_or_else(|| Error::NotFound(format!("network {:?} is gone", req.key.network)))?;
            // Its change set may still be on its way to disk (a retried ADD): wait for it too.
            let seq = self.shared.store.last_appended();
            return Ok(Step::Done((net.reply_for(existing.addresses()), seq)));
        }
        self.serving(st)?;
        if let Some(why) = self.gate_closed() {
            return match may_wait {
                true => Ok(Step::Pending(Pending::new(why))),
                false => Err(Error::Busy(why)),
            };
        }
        if st.is_drained(&req.key.network) {
            return Err(Error::Busy(format!(
                "network {:?} is drained by an operator: no new addresses until it is undrained (ipoolctl drain --undo)",
                req.key.network
            )));
        }
        let now = self.now();
        let mut declaration = self.plan_network(st, &req.key.network, declared, now)?;
        if let Some(d) = declaration.take_if(|d| !d.0.def.cluster_pools.is_empty()) {
            // A cluster pool's network: declared now, with no ranges until the pool is read;
            // the ADD waits for them.
            let name = &req.key.network;
            let pools = d.0.def.cluster_pools.join(", ");
            self.declare_now(st, name, d)?;
            tracing::info!(network = %name, pool = %pools, "network of a cluster pool declared by CNI config");
            let why = format!("network {name:?} was just declared: reading cluster pool {pools:?}");
            return match may_wait {
                true => Ok(Step::Pending(Pending::new(why))),
                false => Err(Error::Busy(why)),
            };
        }
        if let Some(d) = declaration.take_if(|_| self.has_add_gate()) {
            // New ranges (a network a CNI config declares, or redefines): what the gate checks
            // against the ranges (the live pods' addresses, to quarantine) is checked against
            // these before anything is handed out of them. Declared now; the ADD waits.
            let name = &req.key.network;
            self.declare_now(st, name, d)?;
            tracing::info!(network = %name, "network declared by CNI config; its ADDs wait until the live pods' addresses are checked against its ranges");
            self.ranges_moved();
            let why = self.gate_closed().unwrap_or_else(|| {
                format!("network {name:?} was just declared: checking the live pods' addresses against its ranges")
            });
            return match may_wait {
                true => Ok(Step::Pending(Pending::new(why))),
                false => Err(Error::Busy(why)),
            };
        }
        // Most nodes hold no reservation: then no key is built on the ADD path. A quarantine
        // is its pod's by UID: a namesake (the pod made again while the old one's sandbox
        // still runs) does not get the address the old one uses.
        let reservation = (!st.reservations.is_empty())
            .then(|| sticky::identity(&req.key.network, &req.pod))
            .flatten()
            .and_then(|k| st.reservations.get(&k))
            .filter(|r| r.expires_at_ms > now)
            .filter(|r| r.pod_uid.as_deref().is_none_or(|u| u == req.pod.uid))
            .cloned();
        let State {
            networks,
            attachments,
            reservations,
            ..
        } = st;
        let net = match &mut declaration {
            Some((net, _, _)) => net,
            None => networks.get_mut(&req.key.network).ok_or_else(|| {
                Error::NotFound(format!("network {:?} is unknown", req.key.network))
            })?,
        };
        if let Some(c) = &req.pools {
            self.check_choice(&req.key.network, c, &net.def.cluster_pools)?;
        }
        let picks = match pick_addresses(
            net,
            attachments,
            reservations,
            &req.key,
            &req.requested,
            reservation.as_ref(),
            req.pools.as_ref(),
            req.fixed,
            now,
            may_wait,
        )? {
            Step::Done(p) => p,
            Step::Wait(ms) => return Ok(Step::Wait(ms)),
            Step::Pending(p) => {
                if let Some(d) = declaration {
                    // Declared now, so that the claims its sources started land in it.
                    self.declare_now(st, &req.key.network, d)?;
                }
                return Ok(Step::Pending(p));
            }
        };
        let plan = plan_attachment(net, req, picks, reservation.as_ref(), now);
        let reply = net.reply_for(&plan.record.addresses);
        let attachment_changes = plan.changes(net);
        let mut changes = declaration
            .as_ref()
            .map(|(_, c, _)| c.clone())
            .unwrap_or_default();
        changes.extend(attachment_changes);
        let name = req.key.network.clone();
        let declared_now = declaration.is_some();
        let seq = self.commit(st, &changes, |st| {
            if let Some((net, _, displaced)) = declaration {
                tracing::info!(network = %name, ranges = %net.def.describe_ranges(), "network declared by CNI config");
                for gone in &displaced {
                    st.networks.remove(gone);
                }
                st.networks.insert(name.clone(), net);
            }
            let net = st
                .networks
                .get_mut(&name)
                .ok_or_else(|| format!("network {name:?} is gone"))?;
            for p in &plan.picks {
                net.pools[p.set].take(p)?;
            }
            if let Some((rkey, leftover)) = &plan.used {
                for (set, ip) in leftover {
                    net.pools[*set].pool.unreserve(*ip, now);
                }
                st.reservations.remove(rkey);
                tracing::info!(network = %name, pod = %format!("{}/{}", rkey.namespace, rkey.name), container = %plan.record.key.container_id, address = %super::join(&plan.record.addresses), "sticky pod back: its reservation is used");
            }
            st.attachments.insert(&plan.record);
            Ok(())
        })?;
        if declared_now {
            self.pool_network_declared();
        }
        let reason = if plan.used.is_some() {
            "sticky pod back"
        } else {
            "CNI ADD"
        };
        self.emit(|| Event::of_record(EventKind::Add, now, &plan.record, reason));
        Ok(Step::Done((reply, seq)))
    }
}

impl Ipam {
    /// Whether `network` takes its addresses from cluster pools (a pod's choice of pools
    /// counts there only).
    pub fn takes_cluster_pools(
        &self,
        network: &str,
        ipam: Option<&crate::config::IpamSection>,
    ) -> bool {
        ipam.is_some_and(|s| s.cluster_pool.is_some())
            || self
                .shared
                .config
                .networks
                .iter()
                .any(|n| n.name == network && !n.cluster_pool_list().is_empty())
    }

    /// Refuses a choice of pools that names one its network does not list (in the config
    /// file, else as a CNI config declared it: `declared`).
    fn check_choice(
        &self,
        network: &str,
        choice: &PoolChoice,
        declared: &[String],
    ) -> Result<(), Error> {
        let listed = self
            .shared
            .config
            .networks
            .iter()
            .find(|n| n.name == network)
            .map(|n| n.cluster_pool_list())
            .unwrap_or_else(|| declared.to_vec());
        match choice.pools.iter().find(|p| !listed.contains(p)) {
            None => Ok(()),
            Some(p) if listed.is_empty() => Err(Error::InvalidConfig(format!(
                "{} names cluster pool {p:?}, but network {network:?} takes no addresses from cluster pools",
                choice.from
            ))),
            Some(p) => Err(Error::InvalidConfig(format!(
                "{} names cluster pool {p:?}, which network {network:?} does not list (its cluster_pools: {})",
                choice.from,
                listed.join(", ")
            ))),
        }
    }
}

impl Plan {
    /// The change set: the attachment, what each pick changes, and the end of a used
    /// reservation.
    fn changes(&self, net: &Network) -> Vec<Change> {
        let network = &self.record.key.network;
        let mut changes = vec![Change::PutAttachment(self.record.clone())];
        for p in &self.picks {
            net.pools[p.set].store_changes(network, p, &mut changes);
        }
        if let Some((rkey, leftover)) = &self.used {
            changes.push(Change::DeleteReservation(rkey.clone()));
            for (_, ip) in leftover {
                changes.push(Change::PutIdle {
                    network: network.clone(),
                    ip: *ip,
                    released_at: Since::At(self.record.created_at_ms).to_stored(),
                });
            }
        }
        changes
    }
}

fn plan_attachment(
    net: &Network,
    req: &AddRequest,
    picks: Vec<Pick>,
    reservation: Option<&Reservation>,
    now: Millis,
) -> Plan {
    let addresses: Vec<IpAddr> = picks.iter().map(|p| p.ip).collect();
    // A used reservation ends; its addresses the pod did not get back go idle, cooling.
    let used = reservation
        .filter(|_| picks.iter().any(|p| p.from == From::Reserved))
        .map(|r| {
            let leftover = r
                .addresses
                .iter()
                .filter(|ip| !addresses.contains(ip))
                .filter_map(|ip| net.set_of(*ip).map(|set| (set, *ip)))
                .collect();
            (r.key.clone(), leftover)
        });
    Plan {
        record: AttachmentRecord {
            key: req.key.clone(),
            pod: req.pod.clone(),
            netns: req.netns.clone(),
            addresses,
            created_at_ms: now,
            k8s: req.k8s.clone(),
        },
        picks,
        used,
    }
}
