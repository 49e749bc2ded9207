//! The store's watches, simulated: etcd's Watch (a create answered `created`, then events in
//! revision order, progress notifications while nothing changes, a cancel with the compacted
//! revision for a watch from before a compaction) and the apiserver's watches (`watch=true`:
//! a stream of JSON lines, each event as the watch cache decides it for the label selector, a
//! 410 `ERROR` for a resourceVersion older than the history kept).
//!
//! A watch is made by a request like any other (delivered, failed, lost, dropped, late); once
//! made it stays open in [`Watches`] and hears nothing until the driver says: a step hears
//! one watch's news (everything since what it last heard, or a progress notification), cuts
//! one (the stream breaks mid-way), or compacts the history (a watch behind it is told, a
//! watch made again from before it too). A watch's news are thus delayed by any number of
//! steps, cut, and replayed (a watch made again from the revision after the last it heard).
//! A connection cut ends its sender's watches at once; an etcd restored from a backup ends
//! every one (its members restart).

use bytes::Bytes;
use ipnet::IpNet;
use ipool_proto::etcd::etcdserverpb as pb;
use ipool_proto::etcd::mvccpb::event::EventType;
use ipool_server::cluster::etcd::client::EtcdError;
use ipool_testkit::apiserver::{check_selector, status, watch_event, watch_target, Answer};
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::etcd::Etcd;

/// What an etcd watch's client reads.
pub type EtcdStream = UnboundedReceiver<Result<pb::WatchResponse, EtcdError>>;
/// What an apiserver watch's client reads: the body's chunks, or the connection broken.
pub type ApiStream = UnboundedReceiver<Result<Bytes, String>>;

enum Target {
    Etcd {
        key: Vec<u8>,
        end: Vec<u8>,
        id: i64,
        feed: UnboundedSender<Result<pb::WatchResponse, EtcdError>>,
    },
    Api {
        resource: String,
        ns: String,
        selector: String,
        feed: UnboundedSender<Result<Bytes, String>>,
    },
}

/// Block `block` of slot `slot`'s node: its daemon `daemon` was told at `at` that it is no
/// longer the node's.
pub(crate) struct HeardGone {
    pub slot: usize,
    pub daemon: u64,
    pub block: IpNet,
    pub at: tokio::time::Instant,
}

/// An open watch.
pub struct Open {
    /// Who made it.
    pub from: usize,
    /// The revision (resourceVersion) it heard up to.
    after: u64,
    target: Target,
}

/// What hearing a watch's news came to.
pub struct Heard {
    /// Events sent.
    pub events: usize,
    /// Blocks it told its node are no longer the node's (a node's index entry deleted on
    /// etcd; an IPBlock DELETED for the node's label selector).
    pub gone: Vec<IpNet>,
}

/// The open watches, oldest first.
#[derive(Default)]
pub struct Watches {
    open: Vec<Open>,
    next_id: i64,
}

/// etcd's block index key `.../nodes/<node>/blocks/<pool>/<addr>-<len>`: the block.
fn index_block(key: &[u8]) -> Option<IpNet> {
    let key = std::str::from_utf8(key).ok()?;
    let (_, rest) = key.split_once("/nodes/")?;
    let (_, rest) = rest.split_once("/blocks/")?;
    let (_, part) = rest.split_once('/')?;
    let (addr, len) = part.rsplit_once('-')?;
    IpNet::new(addr.parse().ok()?, len.parse().ok()?).ok()
}

impl Watches {
    /// Opens an etcd watch as `create` asks: what its client reads.
    pub fn open_etcd(
        &mut self,
        e: &Etcd,
        from: usize,
        create: &pb::WatchCreateRequest,
    ) -> EtcdStream {
        let (tx, rx) = unbounded_channel();
        self.next_id += 1;
        let id = self.next_id;
        let _ = tx.send(Ok(pb::WatchResponse {
            header: e.header(),
            watch_id: id,
            created: true,
            ..Default::default()
        }));
        let after = match create.start_revision {
            0 => e.revision(),
            r => r - 1,
        };
        if after < e.compacted() {
            let _ = tx.send(Ok(compacted(e, id)));
            return rx;
        }
        self.open.push(Open {
            from,
            after: after.max(0) as u64,
            target: Target::Etcd {
                key: create.key.clone(),
                end: create.range_end.clone(),
                id,
                feed: tx,
            },
        });
        rx
    }

    /// Opens an apiserver watch of `path` with the query `q` (history kept from `oldest` on):
    /// what its client reads, or the answer that refuses it.
    pub fn open_api(
        &mut self,
        rv: u64,
        oldest: u64,
        from: usize,
        path: &str,
        q: &std::collections::BTreeMap<String, String>,
    ) -> Result<ApiStream, Answer> {
        let (resource, ns) =
            watch_target(path).ok_or_else(|| status(404, "NotFound", "no such path"))?;
        let selector = q.get("labelSelector").cloned().unwrap_or_default();
        if let Some(bad) = check_selector(&selector) {
            return Err(bad);
        }
        let after = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0)
            .unwrap_or(rv);
        let (tx, rx) = unbounded_channel();
        if after + 1 < oldest {
            let _ = tx.send(Ok(expired()));
            return Ok(rx);
        }
        self.open.push(Open {
            from,
            after,
            target: Target::Api {
                resource,
                ns,
                selector,
                feed: tx,
            },
        });
        Ok(rx)
    }

    /// The open watches whose clients still read (a dead daemon's are forgotten).
    pub fn count(&mut self) -> usize {
        self.open.retain(|o| match &o.target {
            Target::Etcd { feed, .. } => !feed.is_closed(),
            Target::Api { feed, .. } => !feed.is_closed(),
        });
        self.open.len()
    }

    /// The sender of the `i`th open watch.
    pub fn from(&self, i: usize) -> Option<usize> {
        self.open.get(i).map(|o| o.from)
    }

    /// Breaks watch `i`'s stream mid-way (its connection dropped).
    pub fn cut(&mut self, i: usize) {
        if i >= self.open.len() {
            return;
        }
        match self.open.remove(i).target {
            Target::Etcd { feed, .. } => {
                let _ = feed.send(Err(EtcdError::Status(tonic::Status::unavailable(
                    "simulated: the watch's connection broke",
                ))));
            }
            Target::Api { feed, .. } => {
                let _ = feed.send(Err("simulated: the watch's connection broke".into()));
            }
        }
    }

    /// Breaks every watch of `from` (None: every watch).
    pub fn cut_from(&mut self, from: Option<usize>) {
        let mut i = 0;
        while i < self.open.len() {
            match from.is_none_or(|f| self.open[i].from == f) {
                true => self.cut(i),
                false => i += 1,
            }
        }
    }
}

fn compacted(e: &Etcd, id: i64) -> pb::WatchResponse {
    pb::WatchResponse {
        header: e.header(),
        watch_id: id,
        compact_revision: e.compacted(),
        canceled: true,
        cancel_reason: "mvcc: required revision has been compacted".into(),
        ..Default::default()
    }
}

/// The apiserver's answer to a watch from before the history it keeps.
fn expired() -> Bytes {
    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
        "metadata": {}, "status": "Failure", "message": "too old resource version",
        "reason": "Expired", "code": 410}});
    Bytes::from(format!("{gone}\n"))
}

mod hear;

#[cfg(test)]
mod tests;
