//! The store as a run begins: the pools the operator made before the nodes started.

use ipool_server::cluster::etcd::client::Call;
use ipool_server::cluster::ippool::PoolSpec;
use tokio::time::Instant;

use super::Shared;

impl Shared {
    /// Writes the pool into the store as the operator made it before the nodes started.
    pub(crate) fn seed_pool(&mut self, spec: &PoolSpec, wall_ms: u64) {
        let name = &spec.name;
        match self {
            Shared::Etcd(e) => {
                let put = ipool_server::cluster::etcd::request::put(
                    format!("/ipool/v1/pools/{name}"),
                    serde_json::to_vec(&spec).expect("a pool"),
                    0,
                );
                e.apply(&Call::Put(put), Instant::now()).expect("the pool");
            }
            Shared::Api { objects, .. } => {
                let body = serde_json::json!({
                    "apiVersion": "ipool.io/v1", "kind": "IPPool",
                    "metadata": {"name": name},
                    "spec": {"cidrs": spec.cidrs, "blockSizeV4": spec.block_v4,
                             "blockSizeV6": spec.block_v6, "exclude": spec.exclude},
                    "status": {"phase": "Ready"}});
                objects.respond(
                    "POST",
                    "/apis/ipool.io/v1/ippools",
                    &Default::default(),
                    body.to_string().as_bytes(),
                    (wall_ms / 1000) as i64,
                    true,
                );
            }
        }
    }
}
