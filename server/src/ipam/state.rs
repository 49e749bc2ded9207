//! The state behind the engine's lock, its networks, and the one path every change takes
//! (module docs of [`crate::ipam`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::net::IpAddr;

use super::attachments::Attachments;
use super::diverged::Diverged;
use super::range_set::RangeSetPool;
use super::{AddReply, Ipam, Lease, ALL_NETWORKS};
use crate::error::Error;
use crate::model::{Millis, NetworkDef, Reservation, ReservationKey};
use crate::source::Sources;
use crate::store::{Change, Seq, StoreError};

#[derive(Default)]
pub(super) struct State {
    pub(super) networks: BTreeMap<String, Network>,
    pub(super) attachments: Attachments,
    pub(super) reservations: BTreeMap<ReservationKey, Reservation>,
    /// Networks that take no new ADDs ([`ALL_NETWORKS`]: every one).
    pub(super) drained: BTreeSet<String>,
    /// Networks whose host-local allocations were taken over (`service::host_local`).
    pub(super) taken_over: BTreeSet<String>,
    /// Set when the store failed: memory may hold changes that were not made durable, and no
    /// change is served until the state is rebuilt from the reopened store.
    pub(super) failed: Option<Failure>,
}

#[derive(Clone, Debug)]
pub(super) struct Failure {
    pub(super) since: Millis,
    pub(super) why: String,
}

pub(super) struct Network {
    pub(super) def: NetworkDef,
    /// One per range set: the current ones first (`..current`), in order, then the retiring
    /// ones (`NetworkDef::retiring`).
    pub(super) pools: Vec<RangeSetPool>,
    /// How many of `pools` are current: they hand out addresses; the rest only take back.
    pub(super) current: usize,
    /// Why the ranges are not known yet, from whoever brings them ("node n1 has no podCIDRs
    /// yet"); ADD and STATUS say it while `current` is 0.
    pub(super) awaiting: Option<String>,
}

impl Network {
    pub(super) fn new(def: NetworkDef, sources: &Sources, now: Millis) -> Result<Network, Error> {
        let (current, retiring) = def.all_ranges()?;
        let n = current.len();
        let pools = current
            .into_iter()
            .map(|set| (set, false))
            .chain(retiring.into_iter().map(|set| (set, true)))
            .map(|(set, retiring)| {
                let family = set[0].family();
                let mut p = RangeSetPool::new(family, sources.make(&def, set), &def.tuning, now);
                p.retiring = retiring;
                p
            })
            .collect();
        Ok(Network {
            def,
            pools,
            current: n,
            awaiting: None,
        })
    }

    /// The pool (range-set index) that holds `ip`: a current one if one covers it, else a
    /// retiring one.
    pub(super) fn set_of(&self, ip: IpAddr) -> Option<usize> {
        self.pools.iter().position(|p| p.source.contains(ip))
    }

    /// The current set of one subnet that covers `ip`: where a fixed address outside the
    /// source's blocks is hosted.
    pub(super) fn hosting_set(&self, ip: IpAddr) -> Option<usize> {
        self.pools[..self.current]
            .iter()
            .position(|p| p.source.blocks().is_some_and(|b| b.one_subnet()) && p.source.covers(ip))
    }

    /// Why an ADD cannot be served for want of ranges, when the network has none yet.
    pub(super) fn no_ranges(&self) -> Option<String> {
        (self.current == 0).then(|| {
            let why = self.awaiting.as_deref().unwrap_or("they come at runtime");
            format!("network {:?} has no ranges yet: {why}", self.def.name)
        })
    }

    /// True when the pool of set `set` is current (it hands out addresses).
    pub(super) fn is_current(&self, set: usize) -> bool {
        set < self.current
    }

    /// Puts `ip`, held by `holder` in the store, back into use (rebuilding the pools). `fixed`:
    /// the address is fixed for the holder's pod (see [`crate::source::BlockSource::occupy_fixed`]).
    pub(super) fn restore_in_use(
        &mut self,
        ip: IpAddr,
        holder: &dyn Display,
        fixed: bool,
    ) -> Result<(), Diverged> {
        let p = self.restore_slot(ip, "attachment", holder, fixed)?;
        p.pool
            .restore_in_use(ip, ())
            .map_err(|e| Diverged(format!("attachment {holder}: {e}")))
    }

    /// Puts `ip`, reserved by `holder` in the store, back into reserved.
    pub(super) fn restore_reserved(
        &mut self,
        ip: IpAddr,
        holder: &dyn Display,
    ) -> Result<(), Diverged> {
        let p = self.restore_slot(ip, "reservation", holder, false)?;
        p.pool
            .restore_reserved(ip)
            .map_err(|e| Diverged(format!("reservation {holder}: {e}")))
    }

    /// The pool that holds `ip`, with `ip` taken from its source.
    fn restore_slot(
        &mut self,
        ip: IpAddr,
        what: &str,
        holder: &dyn Display,
        fixed: bool,
    ) -> Result<&mut RangeSetPool, Diverged> {
        let set = self
            .set_of(ip)
            .or_else(|| self.hosting_set(ip).filter(|_| fixed));
        let set = set.ok_or_else(|| {
            Diverged(format!(
                "{what} {holder} holds {ip}, which is outside the ranges of network {:?} ({})",
                self.def.name,
                self.def.describe_ranges()
            ))
        })?;
        let p = &mut self.pools[set];
        let occupied = match fixed {
            true => match p.source.blocks_mut() {
                Some(b) => b.occupy_fixed(ip),
                None => p.source.occupy(ip),
            },
            false => p.source.occupy(ip),
        };
        occupied
            .map_err(|e| Diverged(format!("{what} {holder}: {e} (held twice in the store)")))?;
        Ok(p)
    }

    /// The pool whose id is `id`.
    pub(super) fn pool_by_id(&mut self, id: &str) -> Option<&mut RangeSetPool> {
        self.pools.iter_mut().find(|p| p.id == id)
    }

    /// The reply for an attachment holding `addresses`.
    pub(super) fn reply_for(&self, addresses: &[IpAddr]) -> AddReply {
        let leases = addresses
            .iter()
            .map(
                |ip| match self.set_of(*ip).or_else(|| self.hosting_set(*ip)) {
                    Some(set) => self.pools[set].lease(*ip),
                    None => Lease {
                        ip: *ip,
                        prefix_len: if ip.is_ipv4() { 32 } else { 128 },
                        gateway: None,
                    },
                },
            )
            .collect();
        AddReply {
            leases,
            routes: self.def.routes.clone(),
        }
    }
}

impl State {
    pub(super) fn is_drained(&self, network: &str) -> bool {
        self.drained.contains(ALL_NETWORKS) || self.drained.contains(network)
    }

    /// The pool of range set `set` of `network`.
    pub(super) fn pool(&mut self, network: &str, set: usize) -> Option<&mut RangeSetPool> {
        self.networks.get_mut(network)?.pools.get_mut(set)
    }
}

impl Ipam {
    /// Refuses every change while the store has failed (module docs of [`crate::ipam`]).
    pub(super) fn serving(&self, st: &State) -> Result<(), Error> {
        match &st.failed {
            None => Ok(()),
            // Retryable (UNAVAILABLE, CNI 11): `why` already says what failed and what follows.
            Some(f) => Err(Error::Busy(format!(
                "{} ({} s ago)",
                f.why,
                self.now().saturating_sub(f.since) / 1000
            ))),
        }
    }

    /// The one path of every change: `changes` go to the store as one change set, and once it
    /// has taken them, `apply` makes the same changes in memory. A store that refuses leaves
    /// memory as it was. Returns the change set's number, for [`Ipam::wait_durable`].
    ///
    /// `apply` must not fail: what it does was decided before the write. If it does anyway,
    /// memory and store may differ, so the engine stops serving changes and rebuilds its state
    /// from the store ([`Ipam::recover_store`]).
    pub(super) fn commit(
        &self,
        st: &mut State,
        changes: &[Change],
        apply: impl FnOnce(&mut State) -> Result<(), Diverged>,
    ) -> Result<Seq, Error> {
        self.serving(st)?;
        let seq = match self.shared.store.append(changes) {
            Ok(seq) => seq,
            Err(e) => {
                if matches!(e, StoreError::Failed { .. }) {
                    self.mark_failed(st, e.to_string());
                }
                return Err(e.into());
            }
        };
        if let Err(e) = apply(st) {
            tracing::error!(error = %e, "memory could not follow a change the store took; rebuilding the state from the store");
            self.mark_failed(st, format!("internal: {e}"));
        }
        Ok(seq)
    }

    /// Waits until change set `seq` is durable (a flush shared with concurrent requests).
    pub(super) async fn wait_durable(&self, seq: Seq) -> Result<(), Error> {
        match self.shared.store.durable(seq).await {
            Ok(()) => Ok(()),
            Err(e) => {
                self.store_failed(e.to_string());
                Err(e.into())
            }
        }
    }

    /// Waits until everything the store has taken so far is durable.
    pub async fn flush(&self) -> Result<(), Error> {
        let seq = self.shared.store.last_appended();
        self.wait_durable(seq).await
    }

    /// Takes note of a failure the store met on its own (in its background work) since the
    /// last call: the engine stops serving changes, and health and STATUS say why.
    pub(super) fn notice_store_failure(&self, st: &mut State) {
        if st.failed.is_none() {
            if let Some(why) = self.shared.store.failure() {
                self.mark_failed(st, why);
            }
        }
    }

    /// The store failed: stop serving changes until it is reopened.
    pub(super) fn store_failed(&self, why: String) {
        let mut st = self.lock();
        self.mark_failed(&mut st, why);
    }

    fn mark_failed(&self, st: &mut State, why: String) {
        if st.failed.is_some() {
            return;
        }
        tracing::error!(error = %why, "the store failed: no ADD, DEL or other change is served until it is reopened (retried in the background)");
        st.failed = Some(Failure {
            since: self.now(),
            why: why.clone(),
        });
        self.shared
            .health
            .send_modify(|h| h.store_failure = Some(why));
        self.shared.changed.notify_one();
    }

    /// The store's failure, if it has failed: how long ago and why.
    pub fn store_failure(&self) -> Option<(std::time::Duration, String)> {
        let now = self.now();
        let mut st = self.lock();
        self.notice_store_failure(&mut st);
        st.failed.as_ref().map(|f| {
            (
                std::time::Duration::from_millis(now.saturating_sub(f.since)),
                f.why.clone(),
            )
        })
    }
}
