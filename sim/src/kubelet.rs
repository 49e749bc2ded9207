//! What the kubelets asked of the daemons and what they still owe: ADDs on their way (each
//! container's slot and what its node knew when it was sent), ADDs refused, DELs sent and DELs
//! owed (an ADD that failed or was not answered, a DEL that failed: the kubelet makes them
//! again), and the counters that name containers and count acknowledged ADDs.

use std::collections::BTreeMap;

/// An ADD on its way.
pub(crate) struct Adding {
    pub slot: usize,
    /// Its node's syncs taken in when it was sent (per pool and family,
    /// `World::pool_sync_counts`).
    pub syncs: [u64; 4],
    /// The owner of its fixed address, if it has one.
    pub owner: Option<ipool_server::cluster::pin::PinOwner>,
    /// A VM launcher's instance (its VMI's uid).
    pub instance: Option<String>,
}

/// The kubelets' side of the run.
#[derive(Default)]
pub(crate) struct Kubelet {
    /// The last container numbered (`c1`, `c2`, ...).
    pub next_container: u64,
    /// ADDs on their way: container -> its ADD.
    pub adding: BTreeMap<String, Adding>,
    /// DELs owed (an ADD failed or was not answered, a DEL failed): container -> slot.
    pub owed: BTreeMap<String, usize>,
    /// ADDs acknowledged so far.
    pub adds_ok: u64,
    /// ADDs refused: container, why.
    pub refused: Vec<(String, String)>,
    /// DELs sent and not answered yet: container -> slot (a daemon killed meanwhile never
    /// answers them; the kubelet makes them again).
    pub dels: BTreeMap<String, usize>,
}
