//! [`EtcdStore`]'s watches ([`WatchStore`]): the node's keys (`nodes/<node>/`: an index
//! entry deleted is a block given back, released or found another's; the `alive` key written
//! or deleted is the name to check, [`Watched::Name`]) and the pools (`pools/`). Each is made
//! again after a break from the revision after the last it reported (etcd answers progress
//! notifications while nothing changes, so that revision keeps up); one whose revision was
//! compacted away, or that etcd no longer has (restored from a backup: its revision went
//! back), starts from now, as [`Watched::Restarted`]. The watch of the node's keys says when it
//! is on and when it broke ([`Watched::NameWatch`]): while it is on, the heartbeat's renewals
//! need not read `alive` back.

use std::time::Duration;

use futures::StreamExt;
use ipool_proto::etcd::etcdserverpb as pb;
use ipool_proto::etcd::mvccpb::event::EventType;

use super::blocks::parse_block_key;
use super::request::prefix_end;
use super::EtcdStore;
use crate::cluster::datastore::{WatchStore, Watched};
use crate::cluster::vocab::ClusterError;

/// The longest wait before a broken watch is made again: news are heard within a few seconds
/// of etcd coming back (one small request per node meanwhile).
const RETRY_MAX: Duration = Duration::from_secs(2);

impl EtcdStore {
    /// Watches the keys under `prefix` for ever, each event `what` makes something of reported
    /// to `seen`.
    async fn watch_prefix(
        &self,
        prefix: String,
        what: &(dyn Fn(&str, EventType) -> Option<Watched> + Send + Sync),
        seen: &(dyn Fn(Watched) + Send + Sync),
        name: bool,
    ) {
        // The next revision to hear of; 0: from now (what came before is not known).
        let mut next = 0i64;
        let mut wait = Duration::from_millis(500);
        loop {
            let create = pb::WatchCreateRequest {
                key: prefix.clone().into_bytes(),
                range_end: prefix_end(prefix.as_bytes()),
                start_revision: next,
                progress_notify: true,
            };
            let mut answers = match self.client.watch(create).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(%prefix, error = %e, "cannot watch; trying again");
                    tokio::time::sleep(crate::cluster::jitter(wait)).await;
                    wait = (wait * 2).min(RETRY_MAX);
                    continue;
                }
            };
            while let Some(answer) = answers.next().await {
                let a = match answer {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!(%prefix, error = %e, "the watch broke; making it again");
                        break;
                    }
                };
                wait = Duration::from_millis(500);
                if a.compact_revision > 0 || a.canceled {
                    // Compacted away (or cancelled by etcd): made again from now, which says
                    // so (a restart) once created.
                    tracing::info!(%prefix, compacted = a.compact_revision, reason = %a.cancel_reason, "a watch's history is gone: watching from now");
                    next = 0;
                    break;
                }
                if a.created {
                    let at = a.header.as_ref().map_or(0, |h| h.revision);
                    if next > at + 1 {
                        // etcd no longer has the revisions this watch heard (restored from a
                        // backup): what it says from here is not what came after them.
                        tracing::info!(%prefix, next, revision = at, "etcd's revision went back: watching from now");
                        next = 0;
                        break;
                    }
                    if name {
                        seen(Watched::NameWatch(true));
                    }
                    if next == 0 {
                        // From now: whatever changed before is not known here.
                        next = a.header.as_ref().map_or(0, |h| h.revision + 1);
                        seen(Watched::Restarted);
                    }
                    continue;
                }
                for ev in &a.events {
                    let Some(kv) = &ev.kv else { continue };
                    let kind = EventType::try_from(ev.r#type).unwrap_or(EventType::Put);
                    if let Some(w) = what(&String::from_utf8_lossy(&kv.key), kind) {
                        seen(w);
                    }
                    next = next.max(kv.mod_revision + 1);
                }
                if a.events.is_empty() {
                    // A progress notification: every change up to its revision was sent.
                    if let Some(h) = &a.header {
                        next = next.max(h.revision + 1);
                    }
                }
            }
            // The stream given up is closed now (etcd cancels its watch), not left unread
            // while the next is waited for.
            drop(answers);
            if name {
                seen(Watched::NameWatch(false));
            }
            tokio::time::sleep(crate::cluster::jitter(wait)).await;
            wait = (wait * 2).min(RETRY_MAX);
        }
    }
}

#[async_trait::async_trait]
impl WatchStore for EtcdStore {
    async fn watch(
        &self,
        node: &str,
        seen: &(dyn Fn(Watched) + Send + Sync),
    ) -> Result<(), ClusterError> {
        let index = self.index_prefix(node, None);
        let (mine, alive) = (self.key(&format!("nodes/{node}/")), self.alive_key(node));
        let pools = self.pools_prefix();
        let gone = |key: &str, kind: EventType| match kind {
            _ if key == alive => Some(Watched::Name),
            EventType::Delete => {
                parse_block_key(&index, key)
                    .ok()
                    .map(|(pool, block)| Watched::BlockGone {
                        pool: pool.to_string(),
                        block,
                    })
            }
            EventType::Put => None,
        };
        let pool = |key: &str, _: EventType| {
            key.strip_prefix(&pools)
                .filter(|n| !n.is_empty())
                .map(|n| Watched::Pool(n.to_string()))
        };
        tokio::join!(
            self.watch_prefix(mine, &gone, seen, true),
            self.watch_prefix(pools.clone(), &pool, seen, false)
        );
        Err(ClusterError::Refused("the watches ended".into()))
    }
}
