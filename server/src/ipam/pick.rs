//! Which addresses an ADD gets, decided without taking anything: one per range set of the
//! network, or, for the sets of a network's cluster pools, one per family from the first pool
//! (of the pod's choice, else of the network's list) that can serve it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::attachments::Attachments;
use super::range_set::{ClaimError, Pick, PickError};
use super::state::Network;
use super::{Claiming, Pending, Step};
use crate::error::{Error, Refusal};
use crate::model::{AttachmentKey, Millis, PoolChoice, Reservation, ReservationKey};

/// Picks the addresses of `key`: a requested address where one is given, else the
/// reservation's, else one from the pool; in a group of pools' sets, the first that serves.
/// `fixed`: the requested addresses are fixed for the pod (a cluster pin it holds). Takes
/// nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn pick_addresses(
    net: &mut Network,
    attachments: &Attachments,
    reservations: &BTreeMap<ReservationKey, Reservation>,
    key: &AttachmentKey,
    requested: &[IpAddr],
    reservation: Option<&Reservation>,
    choice: Option<&PoolChoice>,
    fixed: bool,
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
    let groups = groups(net, choice);
    if let Some(c) = choice {
        if groups.is_empty() {
            let why = format!(
                "network {:?} has no ranges of cluster pool(s) {} yet ({}): they come when this node reads them",
                key.network,
                c.pools.join(", "),
                c.from
            );
            return match may_wait {
                true => Ok(Step::Pending(Pending::new(why))),
                false => Err(Error::Busy(why)),
            };
        }
    }
    // A requested address outside the chosen pools, or two for one family of pools.
    for (set, ip) in wanted.iter().enumerate() {
        let Some(ip) = ip else { continue };
        let group = groups.iter().find(|g| g.contains(&set));
        let pool = net.pools[set]
            .source
            .blocks()
            .and_then(|b| b.pool_name())
            .unwrap_or_default();
        match (group, choice) {
            (None, Some(c)) => {
                return Err(Error::InvalidConfig(format!(
                    "requested address {ip} is in cluster pool {pool:?}, which is not among the pools chosen for the pod ({}: {})",
                    c.from,
                    c.pools.join(", ")
                )))
            }
            (Some(g), _) if g.iter().filter(|s| wanted[**s].is_some()).count() > 1 => {
                return Err(Error::InvalidConfig(format!(
                    "requested addresses {} fall in one family of network {:?}'s cluster pools; ask for one address per family",
                    g.iter()
                        .filter_map(|s| wanted[*s].map(|ip| ip.to_string()))
                        .collect::<Vec<_>>()
                        .join(" and "),
                    key.network
                )))
            }
            _ => {}
        }
    }
    let mut picks = Vec::with_capacity(groups.len());
    for sets in groups {
        if let Some((set, ip)) = sets.iter().find_map(|s| Some((*s, wanted[*s]?))) {
            if let Some(p) = reservation.and_then(|r| {
                r.addresses
                    .contains(&ip)
                    .then(|| net.pools[set].pick_reserved(set, ip, fixed))
                    .flatten()
            }) {
                picks.push(p);
                continue;
            }
            if let Some(why) = net.pools[set].source.blocks().and_then(|b| b.refused()) {
                return Err(Error::InvalidConfig(format!(
                    "requested address {ip}: {why}"
                )));
            }
            let p = net.pools[set]
                .pick_requested(set, ip, fixed)
                .map_err(|e| claim_error(e, &key.network, ip, attachments, reservations))?;
            picks.push(p);
            continue;
        }
        // The pod's reservation, in any set of the group.
        let kept = reservation.and_then(|r| {
            sets.iter().find_map(|s| {
                r.addresses
                    .iter()
                    .find_map(|ip| net.pools[*s].pick_reserved(*s, *ip, false))
            })
        });
        if let Some(p) = kept {
            picks.push(p);
            continue;
        }
        match pick_in_group(net, &sets, key, choice, now, may_wait)? {
            Step::Done(p) => picks.push(p),
            Step::Wait(ms) => return Ok(Step::Wait(ms)),
            Step::Pending(p) => return Ok(Step::Pending(p)),
        }
    }
    Ok(Step::Done(picks))
}

/// The range sets an ADD takes one address from each of, each a list of sets tried in
/// order: a set of no cluster pool alone; the sets of a network's cluster pools by family, in
/// the order of `choice` (only those) or of the network.
pub(super) fn groups(net: &Network, choice: Option<&PoolChoice>) -> Vec<Vec<usize>> {
    // Each group's sets, with their rank in the choice.
    let mut groups: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut of_family = Vec::new();
    for set in 0..net.current {
        let p = &net.pools[set];
        let Some(pool) = p.source.blocks().and_then(|b| b.pool_name()) else {
            groups.push(vec![(0, set)]);
            continue;
        };
        let rank = match choice.map(|c| c.pools.iter().position(|x| x == pool)) {
            Some(Some(i)) => i,
            Some(None) => continue,
            None => 0,
        };
        let g = match of_family.iter().find(|(f, _)| *f == p.family) {
            Some((_, g)) => *g,
            None => {
                groups.push(Vec::new());
                of_family.push((p.family, groups.len() - 1));
                groups.len() - 1
            }
        };
        groups[g].push((rank, set));
    }
    groups
        .into_iter()
        .map(|mut g| {
            // Stable: the network's order among the sets of one pool.
            g.sort_by_key(|(rank, _)| *rank);
            g.into_iter().map(|(_, set)| set).collect()
        })
        .collect()
}

/// One address from the first set of `sets` that serves: a set whose pool this node may not
/// use is passed over, as is one exhausted or unavailable now; a set whose block is on its way
/// is waited for. Fails with every set's reason when none serves.
fn pick_in_group(
    net: &mut Network,
    sets: &[usize],
    key: &AttachmentKey,
    choice: Option<&PoolChoice>,
    now: Millis,
    may_wait: bool,
) -> Result<Step<Pick>, Error> {
    let mut refused = Vec::new();
    let mut failed: Vec<Error> = Vec::new();
    for &set in sets {
        if let Some(why) = net.pools[set].source.blocks().and_then(|b| b.refused()) {
            refused.push(why);
            continue;
        }
        match net.pools[set].pick(set, now, may_wait) {
            Ok(Step::Done(p)) => return Ok(Step::Done(p)),
            Ok(Step::Wait(ms)) => return Ok(Step::Wait(ms)),
            Ok(Step::Pending(mut pending)) => {
                let p = &mut net.pools[set];
                if let Some(b) = p.source.blocks_mut() {
                    b.demand();
                }
                pending
                    .claims
                    .extend(
                        p.source
                            .blocks_mut()
                            .and_then(|b| b.start_claim())
                            .map(|claim| Claiming {
                                network: key.network.clone(),
                                set: p.id.clone(),
                                claim,
                            }),
                    );
                return Ok(Step::Pending(pending));
            }
            Err(e) => failed.push(pick_error(net, set, &key.network, e, now)),
        }
    }
    if failed.is_empty() {
        // Every pool of the group refuses this node.
        let from = choice.map(|c| format!(" ({})", c.from)).unwrap_or_default();
        return Err(Error::Refused {
            refusal: Refusal::NoPoolForNode,
            message: format!(
                "this node may use none of the cluster pools it could take an address from{from}: {}",
                refused.join("; ")
            ),
        });
    }
    let mut first = failed.remove(0);
    if !failed.is_empty() || !refused.is_empty() {
        let rest: Vec<String> = failed
            .iter()
            .map(|e| e.to_string())
            .chain(refused)
            .collect();
        let more = format!("; the network's next pools: {}", rest.join("; "));
        match &mut first {
            Error::Busy(m) | Error::Exhausted(m) | Error::Refused { message: m, .. } => {
                m.push_str(&more)
            }
            _ => {}
        }
    }
    Err(first)
}

/// The error for a set that has no address to give, noted as the set's last error.
fn pick_error(net: &mut Network, set: usize, network: &str, e: PickError, now: Millis) -> Error {
    let p = &mut net.pools[set];
    match e {
        PickError::Unavailable(refusal, why) => {
            let msg = format!(
                "{} has no address now: {why}; {} idle, {} reserved for sticky pods",
                p.describe(network),
                p.pool.idle(),
                p.pool.reserved()
            );
            p.last_error = Some((now, msg.clone()));
            match refusal {
                Some(refusal) => Error::Refused {
                    refusal,
                    message: msg,
                },
                None => Error::Busy(msg),
            }
        }
        PickError::Pool(e) => {
            let mut msg = format!(
                "{} is exhausted: {e}; {} idle, {} cooling, {} reserved for sticky pods",
                p.describe(network),
                p.pool.idle(),
                p.pool.cooling(now),
                p.pool.reserved()
            );
            if let Some(detail) = p.source.blocks().and_then(|b| b.detail()) {
                msg.push_str("; ");
                msg.push_str(&detail);
            }
            p.last_error = Some((now, msg.clone()));
            Error::Refused {
                refusal: Refusal::PoolExhausted,
                message: msg,
            }
        }
    }
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
        ClaimError::Unavailable(refusal, why) => {
            let message = format!(
                "requested address {ip} of network {network:?} cannot be handed out now: {why}"
            );
            match refusal {
                Some(refusal) => Error::Refused { refusal, message },
                None => Error::Busy(message),
            }
        }
        ClaimError::Pool(e) => Error::Exhausted(format!(
            "requested address {ip} of network {network:?}: {e}"
        )),
    }
}
