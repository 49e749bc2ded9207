//! [`KubeStore`]'s watches ([`WatchStore`]): the node's blocks (a watch with the
//! `ipool.io/node=<node>` label selector: a block given back, released, or labelled with
//! another node comes as DELETED) and the pools (all of them: a few objects). kube's watcher
//! resumes each from the resourceVersion it last saw, and lists again when the apiserver
//! answers 410 Gone (the history compacted away): each listing done is a
//! [`Watched::Restarted`].

use futures::StreamExt;
use kube::runtime::watcher;

use super::objects::block_name;
use super::{KubeStore, NODE_LABEL, POOL_LABEL};
use crate::cluster::datastore::{WatchStore, Watched};
use crate::cluster::model::ClusterError;

/// What one event of either watch says, if anything: a block of the node's that is gone, or a
/// pool written; a listing done.
fn block_event(e: watcher::Event<kube::api::DynamicObject>) -> Option<Watched> {
    match e {
        watcher::Event::Delete(obj) => {
            let labels = obj.metadata.labels.clone().unwrap_or_default();
            let spec = &obj.data["spec"];
            let pool = spec["pool"]
                .as_str()
                .map(str::to_string)
                .or_else(|| labels.get(POOL_LABEL).cloned())?;
            let block = spec["cidr"].as_str()?.parse().ok()?;
            // An object whose name is not its CIDR never was a block of anyone's.
            (obj.metadata.name.as_deref() == Some(block_name(&block).as_str()))
                .then_some(Watched::BlockGone { pool, block })
        }
        watcher::Event::InitDone => Some(Watched::Restarted),
        _ => None,
    }
}

fn pool_event(e: watcher::Event<kube::api::DynamicObject>) -> Option<Watched> {
    match e {
        watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
            obj.metadata.name.map(Watched::Pool)
        }
        watcher::Event::InitDone => Some(Watched::Restarted),
        _ => None,
    }
}

#[async_trait::async_trait]
impl WatchStore for KubeStore {
    async fn watch(
        &self,
        node: &str,
        seen: &(dyn Fn(Watched) + Send + Sync),
    ) -> Result<(), ClusterError> {
        let config = || crate::k8s::watch_config(self.watch_read_timeout);
        let blocks = watcher(
            self.watch_blocks.clone(),
            config().labels(&format!("{NODE_LABEL}={node}")),
        )
        .map(|e| e.map(block_event));
        let pools = watcher(self.watch_pools.clone(), config()).map(|e| e.map(pool_event));
        let mut both = std::pin::pin!(futures::stream::select(blocks, pools));
        let mut failures = 0u32;
        while let Some(event) = both.next().await {
            match event {
                Ok(Some(w)) => {
                    failures = 0;
                    seen(w)
                }
                Ok(None) => failures = 0,
                // The history compacted away: the watcher lists again (Restarted when done).
                Err(watcher::Error::WatchError(s)) if s.code == 410 => {
                    tracing::debug!(node, "block or pool watch expired; listing again");
                }
                Err(e) => {
                    // The watcher resumes from where it was; a wait keeps a refusing apiserver
                    // from being asked in a loop, short enough that news are heard within a
                    // few seconds of the apiserver coming back.
                    failures += 1;
                    tracing::debug!(node, error = %e, "block or pool watch broke; resuming");
                    let wait = std::time::Duration::from_millis(250 << failures.min(3));
                    tokio::time::sleep(crate::cluster::jitter(wait)).await;
                }
            }
        }
        Err(ClusterError::Refused("the watch ended".into()))
    }
}
