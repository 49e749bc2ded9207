//! Pins in etcd ([`crate::cluster::pin`]). Keys, under the prefix:
//!
//! - `pins/<pool>/<block>/<address>`: the pin ([`Pin`], JSON), under its block (`10.0.0.0-26`)
//!   so that a block's pins are one prefix; `pins/<pool>/set-aside/<address>` for an address
//!   the pool sets aside;
//! - `pin-owners/<owner>` (`pin-owners/StatefulSet/ns/web/0`): the key of its owner's pin.
//!
//! A creation is one transaction: both keys absent, and the block's key the one the pin
//! names (created at `blockId`), else nothing is written and the answer says which failed. A
//! pin of an address the pool sets aside (`setAside`, keyed under its excluded range) is
//! conditioned instead on the pool's key as read, made at `blockId` and excluding the range
//! (a deletion of the pool, or a removal of the CIDR holding the range, is conditioned in turn
//! on no such pin). A
//! change or a deletion is conditioned on the pin's key as read (its mod revision and its
//! value: an etcd restored with its data copied numbers writes again); a deletion takes the
//! owner's key with it.

use super::blocks::PAGE;
use super::request::{self, cmp, op};
use super::{block_key_part, EtcdStore};
use crate::cluster::datastore::PinStore;
use crate::cluster::ippool::NotSetAside;
use crate::cluster::pin::{Pin, PinCreated, PinOwner, PinRead};
use crate::cluster::vocab::ClusterError;
use ipool_proto::etcd::etcdserverpb::Compare;
use ipool_proto::etcd::mvccpb::KeyValue;

impl EtcdStore {
    fn pins_prefix(&self, pool: Option<&str>) -> String {
        match pool {
            Some(p) => self.key(&format!("pins/{p}/")),
            None => self.key("pins/"),
        }
    }

    /// The prefix of the pins in `block` of `pool`.
    pub(super) fn block_pins_prefix(&self, pool: &str, block: &ipnet::IpNet) -> String {
        format!("{}{}/", self.pins_prefix(Some(pool)), block_key_part(block))
    }

    /// The key of `pin`.
    pub fn pin_key(&self, pin: &Pin) -> String {
        match pin.set_aside {
            true => format!("{}{}", self.set_aside_prefix(&pin.pool), pin.address),
            false => format!(
                "{}{}",
                self.block_pins_prefix(&pin.pool, &pin.block),
                pin.address
            ),
        }
    }

    /// The prefix of the pins of the addresses `pool` sets aside (no block's part is
    /// `set-aside`): a pool deletion, or a removal of a CIDR, is conditioned on what it
    /// holds.
    pub(super) fn set_aside_prefix(&self, pool: &str) -> String {
        format!("{}set-aside/", self.pins_prefix(Some(pool)))
    }

    /// Pool `pin.pool` as it stands now, if it still sets `pin`'s address aside as the pin
    /// says (the pool made at `pin.block_id`, `pin.block` one of its excluded ranges): its
    /// key's mod revision.
    async fn setting_aside(&self, pin: &Pin) -> Result<Option<i64>, ClusterError> {
        let Some((spec, created, modified)) = self.pool_now(&pin.pool).await? else {
            return Ok(None);
        };
        let stands = created == pin.block_id
            && spec.exclude.contains(&pin.block)
            && pin.block.contains(&pin.address);
        Ok(stands.then_some(modified))
    }

    /// Pool `pool` as its key holds it now: its spec, and the key's create and mod revisions.
    async fn pool_now(
        &self,
        pool: &str,
    ) -> Result<Option<(crate::cluster::ippool::PoolSpec, i64, i64)>, ClusterError> {
        let key = self.pool_key(pool);
        let r = self.client().range(request::get(key.clone())).await?;
        let Some(kv) = r.kvs.first() else {
            return Ok(None);
        };
        let spec = serde_json::from_slice(&kv.value).map_err(|e| ClusterError::Malformed {
            what: "pool",
            key,
            why: e.to_string(),
        })?;
        Ok(Some((spec, kv.create_revision, kv.mod_revision)))
    }

    fn pin_owner_key(&self, owner: &PinOwner) -> String {
        self.key(&format!("pin-owners/{owner}"))
    }

    /// The pin `kv` holds, with its version; a value that is not one is malformed.
    fn parse_pin(&self, kv: &KeyValue) -> Result<PinRead, ClusterError> {
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        let pin: Pin = serde_json::from_slice(&kv.value).map_err(|e| ClusterError::Malformed {
            what: "pin",
            key: key.clone(),
            why: e.to_string(),
        })?;
        if self.pin_key(&pin) != key {
            return Err(ClusterError::Malformed {
                what: "pin",
                key,
                why: format!(
                    "it says {} of pool {:?} in block {}",
                    pin.address, pin.pool, pin.block
                ),
            });
        }
        // A value this version would not write the same (an older one's) is compared by its
        // revision alone: a value compare on bytes it cannot make again would never pass.
        let exact = serde_json::to_vec(&pin).is_ok_and(|v| v == kv.value);
        let version = match exact {
            true => kv.mod_revision.to_string(),
            false => format!("{}{REVISION_ONLY}", kv.mod_revision),
        };
        Ok(PinRead { pin, version })
    }

    /// What a change of the pin `read` names is conditioned on: its key's mod revision, and
    /// its value as read. An etcd restored from a backup with its data copied (no
    /// `--bump-revision`) numbers its writes again from the backup's revision, so that a
    /// change sent before the restore and landing after it (an `ipoolctl cluster unpin` given
    /// up on) can find another pin written since on the revision it read.
    pub(super) fn as_read(&self, read: &PinRead) -> Result<Vec<Compare>, ClusterError> {
        let key = self.pin_key(&read.pin);
        let mut when = vec![cmp::mod_revision(
            key.clone(),
            cmp::Equal,
            revision_of(read)?,
        )];
        if !read.version.ends_with(REVISION_ONLY)
            && !crate::bugs::on(crate::bugs::Bug::PinChangeOnRevisionOnly)
        {
            let value = serde_json::to_vec(&read.pin).expect("serializes");
            when.push(cmp::value(key, cmp::Equal, value));
        }
        Ok(when)
    }

    async fn read_pin_key(&self, key: &str) -> Result<Option<PinRead>, ClusterError> {
        let r = self.client().range(request::get(key)).await?;
        r.kvs.first().map(|kv| self.parse_pin(kv)).transpose()
    }
}

impl EtcdStore {
    /// Writes `pin` over the write `read` names, and only while `also` holds (a release: the
    /// node's name not held); None when either changed.
    pub(super) async fn write_pin_if(
        &self,
        read: &PinRead,
        pin: &Pin,
        also: Vec<ipool_proto::etcd::etcdserverpb::Compare>,
    ) -> Result<Option<PinRead>, ClusterError> {
        read.pin.check_change(pin)?;
        let key = self.pin_key(pin);
        let value = serde_json::to_vec(pin).expect("serializes");
        let mut when = self.as_read(read)?;
        when.extend(also);
        let txn = request::txn(when, [op::put(key, value, 0)], []);
        let r = self.client().txn(txn).await?;
        Ok(r.succeeded.then(|| PinRead {
            pin: pin.clone(),
            version: r.header.as_ref().map_or(0, |h| h.revision).to_string(),
        }))
    }
}

/// Marks the version of a pin whose value this version would not write the same: its changes
/// are conditioned on its revision alone.
const REVISION_ONLY: &str = "r";

/// A version this store wrote: etcd's mod revision.
pub(super) fn revision_of(read: &PinRead) -> Result<i64, ClusterError> {
    let digits = read.version.strip_suffix(REVISION_ONLY);
    digits.unwrap_or(&read.version).parse().map_err(|_| {
        ClusterError::Refused(format!(
            "pin version {:?} is not an etcd revision (read from another store?)",
            read.version
        ))
    })
}

#[async_trait::async_trait]
impl PinStore for EtcdStore {
    async fn pins(&self, pool: Option<&str>) -> Result<Vec<PinRead>, ClusterError> {
        let kvs = self
            .client()
            .range_paged(request::get_prefix(self.pins_prefix(pool)), PAGE)
            .await?;
        kvs.iter().map(|kv| self.parse_pin(kv)).collect()
    }

    async fn pin_of(&self, owner: &PinOwner) -> Result<Option<PinRead>, ClusterError> {
        let r = self
            .client()
            .range(request::get(self.pin_owner_key(owner)))
            .await?;
        let Some(kv) = r.kvs.first() else {
            return Ok(None);
        };
        let key = String::from_utf8_lossy(&kv.value).into_owned();
        // Deleted with its owner's key, in one transaction: a pin gone since is no pin.
        Ok(self
            .read_pin_key(&key)
            .await?
            .filter(|p| &p.pin.owner == owner))
    }

    async fn pin_at(&self, pin: &Pin) -> Result<Option<PinRead>, ClusterError> {
        self.read_pin_key(&self.pin_key(pin)).await
    }

    async fn create_pin(&self, pin: &Pin) -> Result<PinCreated, ClusterError> {
        let key = self.pin_key(pin);
        let owner_key = self.pin_owner_key(&pin.owner);
        // Made in its block as it stands; or, an address set aside, while its pool (as read
        // now, setting it aside) is unchanged.
        let made_in = match pin.set_aside {
            false => cmp::create_revision(
                self.block_key(&pin.pool, &pin.block),
                cmp::Equal,
                pin.block_id,
            ),
            true => match self.setting_aside(pin).await? {
                Some(revision) => cmp::mod_revision(self.pool_key(&pin.pool), cmp::Equal, revision),
                None => return Ok(PinCreated::BlockChanged),
            },
        };
        let value = serde_json::to_vec(pin).expect("serializes");
        let txn = request::txn(
            [
                cmp::version(key.clone(), cmp::Equal, 0),
                cmp::version(owner_key.clone(), cmp::Equal, 0),
                made_in,
            ],
            [
                op::put(key.clone(), value, 0),
                op::put(owner_key.clone(), key.clone(), 0),
            ],
            [op::get(owner_key.clone()), op::get(key.clone())],
        );
        let r = self.client().txn(txn).await?;
        let revision = r.header.as_ref().map_or(0, |h| h.revision);
        if r.succeeded {
            return Ok(PinCreated::Created(PinRead {
                pin: pin.clone(),
                version: revision.to_string(),
            }));
        }
        let reads: Vec<&KeyValue> = request::txn_reads(&r).collect();
        if let Some(owners) = reads.iter().find(|kv| kv.key == owner_key.as_bytes()) {
            let theirs = String::from_utf8_lossy(&owners.value).into_owned();
            if let Some(p) = self.read_pin_key(&theirs).await? {
                return Ok(PinCreated::OwnerHas(p));
            }
        }
        if let Some(kv) = reads.iter().find(|kv| kv.key == key.as_bytes()) {
            return Ok(PinCreated::AddressTaken(self.parse_pin(kv)?));
        }
        Ok(PinCreated::BlockChanged)
    }

    async fn write_pin(&self, read: &PinRead, pin: &Pin) -> Result<Option<PinRead>, ClusterError> {
        self.write_pin_if(read, pin, Vec::new()).await
    }

    async fn delete_pin(&self, read: &PinRead) -> Result<bool, ClusterError> {
        let key = self.pin_key(&read.pin);
        let txn = request::txn(
            self.as_read(read)?,
            [
                op::delete(key),
                op::delete(self.pin_owner_key(&read.pin.owner)),
                op::delete(self.owner_gone_key(&read.pin)),
            ],
            [],
        );
        Ok(self.client().txn(txn).await?.succeeded)
    }

    async fn owner_gone_for(&self, read: &PinRead) -> Result<(i64, PinRead), ClusterError> {
        Ok((self.mark_gone(read).await?, read.clone()))
    }

    async fn owner_back(&self, read: &PinRead) -> Result<(), ClusterError> {
        self.unmark_gone(read).await
    }

    async fn set_aside_site(
        &self,
        pool: &str,
        ip: std::net::IpAddr,
    ) -> Result<Result<(ipnet::IpNet, i64), NotSetAside>, ClusterError> {
        let Some((spec, created, _)) = self.pool_now(pool).await? else {
            return Ok(Err(NotSetAside::Never(format!("no cluster pool {pool:?}"))));
        };
        Ok(spec.set_aside_range(ip).map(|x| (x, created)))
    }

    async fn pin_block_stands(&self, pin: &Pin) -> Result<bool, ClusterError> {
        if pin.set_aside {
            return Ok(self.setting_aside(pin).await?.is_some());
        }
        let key = self.block_key(&pin.pool, &pin.block);
        let r = self.client().range(request::get(key)).await?;
        Ok(r.kvs
            .first()
            .is_some_and(|kv| kv.create_revision == pin.block_id))
    }
}
