//! The store's watches of this node's blocks and of the pools, run for as long as the node
//! runs, what they say taken in by its [`Heard`](crate::cluster::heard::Heard).

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::datastore::Watched;
use crate::cluster::node::ClusterNode;

/// The longest wait before the watches are started again after they ended.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Runs the store's watches of `node`'s blocks and of the pools until aborted, what they say
/// taken in by the node's [`Heard`](crate::cluster::heard::Heard); started again after a
/// wait whenever they end.
pub async fn keep_watching(node: Arc<ClusterNode>) {
    let mut wait = Duration::from_secs(1);
    loop {
        match node.connection().await {
            Ok(store) => {
                let seen = |w: Watched| node.hear(w);
                if let Err(e) = store.watch(node.name(), &seen).await {
                    tracing::debug!(node = %node.name(), error = %e, "the watches ended; starting them again");
                }
            }
            Err(e) => {
                tracing::debug!(node = %node.name(), error = %e, "cannot watch: no store connection")
            }
        }
        tokio::time::sleep(crate::cluster::jitter(wait)).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
}
