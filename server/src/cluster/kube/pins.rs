//! Pins on the apiserver: `IPPin` objects (`ippins`), named after their address
//! (`10-1-2-3`: the pools' CIDRs never overlap, so one name per pin), labelled with their pool,
//! their block and a hash of their owner (`ipool.io/pin-owner`; an owner's name can be longer
//! than a label value).
//!
//! A creation is a create (409: the address is pinned), then a listing of the owner's pins:
//! another one there makes the creator withdraw its own (of two racing creators at least one
//! sees the other, the apiserver being linearizable), then a read of the block: one gone or
//! claimed anew makes it withdraw too. (The read does not make a create that arrives late
//! safe: that pin names a block no longer standing, and is void; see [`crate::cluster::pin`].)
//! A pin of an address its pool sets aside (`setAside`) is checked against the pool instead,
//! read after the create: Ready, made as `blockId` names, excluding the address, not losing
//! its CIDR; a pool deletion and a CIDR's removal mark the pool first, then list its pins.
//! A change is an update on the resourceVersion read, a deletion a delete on it.

use kube::api::{DeleteParams, DynamicObject, ListParams, Preconditions};
use serde_json::json;

use super::objects::{self, hash};
use super::{api_code, resource, KubeStore, PAGE, POOL_LABEL};
use crate::cluster::datastore::PinStore;
use crate::cluster::ippool::NotSetAside;
use crate::cluster::pin::{address_name, Pin, PinCreated, PinOwner, PinRead};
use crate::cluster::vocab::{ClusterError, PoolPhase};

/// The label that names a pin's block (its object name, `10-0-0-0-26`).
pub const BLOCK_LABEL: &str = "ipool.io/block";
/// The label that names a pin's owner, as a hash (16 hex digits) of its key.
pub const OWNER_LABEL: &str = "ipool.io/pin-owner";
/// Creates that find the address pinned and then free again before they can read it.
const CREATE_ATTEMPTS: usize = 3;

/// The owner's label value.
pub fn owner_label(owner: &PinOwner) -> String {
    format!("{:016x}", hash(&owner.to_string()))
}

/// The label selector of `owner`'s pins.
fn owner_selector(owner: &PinOwner) -> String {
    format!("{OWNER_LABEL}={}", owner_label(owner))
}

/// A new pin object.
fn new_pin(pin: &Pin) -> DynamicObject {
    let mut obj = DynamicObject::new(&address_name(&pin.address), &resource("IPPin", "ippins"))
        .data(json!({ "spec": pin }));
    obj.metadata.labels = Some(
        [
            (POOL_LABEL.to_string(), pin.pool.clone()),
            (BLOCK_LABEL.to_string(), objects::block_name(&pin.block)),
            (OWNER_LABEL.to_string(), owner_label(&pin.owner)),
        ]
        .into(),
    );
    obj
}

/// The pin an object says, with its resourceVersion.
fn parse_pin(obj: &DynamicObject) -> Result<PinRead, ClusterError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let bad = |why: String| ClusterError::Malformed {
        what: "pin",
        key: format!("ippins/{name}"),
        why,
    };
    let pin: Pin =
        serde_json::from_value(obj.data["spec"].clone()).map_err(|e| bad(e.to_string()))?;
    if address_name(&pin.address) != name {
        return Err(bad(format!(
            "spec.address {} is not the address its name says",
            pin.address
        )));
    }
    let labels = obj.metadata.labels.clone().unwrap_or_default();
    if labels.get(OWNER_LABEL) != Some(&owner_label(&pin.owner))
        || labels.get(POOL_LABEL) != Some(&pin.pool)
    {
        return Err(bad(format!(
            "its labels {OWNER_LABEL} and {POOL_LABEL} do not say its owner {} and pool {:?}",
            pin.owner, pin.pool
        )));
    }
    Ok(PinRead {
        pin,
        version: obj.metadata.resource_version.clone().unwrap_or_default(),
    })
}

impl KubeStore {
    /// Pins by a label selector, read in pages.
    async fn list_pins(&self, selector: Option<String>) -> Result<Vec<PinRead>, ClusterError> {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(s) = &selector {
            params = params.labels(s);
        }
        let mut out = Vec::new();
        loop {
            self.token().await;
            let page = self.pins.list(&params).await?;
            for obj in &page.items {
                out.push(parse_pin(obj)?);
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => params = params.continue_token(&next),
                None => return Ok(out),
            }
        }
    }

    /// Whether pool `pin.pool`, read now, still sets `pin`'s address aside as the pin says
    /// (made as `pin.block_id` names, `pin.block` one of its excluded ranges), and whether it
    /// is Ready and keeps the CIDR that holds the address (a deletion or a removal marks the
    /// pool, then lists its pins: one that listed none before this pin's create is seen here).
    async fn setting_aside(&self, pin: &Pin) -> Result<(bool, bool), ClusterError> {
        self.token().await;
        let Some(obj) = self.pools.get_opt(&pin.pool).await? else {
            return Ok((false, false));
        };
        let (spec, phase) = objects::parse_pool(&obj).map_err(|why| ClusterError::Malformed {
            what: "pool",
            key: format!("ippools/{}", pin.pool),
            why: why.to_string(),
        })?;
        let made = hash(obj.metadata.uid.as_deref().unwrap_or("")) == pin.block_id;
        let stands = made && spec.exclude.contains(&pin.block) && pin.block.contains(&pin.address);
        let changing =
            phase != PoolPhase::Ready || spec.removing.iter().any(|c| c.contains(&pin.address));
        Ok((stands, stands && !changing))
    }

    /// Why pool `pool` may not stop setting aside its addresses (in `within`, else all): some
    /// are pinned. None: none is.
    pub(super) async fn set_aside_pinned(
        &self,
        pool: &str,
        within: Option<&ipnet::IpNet>,
    ) -> Result<Option<String>, ClusterError> {
        let pinned: Vec<String> = self
            .list_pins(Some(format!("{POOL_LABEL}={pool}")))
            .await?
            .into_iter()
            .filter(|p| p.pin.set_aside && within.is_none_or(|c| c.contains(&p.pin.address)))
            .map(|p| format!("{} for {}", p.pin.address, p.pin.owner))
            .collect();
        Ok((!pinned.is_empty()).then(|| {
            format!(
                "pool {pool:?} has pinned addresses among those it sets aside ({}): unpin them first (ipoolctl cluster unpin)",
                pinned.join(", ")
            )
        }))
    }

    /// Deletes pin `name` at `version`: false when it changed or went.
    async fn delete_pin_at(&self, name: &str, version: &str) -> Result<bool, ClusterError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: None,
                resource_version: Some(version.to_string()),
            }),
            ..DeleteParams::default()
        };
        self.token().await;
        match self.pins.delete(name, &params).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait::async_trait]
impl PinStore for KubeStore {
    async fn pins(&self, pool: Option<&str>) -> Result<Vec<PinRead>, ClusterError> {
        self.list_pins(pool.map(|p| format!("{POOL_LABEL}={p}")))
            .await
    }

    /// The owner's pin; of two (creators that raced, one not yet withdrawn), the one whose
    /// name sorts first.
    async fn pin_of(&self, owner: &PinOwner) -> Result<Option<PinRead>, ClusterError> {
        Ok(self.pins_of(owner).await?.into_iter().next())
    }

    async fn pins_of(&self, owner: &PinOwner) -> Result<Vec<PinRead>, ClusterError> {
        let mut pins = self.list_pins(Some(owner_selector(owner))).await?;
        pins.retain(|p| &p.pin.owner == owner);
        pins.sort_by_key(|p| address_name(&p.pin.address));
        Ok(pins)
    }

    async fn pin_at(&self, pin: &Pin) -> Result<Option<PinRead>, ClusterError> {
        self.token().await;
        let obj = self.pins.get_opt(&address_name(&pin.address)).await?;
        obj.as_ref().map(parse_pin).transpose()
    }

    async fn create_pin(&self, pin: &Pin) -> Result<PinCreated, ClusterError> {
        let name = address_name(&pin.address);
        let mut created = None;
        for _ in 0..CREATE_ATTEMPTS {
            self.token().await;
            match self.pins.create(&self.post(), &new_pin(pin)).await {
                Ok(obj) => {
                    created = Some(parse_pin(&obj)?);
                    break;
                }
                Err(e) if api_code(&e) == Some(409) => {}
                Err(e) => return Err(e.into()),
            }
            self.token().await;
            if let Some(theirs) = self.pins.get_opt(&name).await? {
                return Ok(PinCreated::AddressTaken(parse_pin(&theirs)?));
            }
        }
        let Some(mine) = created else {
            return Err(ClusterError::Refused(format!(
                "pin {name}: the address kept being pinned and unpinned"
            )));
        };
        // Another pin of the owner: withdraw this one.
        let others: Vec<PinRead> = self
            .list_pins(Some(owner_selector(&pin.owner)))
            .await?
            .into_iter()
            .filter(|p| p.pin.owner == pin.owner && p.pin.address != pin.address)
            .collect();
        if let Some(theirs) = others.into_iter().next() {
            self.delete_pin_at(&name, &mine.version).await?;
            return Ok(PinCreated::OwnerHas(theirs));
        }
        // The block, read after the create: one gone or claimed anew pins nothing. (An
        // address set aside: the pool, likewise.)
        let stands = match pin.set_aside {
            true => self.setting_aside(pin).await?.1,
            false => self.pin_block_stands(pin).await?,
        };
        if !stands {
            self.delete_pin_at(&name, &mine.version).await?;
            return Ok(PinCreated::BlockChanged);
        }
        Ok(PinCreated::Created(mine))
    }

    async fn write_pin(&self, read: &PinRead, pin: &Pin) -> Result<Option<PinRead>, ClusterError> {
        read.pin.check_change(pin)?;
        let mut obj = new_pin(pin);
        obj.metadata.resource_version = Some(read.version.clone());
        self.token().await;
        match self
            .pins
            .replace(&address_name(&pin.address), &self.post(), &obj)
            .await
        {
            Ok(w) => Ok(Some(parse_pin(&w)?)),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete_pin(&self, read: &PinRead) -> Result<bool, ClusterError> {
        self.delete_pin_at(&address_name(&read.pin.address), &read.version)
            .await
    }

    async fn owner_gone_for(&self, read: &PinRead) -> Result<(i64, PinRead), ClusterError> {
        self.mark_gone(read).await
    }

    async fn owner_back(&self, read: &PinRead) -> Result<(), ClusterError> {
        self.unmark_gone(read).await
    }

    async fn set_aside_site(
        &self,
        pool: &str,
        ip: std::net::IpAddr,
    ) -> Result<Result<(ipnet::IpNet, i64), NotSetAside>, ClusterError> {
        self.token().await;
        let Some(obj) = self.pools.get_opt(pool).await? else {
            return Ok(Err(NotSetAside::Never(format!("no cluster pool {pool:?}"))));
        };
        let (spec, phase) = objects::parse_pool(&obj).map_err(|why| ClusterError::Malformed {
            what: "pool",
            key: format!("ippools/{pool}"),
            why: why.to_string(),
        })?;
        if phase != PoolPhase::Ready {
            return Ok(Err(NotSetAside::NotNow(format!(
                "cluster pool {pool:?} is {phase:?}"
            ))));
        }
        let id = hash(obj.metadata.uid.as_deref().unwrap_or(""));
        Ok(spec.set_aside_range(ip).map(|x| (x, id)))
    }

    async fn set_aside_pinnable(&self, pin: &Pin) -> Result<bool, ClusterError> {
        Ok(self.setting_aside(pin).await?.1)
    }

    async fn pin_block_stands(&self, pin: &Pin) -> Result<bool, ClusterError> {
        if pin.set_aside {
            return Ok(self.setting_aside(pin).await?.0);
        }
        self.token().await;
        let block = self
            .blocks
            .get_opt(&objects::block_name(&pin.block))
            .await?;
        Ok(block.is_some_and(|b| objects::revision(&b.metadata).create == pin.block_id))
    }
}

#[cfg(test)]
mod tests;
