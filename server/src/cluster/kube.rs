//! Cluster mode's store on the Kubernetes API (`[cluster] datastore = "kubernetes"`): no etcd
//! of ipool's own. Cluster-scoped custom resources of `ipool.io/v1` (their definitions in
//! `deploy/crds`):
//!
//! - `IPPool` (`ippools`): a pool's CIDRs, block sizes and excluded ranges, and its phase
//!   (`status.phase`: Pending while its creation checks for overlaps, Ready, Deleting while its
//!   deletion checks for blocks);
//! - `IPBlock` (`ipblocks`): a block's owner, named after its CIDR (`10-0-0-0-26`), labelled
//!   with its node and pool so that a node's sync lists only its own;
//! - `IPPin` (`ippins`): a fixed address kept for its owner (a StatefulSet's ordinal, a VM)
//!   and the node(s) holding it, named after the address (`10-1-2-3`), labelled with its pool,
//!   block and owner ([`crate::cluster::pin`]);
//! - a `coordination.k8s.io/v1` Lease per node (`ipool-<node>`, in `lease_namespace`): who
//!   holds the node's name (holder: the daemon's instance id).
//!
//! The apiserver has no transactions over two objects; each rule of [`super::datastore`] is
//! one conditioned write, or a write and a read ordered so that of two racing callers at least
//! one sees the other (the apiserver is linearizable: its writes and unpaged lists go to etcd):
//!
//! - a claim is a create (409 AlreadyExists: another node won), then a read of the pool: a
//!   pool no longer Ready, or made anew, gets the block given back at once;
//! - deleting a pool marks it Deleting, then lists its blocks: none, it is deleted (on the
//!   marked resourceVersion); some, it is Ready again and the deletion refused. A claim's block
//!   created before the listing is seen by it; one created after it reads Deleting;
//! - creating a pool writes it Pending, then lists the pools: another overlapping pool (of any
//!   phase) makes it withdraw; else it is made Ready. Of two overlapping creations at least
//!   one sees the other, and nothing is claimed from a Pending pool;
//! - a give-back is a delete with preconditions (the uid and resourceVersion listed), a
//!   settle an update on the resourceVersion listed: no give-back sent before it applies;
//! - a node's name is its Lease, taken with a create or an update on the resourceVersion
//!   read. Another holder's Lease is taken over only after it stayed unchanged, as this process
//!   observed it, for its whole duration (client-go's leader election rule: no wall clock of
//!   another machine is trusted). How long a node has been away, for release-node, is the
//!   apiserver's clock: the time it stamped on the daemon's last renewal against the time it
//!   stamps on ipoolctl's own write (`metadata.managedFields`).
//!
//! # Layout
//! - `blocks`: blocks on the apiserver;
//! - `lease`: node names on the apiserver;
//! - `objects`: ipool's custom resources as JSON, and back;
//! - `pin_marks`: how long a pin's owner has been gone, measured by the apiserver's clock;
//! - `pins`: pins on the apiserver;
//! - `pool_change`: pools on the apiserver changed while they run (`ipoolctl cluster pool
//!   add-cidr|remove-cidr| disable|enable`, `ipoolctl cluster reserve|unreserve`);
//! - `pools`: pools on the apiserver;
//! - `store`: [`KubeStore`] as a [`Datastore`](super::datastore::Datastore);
//! - `watch`: [`KubeStore`]'s watches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::Client;

use super::limiter::Limiter;
use super::vocab::ClusterError;

mod blocks;
mod lease;
mod objects;
/// The revision a block records of its pool (`spec.poolRevision`): from the pool's uid.
pub use objects::hash as pool_revision_of_uid;
mod pin_marks;
mod pins;
pub use pins::{BLOCK_LABEL, OWNER_LABEL};
mod pool_change;
mod pools;
mod store;
mod watch;

pub use objects::block_name;

/// The API group of ipool's custom resources, and its version.
pub const GROUP: &str = "ipool.io";
pub const VERSION: &str = "v1";
/// Labels every block carries: its node and its pool.
pub const NODE_LABEL: &str = "ipool.io/node";
pub const POOL_LABEL: &str = "ipool.io/pool";
/// The field manager of ipool's writes (their times, in `metadata.managedFields`, are the
/// apiserver's clock).
pub const FIELD_MANAGER: &str = "ipoold";
/// The field manager of a daemon's release of a departed node (`cluster::departed`): not
/// [`FIELD_MANAGER`], whose writes are the daemons' own heartbeats.
pub const RELEASE_MANAGER: &str = "ipoold-release-departed";
/// Objects per page of a listing.
const PAGE: u32 = 500;
/// How long a watch may stay silent before its client gives up on it: the apiserver ends each
/// watch a few seconds before (`k8s::watch_config`), and the watcher makes it again from where
/// it was. About five minutes, as client-go's reflectors.
pub const WATCH_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The pools and blocks of one cluster in its Kubernetes API.
#[derive(Clone)]
pub struct KubeStore {
    pools: Api<DynamicObject>,
    blocks: Api<DynamicObject>,
    pins: Api<DynamicObject>,
    leases: Api<Lease>,
    lease_namespace: String,
    limiter: Option<Arc<Limiter>>,
    urgent: bool,
    /// Leases held by another daemon, as first seen unchanged: (resourceVersion, when).
    observed: Arc<Mutex<HashMap<String, (String, Instant)>>>,
    /// Leases this process holds, as its last write left them: renewed on that
    /// resourceVersion, without a read (one only after a conflict).
    held: Arc<Mutex<HashMap<String, k8s_openapi::api::coordination::v1::Lease>>>,
    /// The holds of pins each held Lease's next renewal confirms (its annotation's value).
    confirms: Arc<Mutex<HashMap<String, String>>>,
    field_manager: String,
    /// The watches' blocks and pools: over a client whose read deadline is longer than a
    /// watch lasts (see [`KubeStore::with_watch_client`]).
    watch_blocks: Api<DynamicObject>,
    watch_pools: Api<DynamicObject>,
    watch_read_timeout: std::time::Duration,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl KubeStore {
    /// A store on the apiserver `client` talks to, its Leases in `lease_namespace`; every
    /// request through `limiter`. The custom resources are checked here with a read (a cluster
    /// without ipool's CRDs is an error now, naming them).
    pub async fn connect(
        client: Client,
        lease_namespace: &str,
        limiter: Option<Arc<Limiter>>,
        field_manager: &str,
    ) -> Result<KubeStore, ClusterError> {
        let store = KubeStore {
            pools: Api::all_with(client.clone(), &resource("IPPool", "ippools")),
            blocks: Api::all_with(client.clone(), &resource("IPBlock", "ipblocks")),
            pins: Api::all_with(client.clone(), &resource("IPPin", "ippins")),
            watch_pools: Api::all_with(client.clone(), &resource("IPPool", "ippools")),
            watch_blocks: Api::all_with(client.clone(), &resource("IPBlock", "ipblocks")),
            watch_read_timeout: WATCH_READ_TIMEOUT,
            leases: Api::namespaced(client, lease_namespace),
            lease_namespace: lease_namespace.to_string(),
            limiter,
            urgent: false,
            observed: Arc::default(),
            held: Arc::default(),
            confirms: Arc::default(),
            field_manager: field_manager.to_string(),
        };
        store.token().await;
        store
            .pools
            .list(&kube::api::ListParams::default().limit(1))
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => ClusterError::NotFound(format!(
                    "the apiserver has no {GROUP}/{VERSION} ippools: apply ipool's CustomResourceDefinitions (deploy/crds) first"
                )),
                e => e.into(),
            })?;
        Ok(store)
    }

    /// The same store, its watches over `client`: one whose read deadline
    /// (`read_timeout`) outlasts a watch, which the apiserver ends a few seconds before it (the
    /// store's own client fails a request that is silent for `store_timeout_ms`).
    pub fn with_watch_client(
        mut self,
        client: Client,
        read_timeout: std::time::Duration,
    ) -> KubeStore {
        self.watch_pools = Api::all_with(client.clone(), &resource("IPPool", "ippools"));
        self.watch_blocks = Api::all_with(client, &resource("IPBlock", "ipblocks"));
        self.watch_read_timeout = read_timeout;
        self
    }

    /// Waits for a token of the rate limit (takes one at once when urgent).
    async fn token(&self) {
        if let Some(l) = &self.limiter {
            l.acquire(self.urgent).await;
        }
    }

    fn post(&self) -> PostParams {
        PostParams {
            dry_run: false,
            field_manager: Some(self.field_manager.clone()),
        }
    }

    /// The Lease that holds `node`'s name.
    pub fn lease_name(node: &str) -> String {
        format!("ipool-{node}")
    }

    /// Where the Leases are.
    pub fn lease_namespace(&self) -> &str {
        &self.lease_namespace
    }
}

/// The status of a refused request, when the apiserver answered one.
fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}
