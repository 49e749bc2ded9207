//! ADD: one address per range set of the network, all or nothing, idempotent per attachment
//! key (the network a CNI config declares is planned in [`super::declare`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::attachments::Attachments;
use super::events::{Event, EventKind};
use super::range_set::{ClaimError, From, Pick, PickError};
use super::state::{Network, State};
use super::{sticky, AddReply, AddRequest, Claiming, Ipam, Pending, Step};
use crate::error::Error;
use crate::model::{
    AttachmentKey, AttachmentRecord, Millis, NetworkDef, Reservation, ReservationKey,
};
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
            if let Err(Error::Busy(_)) = &tried {
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
        let picks = match pick_addresses(
            net,
            attachments,
            reservations,
            &req.key,
            &req.requested,
            reservation.as_ref(),
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
        let reason = if plan.used.is_some() {
            "sticky pod back"
        } else {
            "CNI ADD"
        };
        self.emit(|| Event::of_record(EventKind::Add, now, &plan.record, reason));
        Ok(Step::Done((reply, seq)))
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

/// Picks one address per range set of `net` for `key`: a requested address where one is
/// given, else the reservation's, else one from the pool. Takes nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn pick_addresses(
    net: &mut Network,
    attachments: &Attachments,
    reservations: &BTreeMap<ReservationKey, Reservation>,
    key: &AttachmentKey,
    requested: &[IpAddr],
    reservation: Option<&Reservation>,
    now: Millis,
    may_wait: bool,
) -> Result<Step<Vec<Pick>>, Error> {
    if let Some(why) = net.no_ranges() {
        return match may_wait {
            true => Ok(Step::Pending(Pending::new(why))),
            false => Err(Error::Busy(why)),
        };
    }
    let wanted = requested_per_set(net, &key.network, requested)?;
    let mut picks = Vec::with_capacity(net.current);
    for (set, want) in wanted.into_iter().enumerate() {
        // The pod's reservation, unless the request names another address.
        let kept = reservation.and_then(|r| {
            r.addresses
                .iter()
                .filter(|ip| want.is_none_or(|w| w == **ip))
                .find_map(|ip| net.pools[set].pick_reserved(set, *ip))
        });
        if let Some(p) = kept {
            picks.push(p);
            continue;
        }
        if let Some(ip) = want {
            let p = net.pools[set]
                .pick_requested(set, ip)
                .map_err(|e| claim_error(e, &key.network, ip, attachments, reservations))?;
            picks.push(p);
            continue;
        }
        match net.pools[set].pick(set, now, may_wait) {
            Ok(Step::Done(p)) => picks.push(p),
            Ok(Step::Wait(ms)) => return Ok(Step::Wait(ms)),
            Ok(Step::Pending(mut pending)) => {
                let p = &mut net.pools[set];
                pending
                    .claims
                    .extend(p.source.start_claim().map(|claim| Claiming {
                        network: key.network.clone(),
                        set: p.id.clone(),
                        claim,
                    }));
                return Ok(Step::Pending(pending));
            }
            Err(PickError::Unavailable(why)) => {
                let p = &mut net.pools[set];
                let msg = format!(
                    "{} has no address now: {why}; {} idle, {} reserved for sticky pods",
                    p.describe(&key.network),
                    p.pool.idle(),
                    p.pool.reserved()
                );
                p.last_error = Some((now, msg.clone()));
                return Err(Error::Busy(msg));
            }
            Err(PickError::Pool(e)) => {
                let p = &mut net.pools[set];
                let mut msg = format!(
                    "{} is exhausted: {e}; {} idle, {} cooling, {} reserved for sticky pods",
                    p.describe(&key.network),
                    p.pool.idle(),
                    p.pool.cooling(now),
                    p.pool.reserved()
                );
                if let Some(detail) = p.source.detail() {
                    msg.push_str("; ");
                    msg.push_str(&detail);
                }
                p.last_error = Some((now, msg.clone()));
                return Err(Error::Exhausted(msg));
            }
        }
    }
    Ok(Step::Done(picks))
}

/// The requested addresses, one slot per range set.
fn requested_per_set(
    net: &Network,
    network: &str,
    requested: &[IpAddr],
) -> Result<Vec<Option<IpAddr>>, Error> {
    let mut wanted: Vec<Option<IpAddr>> = vec![None; net.current];
    for ip in requested {
        let set = net.pools[..net.current]
            .iter()
            .position(|p| p.source.covers(*ip));
        let set = set.ok_or_else(|| {
            Error::InvalidConfig(format!(
                "requested address {ip} is outside every range of network {network:?} ({})",
                net.def.describe_ranges()
            ))
        })?;
        if let Some(other) = wanted[set].replace(*ip) {
            return Err(Error::InvalidConfig(format!(
                "requested addresses {other} and {ip} fall in the same range set of network {network:?}; ask for one address per range set"
            )));
        }
    }
    Ok(wanted)
}

/// The error for a requested address that cannot be had, naming its holder.
fn claim_error(
    e: ClaimError,
    network: &str,
    ip: IpAddr,
    attachments: &Attachments,
    reservations: &BTreeMap<ReservationKey, Reservation>,
) -> Error {
    match e {
        ClaimError::Held => {
            // The pools do not record holders: find it (a scan, on this error path only).
            let holder = attachments.holder_of(network, ip);
            let who = holder
                .map(|r| format!(" by attachment {}", r.key()))
                .unwrap_or_default();
            let pod = holder
                .filter(|r| !r.pod_name().is_empty())
                .map(|r| format!(" (pod {}/{})", r.pod_namespace(), r.pod_name()))
                .unwrap_or_default();
            Error::InUse(format!("requested address {ip} is already held{who}{pod}"))
        }
        ClaimError::Reserved => {
            let whose = reservations
                .values()
                .find(|r| r.key.network == network && r.addresses.contains(&ip))
                .map(|r| {
                    format!(
                        " for pod {}/{} until {} (engine ms)",
                        r.key.namespace, r.key.name, r.expires_at_ms
                    )
                })
                .unwrap_or_default();
            Error::InUse(format!(
                "requested address {ip} is reserved{whose}; cancel the reservation to use it elsewhere"
            ))
        }
        ClaimError::NotHandedOut(why) => Error::InvalidConfig(format!(
            "requested address {ip}: {why} (network, broadcast and gateway addresses are never handed out)"
        )),
        ClaimError::Unavailable(why) => Error::Busy(format!(
            "requested address {ip} of network {network:?} cannot be handed out now: {why}"
        )),
        ClaimError::Pool(e) => Error::Exhausted(format!(
            "requested address {ip} of network {network:?}: {e}"
        )),
    }
}
