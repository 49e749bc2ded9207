//! The heartbeat that holds this node's name: taken, renewed every third of its TTL, started
//! over when lost, and given up at a clean stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{ClusterNode, Identity};
use crate::cluster::vocab::{Acquired, Alive, ClusterError, Heartbeat};

impl ClusterNode {
    /// Keeps this node's heartbeat until aborted: takes the node's name (or waits for
    /// another daemon's lease to go), renews both leases every third of the TTL, and starts
    /// over when the lease is gone. The store's failures are retried.
    pub async fn heartbeat(self: Arc<Self>) {
        let ttl = self.settings.heartbeat_ttl_secs;
        let every = Duration::from_secs(ttl / 3).max(Duration::from_secs(1));
        // Before the first heartbeat writes `seen`: whether this node ran before decides
        // whether its blocks must be found and indexed.
        while let Err(e) = self.ensure_index().await {
            if !matches!(self.identity(), Identity::Held) {
                self.set_identity(Identity::Starting(Some(e.to_string())));
            }
            tokio::time::sleep(crate::cluster::jitter(Duration::from_secs(2))).await;
        }
        let me = Alive {
            instance: self.instance.clone(),
            at_ms: 0,
            fence_secs: self.settings.fence(),
            k8s_node: self.k8s_node.get().cloned(),
        };
        let mut wait = Duration::from_secs(1);
        loop {
            let sent = Instant::now();
            let (node, me) = (
                self.name.clone(),
                Alive {
                    at_ms: crate::cluster::vocab::now_ms(),
                    ..me.clone()
                },
            );
            let started = self
                .call("heartbeat", |s| async move {
                    s.urgent()
                        .start_heartbeat(&node, &me, ttl, every.as_secs())
                        .await
                })
                .await;
            match started {
                Ok(Acquired::Held(beat)) => {
                    wait = Duration::from_secs(1);
                    self.renewed(sent);
                    self.set_identity(Identity::Held);
                    *self.held.lock().expect("held lock") = Some(beat.clone());
                    self.keep(&beat, every).await;
                    *self.held.lock().expect("held lock") = None;
                }
                Ok(Acquired::Taken { instance, ttl_left }) => {
                    self.set_identity(Identity::Taken { instance });
                    let left = Duration::from_secs(ttl_left.clamp(1, ttl as i64) as u64);
                    tokio::time::sleep(crate::cluster::jitter(left.min(every))).await;
                }
                Err(e) => {
                    if !matches!(self.identity(), Identity::Held) {
                        self.set_identity(Identity::Starting(Some(e.to_string())));
                    }
                    tracing::debug!(node = %self.name, error = %e, "cannot start the heartbeat; retrying");
                    tokio::time::sleep(crate::cluster::jitter(wait)).await;
                    wait = (wait * 2).min(every);
                }
            }
        }
    }

    /// Reports this node's addresses in use to the store (`ipoolctl cluster nodes`), while
    /// it holds its name (else nothing is written).
    pub async fn report_in_use(&self, in_use: u64) -> Result<(), ClusterError> {
        let Some(beat) = self.held.lock().expect("held lock").clone() else {
            return Ok(());
        };
        let name = self.name.clone();
        self.call("report", |s| async move {
            s.report_in_use(&name, &beat, in_use).await
        })
        .await
    }

    /// Gives the node's name up at a clean stop (call it once the heartbeat task is stopped,
    /// and nothing is handed out any more): the node is away from now on, as release-node
    /// sees it, and another daemon may take the name at once. True if a name was held and
    /// given up.
    pub async fn give_up_name(&self) -> Result<bool, ClusterError> {
        let Some(beat) = self.held.lock().expect("held lock").take() else {
            return Ok(false);
        };
        self.set_identity(Identity::Starting(Some("stopped".into())));
        self.call("heartbeat", |s| async move {
            s.urgent().stop_heartbeat(&beat).await
        })
        .await?;
        tracing::info!(node = %self.name, instance = %self.instance, store = self.store_name(), "gave up its node name (a clean stop)");
        Ok(true)
    }

    /// Renews `beat` until its lease is gone (or, the store silent, surely gone).
    async fn keep(&self, beat: &Heartbeat, every: Duration) {
        let ttl = Duration::from_secs(self.settings.heartbeat_ttl_secs);
        let mut last_ok = Instant::now();
        let mut pause = crate::cluster::jitter(every);
        // What the watch had said of the name when it was last read back (taking it was the
        // first read).
        let mut checked = self.name_check(u64::MAX).1;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                // A store reset seen: the name is checked at once.
                _ = self.renew_now.notified() => {}
            }
            let sent = Instant::now();
            let b = beat.clone();
            let (check, news) = self.name_check(checked);
            let holds = self.holds_to_confirm();
            let r = self
                .call("heartbeat", |s| async move {
                    let s = s.urgent();
                    s.confirm_holds(&b, holds).await?;
                    s.renew_heartbeat(&b, check).await
                })
                .await;
            match r {
                Ok(()) => {
                    if check {
                        checked = news;
                    }
                    self.renewed(sent);
                    last_ok = sent;
                    pause = crate::cluster::jitter(every);
                }
                Err(e) if e.is_unreachable() && last_ok.elapsed() < ttl => {
                    if last_ok.elapsed() > self.fence() {
                        self.metrics.cluster.fenced.set(1);
                    }
                    tracing::warn!(node = %self.name, error = %e, "heartbeat not renewed; retrying");
                    pause = Duration::from_secs(1);
                }
                Err(e) => {
                    self.metrics.cluster.fenced.set(1);
                    tracing::warn!(node = %self.name, error = %e, "heartbeat lost; taking the node's name again");
                    return;
                }
            }
        }
    }
}
