//! etcd in memory, as cluster mode's store sees it over its v3 API: keys with their create and
//! mod revisions and versions, one revision for the whole store moved by every write (a txn's
//! writes share one), range reads (prefix, limit, keys only, count), transactions of compares
//! (a compare over a range holds for every key in it, or for the zero key when none is there,
//! as etcd evaluates it), leases on simulated time (granted, renewed, revoked, expired: their
//! keys deleted), the response header every answer carries (cluster id, revision), and a
//! restore from an older backup ([`Restore`]: as a new cluster, from a copy of the data
//! directory, or with the revision bumped past every one seen).
//!
//! Reads at a past revision answer from the present: the simulation's listings fit in one page
//! (a read pinned to a revision happens only between the pages of a longer one).
//!
//! Every change is kept as a watch hears it (a put with the key as written, a delete with the
//! key and its revision) until a compaction; a restore keeps the history up to the restored
//! revision (see [`crate::watch`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ipool_proto::etcd::etcdserverpb as pb;
use ipool_proto::etcd::mvccpb::{event::EventType, Event, KeyValue};
use ipool_server::cluster::etcd::client::{Call, Reply};
use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::request_op::Request;
use pb::response_op::Response;
use tokio::time::Instant;

struct Lease {
    ttl: i64,
    expires: Instant,
    keys: BTreeSet<Vec<u8>>,
}

/// How a backup is restored.
#[derive(Clone, Copy, Debug)]
pub enum Restore {
    /// `etcdctl snapshot restore` as a new cluster, with an id of its own.
    NewCluster(u64),
    /// The data directory copied back: the same cluster id, the revision of the backup.
    DataCopied,
    /// `etcdutl snapshot restore --bump-revision N --mark-compacted` into the same cluster, as
    /// Kubernetes' documentation advises: the revision moved on past every one a client saw,
    /// the history compacted away.
    Bumped(i64),
}

/// A lease as a backup holds it: its id, TTL and keys.
type SavedLease = (i64, i64, BTreeSet<Vec<u8>>);

/// The whole state, as a backup holds it.
#[derive(Clone)]
struct Data {
    revision: i64,
    kv: BTreeMap<Vec<u8>, KeyValue>,
}

pub struct Etcd {
    cluster_id: u64,
    data: Data,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
    /// A backup (a snapshot of the keys and of the leases: their TTLs and keys), for a
    /// restore.
    backup: Option<(Data, Vec<SavedLease>)>,
    /// Writes applied so far (requests that changed something).
    pub writes: u64,
    /// Every change since the last compaction, oldest first (each event's `kv.mod_revision`
    /// is its revision).
    history: Vec<Event>,
    /// The revision compacted up to: a watch from it or before is told so.
    compacted: i64,
}

pub(crate) fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        _ => key >= start && key < end,
    }
}

fn status(code: tonic::Code, message: &str) -> tonic::Status {
    tonic::Status::new(code, message.to_string())
}

impl Etcd {
    pub fn new(cluster_id: u64) -> Etcd {
        Etcd {
            cluster_id,
            data: Data {
                revision: 1,
                kv: BTreeMap::new(),
            },
            leases: BTreeMap::new(),
            next_lease: 0x1000,
            backup: None,
            writes: 0,
            history: Vec::new(),
            compacted: 0,
        }
    }

    pub(crate) fn header(&self) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: 1,
            revision: self.data.revision,
            raft_term: 1,
        })
    }

    /// Whether `key` is there now.
    pub fn has_key(&self, key: &[u8]) -> bool {
        self.data.kv.contains_key(key)
    }

    /// The keys now (for the checker).
    pub fn keys(&self) -> impl Iterator<Item = (&Vec<u8>, &KeyValue)> {
        self.data.kv.iter()
    }

    /// Whether lease `id` carries a node's `alive` key (the lease that holds a name).
    pub fn holds_a_name(&self, id: i64) -> bool {
        self.leases
            .get(&id)
            .is_some_and(|l| l.keys.iter().any(|k| k.ends_with(b"/alive")))
    }

    /// When lease `id` was granted or last renewed (None: no such lease).
    pub fn lease_refreshed(&self, id: i64) -> Option<Instant> {
        let l = self.leases.get(&id)?;
        let ttl = std::time::Duration::from_secs(u64::try_from(l.ttl).unwrap_or(0));
        l.expires.checked_sub(ttl)
    }

    /// When lease `id` runs out unless renewed (None: no lease, the key stays).
    pub fn lease_expiry(&self, id: i64) -> Option<Instant> {
        match id {
            0 => None,
            id => Some(
                self.leases
                    .get(&id)
                    .map_or_else(Instant::now, |l| l.expires),
            ),
        }
    }

    pub fn revision(&self) -> i64 {
        self.data.revision
    }

    /// The changes to keys in `[key, end)` (etcd's range) after revision `after`, oldest first.
    pub fn events_after(&self, key: &[u8], end: &[u8], after: i64) -> Vec<Event> {
        let from = self
            .history
            .partition_point(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision) <= after);
        self.history[from..]
            .iter()
            .filter(|e| e.kv.as_ref().is_some_and(|kv| in_range(&kv.key, key, end)))
            .cloned()
            .collect()
    }

    /// Forgets the history up to now (etcd's compaction at the current revision).
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.data.revision;
    }

    /// The revision compacted up to.
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    fn deleted(&mut self, key: Vec<u8>, rev: i64) {
        self.history.push(Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key,
                mod_revision: rev,
                ..KeyValue::default()
            }),
        });
    }

    /// Expires the leases past their time: their keys go, in one revision.
    pub fn expire(&mut self, now: Instant) {
        let gone: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.revoke(id);
        }
    }

    fn revoke(&mut self, id: i64) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        let mut changed = false;
        let rev = self.data.revision + 1;
        for k in lease.keys {
            if self.data.kv.remove(&k).is_some() {
                self.deleted(k, rev);
                changed = true;
            }
        }
        if changed {
            self.data.revision += 1;
            self.writes += 1;
        }
        true
    }

    /// Keeps a backup of the keys as they are now.
    pub fn back_up(&mut self) {
        let leases = self
            .leases
            .iter()
            .map(|(id, l)| (*id, l.ttl, l.keys.clone()))
            .collect();
        self.backup = Some((self.data.clone(), leases));
    }

    /// The revision of the last backup, if any.
    pub fn backup_revision(&self) -> Option<i64> {
        self.backup.as_ref().map(|(d, _)| d.revision)
    }

    /// Whether the last backup has `key`: None without a backup.
    pub fn backed_up(&self, key: &[u8]) -> Option<bool> {
        self.backup.as_ref().map(|(d, _)| d.kv.contains_key(key))
    }

    /// Restores the last backup (if any) at `now`: the keys, the revision and the leases as
    /// they were (each lease's TTL starting again, as etcd's lessor does when a restored member
    /// leads). How: [`Restore`].
    pub fn restore(&mut self, how: Restore, now: Instant) -> bool {
        let Some((data, leases)) = self.backup.clone() else {
            return false;
        };
        self.data = data;
        let rev = self.data.revision;
        self.history
            .retain(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision <= rev));
        self.compacted = self.compacted.min(rev);
        match how {
            Restore::NewCluster(id) => self.cluster_id = id,
            Restore::DataCopied => {}
            Restore::Bumped(by) => {
                // `--mark-compacted`: every revision up to the bumped one is gone for watches.
                self.data.revision += by;
                self.compacted = self.data.revision;
                self.history.clear();
            }
        }
        self.leases = leases
            .into_iter()
            .map(|(id, ttl, keys)| {
                let expires = now + Duration::from_secs(ttl.max(1) as u64);
                (id, Lease { ttl, expires, keys })
            })
            .collect();
        true
    }

    /// Applies `call` at `now`, as etcd would.
    pub fn apply(&mut self, call: &Call, now: Instant) -> Result<Reply, tonic::Status> {
        self.expire(now);
        Ok(match call {
            Call::Range(r) => Reply::Range(self.range(r)),
            Call::Put(r) => {
                let rev = self.data.revision + 1;
                self.put(r, rev)?;
                self.data.revision = rev;
                self.writes += 1;
                Reply::Put(pb::PutResponse {
                    header: self.header(),
                    prev_kv: None,
                })
            }
            Call::DeleteRange(r) => {
                let rev = self.data.revision + 1;
                let deleted = self.delete(r, rev);
                if deleted > 0 {
                    self.data.revision = rev;
                    self.writes += 1;
                }
                Reply::DeleteRange(pb::DeleteRangeResponse {
                    header: self.header(),
                    deleted,
                    prev_kvs: Vec::new(),
                })
            }
            Call::Txn(t) => Reply::Txn(self.txn(t)?),
            Call::LeaseGrant(g) => {
                self.next_lease += 1;
                let id = self.next_lease;
                self.leases.insert(
                    id,
                    Lease {
                        ttl: g.ttl,
                        expires: now + Duration::from_secs(g.ttl.max(1) as u64),
                        keys: BTreeSet::new(),
                    },
                );
                Reply::LeaseGrant(pb::LeaseGrantResponse {
                    header: self.header(),
                    id,
                    ttl: g.ttl,
                    error: String::new(),
                })
            }
            Call::LeaseRevoke(r) => {
                if !self.revoke(r.id) {
                    return Err(status(
                        tonic::Code::NotFound,
                        "etcdserver: requested lease not found",
                    ));
                }
                Reply::LeaseRevoke(pb::LeaseRevokeResponse {
                    header: self.header(),
                })
            }
            Call::LeaseKeepAlive(k) => {
                let ttl = match self.leases.get_mut(&k.id) {
                    Some(l) => {
                        l.expires = now + Duration::from_secs(l.ttl.max(1) as u64);
                        l.ttl
                    }
                    None => 0,
                };
                Reply::LeaseKeepAlive(pb::LeaseKeepAliveResponse {
                    header: self.header(),
                    id: k.id,
                    ttl,
                })
            }
            Call::LeaseTimeToLive(t) => {
                let (ttl, granted) = match self.leases.get(&t.id) {
                    Some(l) => (
                        l.expires.saturating_duration_since(now).as_secs() as i64,
                        l.ttl,
                    ),
                    None => (-1, 0),
                };
                Reply::LeaseTimeToLive(pb::LeaseTimeToLiveResponse {
                    header: self.header(),
                    id: t.id,
                    ttl,
                    granted_ttl: granted,
                    keys: Vec::new(),
                })
            }
        })
    }

    fn range(&self, r: &pb::RangeRequest) -> pb::RangeResponse {
        let all: Vec<&KeyValue> = self
            .data
            .kv
            .range(r.key.clone()..)
            .take_while(|(k, _)| r.range_end.is_empty() || r.range_end == [0] || **k < r.range_end)
            .filter(|(k, _)| in_range(k, &r.key, &r.range_end))
            .map(|(_, v)| v)
            .collect();
        let count = all.len() as i64;
        let limit = if r.limit > 0 {
            r.limit as usize
        } else {
            usize::MAX
        };
        let kvs = match r.count_only {
            true => Vec::new(),
            false => all
                .iter()
                .take(limit)
                .map(|kv| KeyValue {
                    value: if r.keys_only {
                        Vec::new()
                    } else {
                        kv.value.clone()
                    },
                    ..(*kv).clone()
                })
                .collect(),
        };
        pb::RangeResponse {
            header: self.header(),
            more: all.len() > limit,
            kvs,
            count,
        }
    }

    fn put(&mut self, r: &pb::PutRequest, rev: i64) -> Result<(), tonic::Status> {
        if r.lease != 0 && !self.leases.contains_key(&r.lease) {
            return Err(status(
                tonic::Code::NotFound,
                "etcdserver: requested lease not found",
            ));
        }
        let old = self.data.kv.get(&r.key).cloned();
        if let Some(o) = &old {
            if o.lease != 0 && o.lease != r.lease {
                if let Some(l) = self.leases.get_mut(&o.lease) {
                    l.keys.remove(&r.key);
                }
            }
        }
        if r.lease != 0 {
            if let Some(l) = self.leases.get_mut(&r.lease) {
                l.keys.insert(r.key.clone());
            }
        }
        let kv = KeyValue {
            key: r.key.clone(),
            create_revision: old.as_ref().map_or(rev, |o| o.create_revision),
            mod_revision: rev,
            version: old.as_ref().map_or(1, |o| o.version + 1),
            value: r.value.clone(),
            lease: r.lease,
        };
        self.history.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv.clone()),
        });
        self.data.kv.insert(r.key.clone(), kv);
        Ok(())
    }

    fn delete(&mut self, r: &pb::DeleteRangeRequest, rev: i64) -> i64 {
        let keys: Vec<Vec<u8>> = self
            .data
            .kv
            .keys()
            .filter(|k| in_range(k, &r.key, &r.range_end))
            .cloned()
            .collect();
        for k in &keys {
            if let Some(kv) = self.data.kv.remove(k) {
                if let Some(l) = self.leases.get_mut(&kv.lease) {
                    l.keys.remove(k);
                }
                self.deleted(k.clone(), rev);
            }
        }
        keys.len() as i64
    }

    fn holds(&self, c: &pb::Compare) -> bool {
        let one = |kv: &KeyValue| -> bool {
            let ord = match c.target_union.as_ref() {
                Some(TargetUnion::Version(v)) => kv.version.cmp(v),
                Some(TargetUnion::CreateRevision(v)) => kv.create_revision.cmp(v),
                Some(TargetUnion::ModRevision(v)) => kv.mod_revision.cmp(v),
                Some(TargetUnion::Value(v)) => kv.value.as_slice().cmp(v.as_slice()),
                Some(TargetUnion::Lease(v)) => kv.lease.cmp(v),
                None => return false,
            };
            match CompareResult::try_from(c.result) {
                Ok(CompareResult::Equal) => ord.is_eq(),
                Ok(CompareResult::Greater) => ord.is_gt(),
                Ok(CompareResult::Less) => ord.is_lt(),
                Ok(CompareResult::NotEqual) => ord.is_ne(),
                Err(_) => false,
            }
        };
        let found: Vec<&KeyValue> = self
            .data
            .kv
            .iter()
            .filter(|(k, _)| in_range(k, &c.key, &c.range_end))
            .map(|(_, v)| v)
            .collect();
        if found.is_empty() {
            if CompareTarget::try_from(c.target) == Ok(CompareTarget::Value) {
                return false;
            }
            return one(&KeyValue::default());
        }
        found.into_iter().all(one)
    }

    fn txn(&mut self, t: &pb::TxnRequest) -> Result<pb::TxnResponse, tonic::Status> {
        // As etcd checks a request before it applies it: a key written twice in a branch.
        for ops in [&t.success, &t.failure] {
            let mut keys = BTreeSet::new();
            for op in ops {
                let key = match &op.request {
                    Some(Request::RequestPut(p)) => &p.key,
                    Some(Request::RequestDeleteRange(d)) => &d.key,
                    _ => continue,
                };
                if !keys.insert(key.clone()) {
                    return Err(status(
                        tonic::Code::InvalidArgument,
                        "etcdserver: duplicate key given in txn request",
                    ));
                }
            }
        }
        let succeeded = t.compare.iter().all(|c| self.holds(c));
        let ops = if succeeded { &t.success } else { &t.failure };
        let rev = self.data.revision + 1;
        let mut changed = false;
        let mut responses = Vec::new();
        for op in ops {
            let response = match &op.request {
                Some(Request::RequestRange(r)) => Response::ResponseRange(self.range(r)),
                Some(Request::RequestPut(p)) => {
                    self.put(p, rev)?;
                    changed = true;
                    Response::ResponsePut(pb::PutResponse {
                        header: None,
                        prev_kv: None,
                    })
                }
                Some(Request::RequestDeleteRange(d)) => {
                    let deleted = self.delete(d, rev);
                    changed |= deleted > 0;
                    Response::ResponseDeleteRange(pb::DeleteRangeResponse {
                        header: None,
                        deleted,
                        prev_kvs: Vec::new(),
                    })
                }
                Some(Request::RequestTxn(_)) | None => {
                    return Err(status(
                        tonic::Code::Unimplemented,
                        "nested transactions are not simulated",
                    ))
                }
            };
            responses.push(pb::ResponseOp {
                response: Some(response),
            });
        }
        if changed {
            self.data.revision = rev;
            self.writes += 1;
        }
        Ok(pb::TxnResponse {
            header: self.header(),
            succeeded,
            responses,
        })
    }
}
