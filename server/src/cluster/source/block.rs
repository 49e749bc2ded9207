//! A block this node holds, and where it stands between this node and the store.

use tokio::time::Instant;

use ipnet::IpNet;

use crate::cluster::vocab::KeyRevision;
use crate::model::SubnetMode;
use crate::range::{to_u128, Range, RangeAllocator, RangeSpec};
use crate::source::BlockRefused;

/// Where a block stands between this node and the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// The store holds it; no sync has said yet whose it is (a give-back of it may be on its
    /// way, sent before a restart: the sync settles it).
    Unconfirmed,
    /// This node's, as of the last sync or its claim: its key as last read or written.
    Confirmed(KeyRevision),
    /// The store does not list it as this node's, and addresses held here are in it: to be
    /// claimed back.
    Reclaiming,
    /// Being given back (it was empty).
    Returning(KeyRevision),
    /// A give-back whose outcome is not known (the store did not answer, and may still apply it):
    /// the next sync settles it.
    Unsettled(KeyRevision),
    /// Another node owns it, or it cannot be this node's: why.
    Lost(String),
    /// This node's (settled at this revision), but its pool is being deleted: in doubt until
    /// the deletion is done or refused. Serves nothing, and is not given back (the deletion
    /// may still see it and be refused): synced again soon.
    Doubt(KeyRevision),
    /// This node's (settled at this revision), but its pool is gone or made anew since it was
    /// claimed: serves nothing ever again, and is given back once nothing in it is in use.
    Orphaned(KeyRevision),
}

impl BlockState {
    /// The label of the state (metrics, status).
    pub fn name(&self) -> &'static str {
        match self {
            BlockState::Unconfirmed => "unconfirmed",
            BlockState::Confirmed(_) => "confirmed",
            BlockState::Reclaiming => "reclaiming",
            BlockState::Returning(_) => "returning",
            BlockState::Unsettled(_) => "unsettled",
            BlockState::Lost(_) => "lost",
            BlockState::Doubt(_) => "doubt",
            BlockState::Orphaned(_) => "orphaned",
        }
    }

    /// Every state, for metrics that show zeros too.
    pub const ALL: [&'static str; 8] = [
        "unconfirmed",
        "confirmed",
        "reclaiming",
        "returning",
        "unsettled",
        "lost",
        "doubt",
        "orphaned",
    ];
}

pub(super) struct Owned {
    /// The block's CIDR.
    net: IpNet,
    pub(super) alloc: RangeAllocator,
    /// The store holds it.
    pub(super) recorded: bool,
    pub(super) state: BlockState,
    pub(super) empty_since: Option<Instant>,
}

impl Owned {
    /// Block `net`, handing out what `range` allows (see [`block_range`]).
    pub(super) fn new(net: IpNet, range: Range, recorded: bool, state: BlockState) -> Owned {
        Owned {
            net,
            alloc: RangeAllocator::new(vec![range]),
            recorded,
            state,
            empty_since: Some(Instant::now()),
        }
    }

    /// The addresses held in it.
    pub(super) fn held(&self) -> Vec<std::net::IpAddr> {
        let net = self.net();
        net.hosts()
            .chain([net.network(), net.broadcast()])
            .filter(|ip| self.alloc.is_taken(*ip))
            .collect()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.alloc.free() == self.alloc.size()
    }

    pub(super) fn confirmed(&self) -> bool {
        match self.state {
            BlockState::Confirmed(_) => true,
            // The bug, put back: a block being claimed back served on.
            BlockState::Reclaiming => crate::bugs::on(crate::bugs::Bug::UnlistedServes),
            _ => false,
        }
    }

    pub(super) fn net(&self) -> IpNet {
        self.net
    }
}

/// What block `net` of pool CIDR `cidr` hands out. By block: a host-local range of its own
/// (its first address the gateway, its network and broadcast addresses never handed out). As
/// one subnet (`subnet`): every address of the block but the CIDR's network, broadcast and
/// gateway addresses, each reported with the CIDR's prefix and gateway.
pub(super) fn block_range(
    net: IpNet,
    cidr: &IpNet,
    subnet: Option<&SubnetMode>,
) -> Result<Range, BlockRefused> {
    let Some(mode) = subnet else {
        return Range::from_spec(&RangeSpec {
            subnet: net.to_string(),
            range_start: None,
            range_end: None,
            gateway: None,
        })
        .map_err(|e| BlockRefused::Outside(format!("block {net}: {e}")));
    };
    let range = Range {
        subnet: *cidr,
        start: net.network(),
        end: net.broadcast(),
        gateway: mode.gateway_in(cidr),
    };
    // Nothing to hand out (a /32 block that is the CIDR's gateway, say): refused as a block of
    // its own would be.
    match range.size() > 0 && to_u128(range.start) <= to_u128(range.end) {
        true => Ok(range),
        false => Err(BlockRefused::Outside(format!(
            "block {net} of {cidr} holds no address to hand out as one subnet"
        ))),
    }
}
