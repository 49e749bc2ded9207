//! [`KubeStore`]'s watches ([`WatchStore`]): the node's blocks (a watch with the
//! `ipool.io/node=<node>` label selector: a block given back, released, or labelled with
//! another node comes as DELETED) and the pools (all of them: a few objects). kube's watcher
//! resumes each from the resourceVersion it last saw, and lists again when the apiserver
//! answers 410 Gone (the history compacted away): each listing done is a
//! [`Watched::Restarted`]. Each watch waits out its own retries (a broken pool watch never
//! holds back the news of the node's blocks).

use std::time::Duration;

use futures::StreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::{watcher, WatchStreamExt};

use super::objects::block_name;
use super::{KubeStore, NODE_LABEL, POOL_LABEL};
use crate::cluster::datastore::{WatchStore, Watched};
use crate::cluster::vocab::ClusterError;

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

/// A watch's wait before it is made again after a failure: 250 ms doubling to 2 s, jittered
/// (a refusing apiserver is not asked in a loop; news are heard within a few seconds of it
/// coming back); back to the start once an event comes.
#[derive(Default)]
struct RetryWait {
    failures: u32,
}

impl Iterator for RetryWait {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        self.failures += 1;
        let wait = Duration::from_millis(250 << self.failures.min(3));
        Some(crate::cluster::jitter(wait))
    }
}

impl Backoff for RetryWait {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// What the consumer of the two watches does with a failure: logs it (each watch waits on its
/// own); with the bug put back, waits here too, holding back both.
async fn failed(node: &str, e: watcher::Error, failures: &mut u32) {
    if let watcher::Error::WatchError(s) = &e {
        if s.code == 410 {
            // The history compacted away: the watcher lists again (Restarted when done).
            tracing::debug!(node, "block or pool watch expired; listing again");
            return;
        }
    }
    tracing::debug!(node, error = %e, "block or pool watch broke; resuming");
    if crate::bugs::on(crate::bugs::Bug::WatchesWaitTogether) {
        *failures += 1;
        let wait = Duration::from_millis(250 << (*failures).min(3));
        tokio::time::sleep(crate::cluster::jitter(wait)).await;
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
        // Each watcher resumes from where it was, after its own wait.
        let blocks = watcher(
            self.watch_blocks.clone(),
            config().labels(&format!("{NODE_LABEL}={node}")),
        )
        .backoff(RetryWait::default())
        .map(|e| e.map(block_event));
        let pools = watcher(self.watch_pools.clone(), config())
            .backoff(RetryWait::default())
            .map(|e| e.map(pool_event));
        let mut both = std::pin::pin!(futures::stream::select(blocks, pools));
        let mut failures = 0u32;
        while let Some(event) = both.next().await {
            match event {
                Ok(Some(w)) => {
                    failures = 0;
                    seen(w)
                }
                Ok(None) => failures = 0,
                Err(e) => failed(node, e, &mut failures).await,
            }
        }
        Err(ClusterError::Refused("the watch ended".into()))
    }
}
