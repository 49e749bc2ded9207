//! Fixed addresses in a source of one subnet (see [`crate::cluster::pin`]): a pinned address
//! is kept from everyone on every path, as a reservation is, except from the pod it is pinned
//! for while this node holds the pin (`Source::*_fixed`); and a pinned address outside this
//! node's blocks, held here for its pod, is *hosted*: in use here, reported with its subnet's
//! prefix and gateway, given up when released.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{block, max_prefix, ClusterSource};
use crate::range::{OccupyError, Range};

impl ClusterSource {
    /// Why the pin of `ip` keeps it out here, if one does (as this node knows the pool's pins).
    pub(super) fn pinned_why(&self, ip: IpAddr) -> Option<String> {
        // A routed pool holds no pins: its sources (the default) skip the book's lock on
        // every hand-out.
        self.subnet.as_ref()?;
        if crate::bugs::on(crate::bugs::Bug::PinnedHandedOut) {
            return None;
        }
        let pin = self.node.pin_at(&self.pool, ip)?;
        Some(format!(
            "{ip} is pinned in cluster pool {:?} for {} (held by {}): it is handed out to that owner's pod only",
            self.pool,
            pin.owner,
            pin.holders_shown()
        ))
    }

    /// The range a hosted `ip` would be in: its pool CIDR as one subnet, if `ip` is an address
    /// of it that is handed out (not its network, broadcast or gateway address).
    pub(super) fn hosting_range(&self, ip: IpAddr) -> Option<Range> {
        let cidr = self.cidrs.iter().find(|c| c.contains(&ip))?;
        let one = IpNet::new(ip, max_prefix(ip)).ok()?;
        let range = block::block_range(one, cidr, self.subnet.as_ref()).ok()?;
        (self.subnet.is_some() && range.allocatable(ip)).then_some(range)
    }

    /// Whether `ip` may be handed out to the pod it is fixed for: this node holds its pin;
    /// reservations and exclusions still count; in a block of this node's, as any address
    /// there; outside them, hosted once.
    pub(super) fn can_take_fixed(&self, ip: IpAddr) -> Result<(), OccupyError> {
        if !self.node.holds_pin(&self.pool, ip) {
            return Err(OccupyError::Withheld(
                ip,
                format!(
                    "this node holds no pin of {ip} in cluster pool {:?}",
                    self.pool
                ),
            ));
        }
        if let Some(why) = self.reserved_why(ip) {
            return Err(OccupyError::Withheld(ip, why));
        }
        if self.block_of(ip).is_some() {
            return self.can_occupy_unpinned(ip);
        }
        if self.hosted.contains(&ip) {
            return Err(OccupyError::Taken(ip));
        }
        match self.hosting_range(ip) {
            Some(_) => Ok(()),
            None => Err(OccupyError::NotInRange(ip)),
        }
    }

    /// Takes `ip` for the pod it is fixed for (or again after a restart): in its block here,
    /// else hosted.
    pub(super) fn take_fixed(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        if self.block_of(ip).is_some() {
            return self.occupy_in_block(ip);
        }
        if self.hosting_range(ip).is_none() {
            return Err(OccupyError::NotInRange(ip));
        }
        match self.hosted.insert(ip) {
            true => Ok(()),
            false => Err(OccupyError::Taken(ip)),
        }
    }

    /// Why `ip` is withheld from the pod it is fixed for: as from anyone, but its pin, held
    /// here, does not count.
    pub(super) fn withheld_fixed_why(&self, ip: IpAddr) -> Option<String> {
        if !self.node.holds_pin(&self.pool, ip) {
            return self.withheld_why(ip);
        }
        if self.hosted.contains(&ip) {
            return self.stopped_or_reserved(ip);
        }
        self.withheld_unpinned(ip)
    }
}
