//! How holds and pins end: a DEL lets go of its pod's hold ([`Holds::let_go`]), an ADD undone
//! withdraws the pin it made ([`Holds::withdraw`]), and the pin keeper lets go of holds no
//! attachment uses, ends pins nobody holds ([`Holds::end_unheld`], [`Holds::end_void`]) and
//! pins held here whose address another pod here has ([`Holds::end_misheld`]).
//! Each works on the pin it judged, read again at its address: on the Kubernetes API an owner
//! may have two pins for a while (one pin per owner is not one write there), and the one a
//! lookup by owner finds first need not be it.

use std::net::IpAddr;

use super::{Holds, Refused, ATTEMPTS};
use crate::cluster::pin::{Pin, PinOwner, PinRead};

impl Holds {
    /// Undoes the pin of `address` this node just made for the pod of uid `uid` whose ADD then
    /// failed: deleted while that pod is its only holder (else this node's hold ends, as at a
    /// DEL).
    pub async fn withdraw(
        &self,
        owner: &PinOwner,
        uid: &str,
        address: IpAddr,
    ) -> Result<(), Refused> {
        let me = self.node.name().to_string();
        for read in self.pins_of(owner).await? {
            if read.pin.address != address {
                continue;
            }
            let only_this =
                matches!(read.pin.holders.as_slice(), [only] if only.node == me && only.uid == uid);
            if only_this && self.delete(&read).await? {
                continue;
            }
            self.let_go_of(read, &me, uid).await?;
        }
        Ok(())
    }

    /// Ends this node's hold for the pod of uid `uid` on each of `owner`'s pins that has it
    /// and that `which` picks (its DEL: those whose address no other attachment here holds;
    /// an ADD undone, or the keeper: the one it judged). Nothing to do when none has.
    pub async fn let_go(
        &self,
        owner: &PinOwner,
        uid: &str,
        which: impl Fn(&Pin) -> bool,
    ) -> Result<(), Refused> {
        let me = self.node.name().to_string();
        let mut pins = self.pins_of(owner).await?;
        if crate::bugs::on(crate::bugs::Bug::OwnersFirstPinOnly) {
            pins.truncate(1);
        } else {
            pins.retain(|r| which(&r.pin));
        }
        for read in pins {
            self.let_go_of(read, &me, uid).await?;
        }
        Ok(())
    }

    /// Ends hold (`me`, `uid`) on the pin `read`, read again at its address while it changes.
    async fn let_go_of(&self, mut read: PinRead, me: &str, uid: &str) -> Result<(), Refused> {
        for _ in 0..ATTEMPTS {
            let mut pin = read.pin.clone();
            let before = pin.holders.len();
            pin.holders.retain(|h| !(h.node == me && h.uid == uid));
            if pin.holders.len() == before {
                self.node.pin_known(&read.pin);
                return Ok(());
            }
            if let Some(written) = self.write(&read, &pin).await? {
                self.node.pin_known(&written.pin);
                return Ok(());
            }
            match self.pin_at(&read.pin).await? {
                Some(again) if again.pin.owner == read.pin.owner => read = again,
                _ => {
                    self.node.pin_gone(&read.pin);
                    return Ok(());
                }
            }
        }
        Err(Refused::Store(format!(
            "the pin of {} kept changing while this node let go of it",
            read.pin.owner
        )))
    }

    /// Deletes the pin `pin` names if, read now at its address, it is still that pin and
    /// nobody holds it (its owner gone). True: deleted.
    pub async fn end_unheld(&self, pin: &Pin) -> Result<bool, Refused> {
        let Some(read) = self.unheld_as_known(pin).await? else {
            return Ok(false);
        };
        Ok(self.delete(&read).await?)
    }

    /// Deletes the pin `pin` names if, read now at its address, it is still that pin, nobody
    /// holds it, and it is void: its block no longer stands as it was made in (a creation
    /// that landed after its block was released, a block released by force and claimed
    /// again). It pins nothing, whoever its owner is, yet the node whose block now holds its
    /// address would keep the address out and the block from going back for as long as it
    /// stood. True: deleted.
    pub async fn end_void(&self, pin: &Pin) -> Result<bool, Refused> {
        let Some(read) = self.unheld_as_known(pin).await? else {
            return Ok(false);
        };
        match self.block_stands(&read.pin).await? {
            true => Ok(false),
            false => Ok(self.delete(&read).await?),
        }
    }

    /// Deletes the pin `pin` names if, read now at its address, it is still that pin, nobody
    /// holds it, and its owner has another pin that is held or that a lookup by owner finds
    /// first: of an owner's two pins (on the Kubernetes API, a creation that landed late in a
    /// block still standing), the one no pod of the owner takes. True: deleted.
    pub async fn end_second(&self, pin: &Pin) -> Result<bool, Refused> {
        let pins = self.pins_of(&pin.owner).await?;
        let at = |same: bool| {
            pins.iter()
                .position(|r| (r.pin.address == pin.address) == same)
        };
        let (Some(this), Some(other)) = (at(true), at(false)) else {
            return Ok(false);
        };
        if other > this && pins[other].pin.holders.is_empty() {
            return Ok(false);
        }
        let Some(read) = self.unheld_as_known(pin).await? else {
            return Ok(false);
        };
        Ok(self.delete(&read).await?)
    }

    /// Deletes the pin `pin` names if, read now at its address, it is still that pin, held by
    /// this node alone, and the engine here holds its address for none of its holds' pods
    /// (`attached`: whether the pod of a uid holds an address here) while it holds it for
    /// another pod: a pin whose creation landed after its ADD had failed (its daemon killed,
    /// say), once the address had gone to another pod. Kept, it would let the owner's next pod
    /// take that pod's address, here or, once its hold was let go, anywhere. True: deleted.
    pub async fn end_misheld(
        &self,
        pin: &Pin,
        attached: impl Fn(IpAddr, &str) -> bool,
    ) -> Result<bool, Refused> {
        let Some(read) = self.pin_at(pin).await? else {
            self.node.pin_gone(pin);
            return Ok(false);
        };
        let me = self.node.name();
        let same = read.pin.owner == pin.owner
            && read.pin.block == pin.block
            && read.pin.block_id == pin.block_id;
        let mine_only =
            !read.pin.holders.is_empty() && read.pin.holders.iter().all(|h| h.node == me);
        let unused = !read
            .pin
            .holders
            .iter()
            .any(|h| attached(read.pin.address, &h.uid));
        if !(same && mine_only && unused) {
            self.node.pin_known(&read.pin);
            return Ok(false);
        }
        Ok(self.delete(&read).await?)
    }

    /// The pin stored at `pin`'s address, if it is still that pin (made in the same block)
    /// and nobody holds it; what is read is known here either way.
    async fn unheld_as_known(&self, pin: &Pin) -> Result<Option<PinRead>, Refused> {
        let read = match crate::bugs::on(crate::bugs::Bug::OwnersFirstPinOnly) {
            true => self.pin_of(&pin.owner).await?,
            false => self.pin_at(pin).await?,
        };
        let Some(read) = read else {
            self.node.pin_gone(pin);
            return Ok(None);
        };
        let same = read.pin.address == pin.address
            && read.pin.owner == pin.owner
            && read.pin.block == pin.block
            && read.pin.block_id == pin.block_id;
        if !same || !read.pin.holders.is_empty() {
            self.node.pin_known(&read.pin);
            return Ok(None);
        }
        Ok(Some(read))
    }
}
