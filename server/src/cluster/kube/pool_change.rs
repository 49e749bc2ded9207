//! Pools on the apiserver changed while they run (`ipoolctl cluster pool add-cidr|remove-cidr|
//! disable|enable`, `ipoolctl cluster reserve|unreserve`): disabled, enabled, an address
//! reserved or its reservation ended in one write on the resourceVersion read.
//!
//! A pool's CIDRs change in two writes, as a creation and a deletion are made: the CIDR is
//! first marked (`cidrsAdding`, `cidrsRemoving`: no block is claimed in it, and a claim checks
//! the pool it reads after its create), then checked (an added CIDR against every pool, as a
//! creation's, and against blocks standing in it; a removed one against the pool's blocks in
//! it), then the mark is taken away, with the CIDR in or out. Each write is on the
//! resourceVersion read: a claim whose create came before the mark is seen by the check; one
//! that came after reads the mark and gives its block back.

use kube::api::DynamicObject;

use super::objects::{parse_pool, with_spec};
use super::pools::overlap;
use super::{api_code, KubeStore};
use crate::cluster::datastore::BlockStore;
use crate::cluster::ippool::{PoolChange, PoolSpec};
use crate::cluster::vocab::{ClusterError, PoolPhase};

/// Reads of a pool a change makes before it gives up on a pool that keeps changing.
const CHANGE_ATTEMPTS: usize = 5;

impl KubeStore {
    /// Changes pool `name` (Ready only): disabled or enabled with one write on the
    /// resourceVersion read; a CIDR added or removed in the module's two steps.
    pub(super) async fn change(
        &self,
        name: &str,
        change: &PoolChange,
    ) -> Result<PoolSpec, ClusterError> {
        for _ in 0..CHANGE_ATTEMPTS {
            self.token().await;
            let Some(obj) = self.pools.get_opt(name).await? else {
                return Err(ClusterError::NotFound(format!("no pool {name:?}")));
            };
            let (spec, phase) = parse_pool(&obj).map_err(|why| ClusterError::Malformed {
                what: "pool",
                key: format!("ippools/{name}"),
                why: why.to_string(),
            })?;
            if phase != PoolPhase::Ready {
                return Err(ClusterError::Refused(format!(
                    "pool {name:?} is {} (being created or deleted): it changes only while Ready",
                    phase.as_str()
                )));
            }
            let done = match change {
                PoolChange::Disable
                | PoolChange::Enable
                | PoolChange::Reserve(_)
                | PoolChange::Unreserve(_)
                | PoolChange::SetNodeSelector(_)
                | PoolChange::SetBlockSize { .. } => {
                    let next = spec.changed(change).map_err(ClusterError::from)?;
                    self.write_spec(&obj, &next).await?.map(|_| next)
                }
                PoolChange::AddCidr(c) => self.add_cidr(&obj, &spec, c).await?,
                PoolChange::RemoveCidr(c) => self.remove_cidr(&obj, &spec, c).await?,
            };
            if let Some(next) = done {
                return Ok(next);
            }
            // Written by someone else since it was read: read again.
        }
        Err(ClusterError::Refused(format!(
            "pool {name:?}: it kept changing during {CHANGE_ATTEMPTS} attempts; try again"
        )))
    }

    /// Writes pool object `obj` with `spec`, on the resourceVersion it was read at: None when it
    /// changed since (409).
    async fn write_spec(
        &self,
        obj: &DynamicObject,
        spec: &PoolSpec,
    ) -> Result<Option<DynamicObject>, ClusterError> {
        self.token().await;
        match self
            .pools
            .replace(&spec.name, &self.post(), &with_spec(obj, spec))
            .await
        {
            Ok(w) => Ok(Some(w)),
            Err(e) if api_code(&e) == Some(409) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Marks `cidr` in pool object `obj` (`spec` as read) with `mark` unless it is marked
    /// already: the object and spec as marked; None when the pool changed since it was read.
    async fn mark(
        &self,
        obj: &DynamicObject,
        spec: &PoolSpec,
        marked: PoolSpec,
    ) -> Result<Option<(DynamicObject, PoolSpec)>, ClusterError> {
        if marked == *spec {
            return Ok(Some((obj.clone(), marked)));
        }
        Ok(self.write_spec(obj, &marked).await?.map(|w| (w, marked)))
    }

    /// Takes the mark of a CIDR change away: writes `next` on the marked object; `refused`,
    /// what the check found (then `next` is the pool as before the change). The pool as it is,
    /// or why the change stopped and what it left.
    async fn unmark(
        &self,
        marked: &DynamicObject,
        next: PoolSpec,
        refused: Option<ClusterError>,
        cidr: &ipnet::IpNet,
    ) -> Result<PoolSpec, ClusterError> {
        let name = next.name.clone();
        let left = |e: ClusterError| {
            ClusterError::Undone {
            error: Box::new(e),
            note: format!(
                "pool {name:?} still marks CIDR {cidr} as changing (no block is claimed in it): run the same `ipoolctl cluster pool add-cidr|remove-cidr` again to finish"
            ),
        }
        };
        match (self.write_spec(marked, &next).await, refused) {
            (Ok(Some(_)), None) => Ok(next),
            (Ok(Some(_)), Some(ClusterError::Refused(why))) => Err(ClusterError::Refused(format!(
                "{why}; pool {name:?} is as it was"
            ))),
            (Ok(Some(_)), Some(e)) => Err(ClusterError::Undone {
                error: Box::new(e),
                note: format!("pool {name:?} is as it was"),
            }),
            (Ok(None), _) => Err(left(ClusterError::Refused(format!(
                "pool {name:?} changed while CIDR {cidr} was being checked"
            )))),
            (Err(e), _) => Err(left(e)),
        }
    }

    /// Adds `cidr` to the pool `obj` (`spec`): marked, checked against every pool and the
    /// blocks standing in it, then made a CIDR of the pool or withdrawn. None: the pool changed
    /// before the mark.
    async fn add_cidr(
        &self,
        obj: &DynamicObject,
        spec: &PoolSpec,
        cidr: &ipnet::IpNet,
    ) -> Result<Option<PoolSpec>, ClusterError> {
        let name = &spec.name;
        if spec.removing.contains(cidr) {
            return Err(ClusterError::Refused(format!(
                "pool {name:?}: CIDR {cidr} is being removed (`ipoolctl cluster pool remove-cidr {name} {cidr}` again finishes that)"
            )));
        }
        let marked = match spec.adding.contains(cidr) {
            true => spec.clone(),
            false => {
                let mut m = spec
                    .changed(&PoolChange::AddCidr(*cidr))
                    .map_err(ClusterError::from)?;
                m.adding.push(*cidr);
                m
            }
        };
        let Some((marked_obj, marked)) = self.mark(obj, spec, marked).await? else {
            return Ok(None);
        };
        let alone = PoolSpec {
            name: name.clone(),
            cidrs: vec![*cidr],
            ..PoolSpec::default()
        };
        let clash = match self.all_pools().await {
            Err(e) => Some(e),
            Ok((pools, malformed)) => {
                overlap(&alone, &pools, &malformed).map(ClusterError::Refused)
            }
        };
        let clash = match clash {
            Some(c) => Some(c),
            None => match self.list_blocks(None, None).await {
                Err(e) => Some(e),
                Ok(listed) => listed.blocks.iter().find(|b| cidr.contains(&b.block) || b.block.contains(cidr)).map(|b| {
                    ClusterError::Refused(format!(
                        "pool {name:?}: block {} of pool {:?} still stands in {cidr} (its node gives it back at its next sync; try again)",
                        b.block, b.pool
                    ))
                }),
            },
        };
        let next = match &clash {
            // Withdrawn as a removal takes a CIDR out (what lies in it goes along), checked.
            Some(_) => marked
                .changed(&PoolChange::RemoveCidr(*cidr))
                .map_err(ClusterError::from)?,
            None => {
                let mut next = marked.clone();
                next.adding.retain(|c| c != cidr);
                next
            }
        };
        self.unmark(&marked_obj, next, clash, cidr).await.map(Some)
    }

    /// Removes `cidr` from the pool `obj` (`spec`): marked, the pool's blocks in it looked for,
    /// then taken out of the pool or left as it was. None: the pool changed before the mark.
    async fn remove_cidr(
        &self,
        obj: &DynamicObject,
        spec: &PoolSpec,
        cidr: &ipnet::IpNet,
    ) -> Result<Option<PoolSpec>, ClusterError> {
        let name = &spec.name;
        // Checked before anything is written (its only CIDR, say).
        spec.changed(&PoolChange::RemoveCidr(*cidr))
            .map_err(ClusterError::from)?;
        let mut marked = spec.clone();
        if !marked.removing.contains(cidr) {
            marked.adding.retain(|c| c != cidr);
            marked.removing.push(*cidr);
        }
        let Some((marked_obj, marked)) = self.mark(obj, spec, marked).await? else {
            return Ok(None);
        };
        let clash = match self.list_blocks(Some(name), None).await {
            Err(e) => Some(e),
            Ok(listed) => listed.owned_in(name, cidr).map(ClusterError::Refused),
        };
        // Nor a pinned address it sets aside there (the removal takes the exclusion along;
        // none can be where no excluded range meets the CIDR).
        let excludes = spec
            .exclude
            .iter()
            .any(|x| x.contains(cidr) || cidr.contains(x));
        let clash = match clash {
            Some(c) => Some(c),
            None if !excludes => None,
            None => match self.set_aside_pinned(name, Some(cidr)).await {
                Ok(why) => why.map(ClusterError::Refused),
                Err(e) => Some(e),
            },
        };
        let next = match &clash {
            Some(_) => {
                // As it was read: a CIDR that was on its way in stays so (never a CIDR of
                // the pool whose overlap check did not pass).
                let mut back = marked.clone();
                back.removing.retain(|c| c != cidr);
                back.adding = spec.adding.clone();
                back
            }
            None => marked
                .changed(&PoolChange::RemoveCidr(*cidr))
                .map_err(ClusterError::from)?,
        };
        self.unmark(&marked_obj, next, clash, cidr).await.map(Some)
    }
}
