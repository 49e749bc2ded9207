//! The store the simulated cluster shares: an in-memory etcd or an in-memory apiserver (the
//! tests' own rules, `ipool_testkit::apiserver`), what a delivered request does to it, and its
//! blocks as the checker reads them.

use bytes::Bytes;
use ipnet::IpNet;
use ipool_proto::etcd::etcdserverpb::request_op::Request as RequestOp;
use ipool_proto::etcd::mvccpb::KeyValue;
use ipool_server::cluster::etcd::client::{Call, EtcdError, Reply};
use std::sync::Arc;

use ipool_testkit::access::{Access, Attributes, UserInfo};
use ipool_testkit::apiserver::{url_pairs, Objects};
use tokio::time::Instant;

use crate::check::StoreBlock;
use crate::etcd::Etcd;
use crate::net::{Back, Request, Wire};
use crate::watch::Watches;
use crate::StoreKind;

/// What becomes of a request the driver takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Applied and answered.
    Answer,
    /// Not applied; an error answered (the store refused it, or a proxy did).
    Fail,
    /// Applied; the answer lost on the way back (the caller sees an error).
    Lose,
    /// Never applied, never answered: the caller waits out its deadline.
    Drop,
}

/// What a delivery did, for the checker.
#[derive(Clone, Debug, Default)]
pub struct Delivered {
    /// It renewed (or took) its sender's node name: the store heard the node.
    pub renewed: bool,
    /// When the store heard the node, as far as its name's lease goes: now for a renewal; for
    /// the name taken on etcd, when the lease it was put on was granted or last renewed (the
    /// key lapses a TTL after that, not after the put).
    pub heard: Option<Instant>,
    /// Its answer carries the store's header (etcd: its cluster id and revision).
    pub headed: bool,
    /// It is etcd's answer to a read or a transaction (which reads the node's witness).
    pub keys: bool,
    /// The apiserver refused it by deploy/'s RBAC or admission policies: what, as whom, why.
    pub denied: Option<String>,
}

/// A node name's holder in the store.
#[derive(Clone, Debug)]
pub struct Holder {
    pub node: String,
    pub instance: String,
    /// When its lease runs out unless renewed (etcd); None on the Kubernetes API.
    pub until: Option<Instant>,
}

impl Holder {
    /// It holds the name at `at`.
    pub fn holds_at(&self, at: Instant) -> bool {
        self.until.is_none_or(|u| u > at)
    }
}

/// Each block's (pool, revision of the pool it was claimed from), and each pool's revision.
pub type PoolRevisions = (
    std::collections::BTreeMap<IpNet, (String, i64)>,
    std::collections::BTreeMap<String, i64>,
);

pub enum Shared {
    Etcd(Etcd),
    /// The apiserver's objects, how far its clock is from the wall (its replicas' clocks), and
    /// the oldest resourceVersion a watch may start after (its history kept from there).
    Api {
        objects: Objects,
        skew_secs: i64,
        oldest: u64,
        /// The RBAC and admission policies of deploy/cluster-kubernetes, each request held
        /// to them as its sender's identity (`crate::identity`).
        access: Arc<Access>,
    },
}

impl Shared {
    /// A store; the apiserver keeps its changes for watches when `watched`.
    pub fn new(kind: StoreKind, cluster_id: u64, watched: bool) -> Shared {
        match kind {
            StoreKind::Etcd => Shared::Etcd(Etcd::new(cluster_id)),
            StoreKind::Kube => Shared::Api {
                objects: Objects::new(watched),
                skew_secs: 0,
                oldest: 0,
                access: crate::identity::deployed(),
            },
        }
    }

    /// The `resourceVersion` the apiserver holds now for the object `path` names (None on
    /// etcd, or when it holds none).
    pub fn resource_version_at(&self, path: &str) -> Option<String> {
        let Shared::Api { objects, .. } = self else {
            return None;
        };
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (r, ns, n) = match parts.as_slice() {
            ["apis", _, _, "namespaces", ns, r, n, ..] => (*r, *ns, *n),
            ["apis", _, _, r, n, ..] => (*r, "", *n),
            ["api", _, "namespaces", ns, r, n, ..] => (*r, *ns, *n),
            ["api", _, r, n, ..] => (*r, "", *n),
            _ => return None,
        };
        let key = (r.to_string(), ns.to_string(), n.to_string());
        objects.objects.get(&key)?["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string)
    }

    /// Forgets the history watches are made from (etcd's compaction; the apiserver's history
    /// of changes moved past).
    pub fn compact(&mut self) {
        match self {
            Shared::Etcd(e) => e.compact(),
            Shared::Api {
                objects, oldest, ..
            } => {
                objects.events.clear();
                *oldest = objects.rv + 1;
            }
        }
    }

    /// Does to `req` what `fate` says, at `now` (`wall_ms`: the wall clock); what its sender
    /// learns and what the store heard (see [`Delivered`]). A watch made is one of `watches`
    /// (a watch whose answer is lost is never made: it lives only on its connection). On the
    /// Kubernetes API the request is `user`'s, held to deploy/'s RBAC and admission policies.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver(
        &mut self,
        req: Request,
        fate: Fate,
        now: Instant,
        wall_ms: u64,
        limbo: &mut Vec<tokio::sync::oneshot::Sender<Back>>,
        watches: &mut Watches,
        user: &UserInfo,
    ) -> Delivered {
        if fate == Fate::Drop {
            req.into_silence(limbo);
            return Delivered::default();
        }
        if let Some(back) = self.watch(&req, fate, watches) {
            req.answer(back);
            return Delivered::default();
        }
        let mut renewed = false;
        let mut heard = None;
        let mut denied = None;
        let back = match (&mut *self, &req.wire) {
            (Shared::Etcd(e), Wire::Etcd(call)) => match fate {
                Fate::Fail => Back::Etcd(Err(EtcdError::Status(tonic::Status::unavailable(
                    "simulated: etcd refused the request",
                )))),
                _ => {
                    let r = e.apply(call, now).map_err(EtcdError::Status);
                    renewed = match (call, &r) {
                        // The lease that holds the name (the seen key's is of days; after a
                        // restore, a lease may hold no key any more).
                        (Call::LeaseKeepAlive(_), Ok(Reply::LeaseKeepAlive(k))) => {
                            k.ttl > 0 && e.holds_a_name(k.id)
                        }
                        (Call::Txn(t), Ok(Reply::Txn(a))) if a.succeeded => {
                            let lease = t.success.iter().find_map(|op| match &op.request {
                                Some(RequestOp::RequestPut(p)) if p.key.ends_with(b"/alive") => {
                                    Some(p.lease)
                                }
                                _ => None,
                            });
                            if let Some(id) = lease {
                                heard = e.lease_refreshed(id);
                            }
                            lease.is_some()
                        }
                        _ => false,
                    };
                    match fate {
                        Fate::Lose => Back::Etcd(Err(EtcdError::Status(
                            tonic::Status::unavailable("simulated: the answer was lost"),
                        ))),
                        _ => Back::Etcd(r),
                    }
                }
            },
            (
                Shared::Api {
                    objects,
                    skew_secs,
                    access,
                    ..
                },
                Wire::Api {
                    method,
                    path,
                    query,
                    body,
                },
            ) => match fate {
                Fate::Fail => Back::Api(Ok((
                    500,
                    Bytes::from(
                        ipool_testkit::apiserver::status(500, "InternalError", "simulated")
                            .body
                            .to_string(),
                    ),
                ))),
                _ => {
                    let secs = (wall_ms / 1000) as i64 + *skew_secs;
                    let q = url_pairs(query);
                    // Authorized first (403), then admitted as it is written (422).
                    let forbidden = Attributes::of(method, path, &q)
                        .and_then(|at| access.authorize(user, &at).err());
                    let a = forbidden.unwrap_or_else(|| {
                        objects
                            .respond_as(Some((access, user)), method, path, &q, body, secs, true)
                            .unwrap_or_else(|| {
                                ipool_testkit::apiserver::status(404, "NotFound", "no such path")
                            })
                    });
                    let policy = a.body["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("ValidatingAdmissionPolicy"));
                    if a.status == 403 || (a.status == 422 && policy) {
                        denied = Some(format!(
                            "{method} {path} as {}: {} {}",
                            user.username, a.status, a.body["message"]
                        ));
                    }
                    renewed = matches!(method.as_str(), "PUT" | "POST")
                        && path.contains("/leases/")
                        && (200..300).contains(&a.status);
                    match fate {
                        Fate::Lose => Back::Api(Err("simulated: the answer was lost".into())),
                        _ => Back::Api(Ok((a.status, Bytes::from(a.body.to_string())))),
                    }
                }
            },
            _ => Back::Api(Err("simulated: a request for the other store".into())),
        };
        // An etcd error carries no header: nothing is learned of the store from it.
        let headed = matches!(&back, Back::Etcd(Ok(_)) | Back::Api(_));
        let keys = matches!(&back, Back::Etcd(Ok(Reply::Range(_) | Reply::Txn(_))));
        req.answer(back);
        Delivered {
            renewed,
            heard: renewed.then(|| heard.unwrap_or(now)),
            headed,
            keys,
            denied,
        }
    }

    /// What a request that makes a watch comes to (None: it makes none).
    fn watch(&mut self, req: &Request, fate: Fate, watches: &mut Watches) -> Option<Back> {
        let made = fate == Fate::Answer;
        match (&*self, &req.wire) {
            (Shared::Etcd(e), Wire::EtcdWatch(create)) => Some(Back::EtcdWatch(match made {
                true => Ok(watches.open_etcd(e, req.from, create)),
                false => Err(EtcdError::Status(tonic::Status::unavailable(
                    "simulated: the watch was not made",
                ))),
            })),
            (
                Shared::Api {
                    objects, oldest, ..
                },
                Wire::Api {
                    method,
                    path,
                    query,
                    ..
                },
            ) => {
                let q = url_pairs(query);
                let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
                if method != "GET" || !watching {
                    return None;
                }
                if !made {
                    return Some(Back::Api(Err("simulated: the watch was not made".into())));
                }
                Some(
                    match watches.open_api(objects.rv, *oldest, req.from, path, &q) {
                        Ok(stream) => Back::ApiWatch(stream),
                        Err(a) => Back::Api(Ok((a.status, Bytes::from(a.body.to_string())))),
                    },
                )
            }
            _ => None,
        }
    }

    /// Leases past their time end (etcd's keys on them go).
    pub fn expire(&mut self, now: Instant) {
        if let Shared::Etcd(e) = self {
            e.expire(now);
        }
    }

    /// etcd's block keys: (pool, CIDR, the key).
    fn etcd_blocks(e: &Etcd) -> impl Iterator<Item = (String, IpNet, &KeyValue)> + '_ {
        e.keys().filter_map(|(k, kv)| {
            let key = std::str::from_utf8(k).ok()?;
            let (pool, part) = key.strip_prefix("/ipool/v1/blocks/")?.split_once('/')?;
            let (addr, len) = part.rsplit_once('-')?;
            let net = IpNet::new(addr.parse().ok()?, len.parse().ok()?).ok()?;
            Some((pool.to_string(), net, kv))
        })
    }

    /// The apiserver's IPBlock objects: (CIDR, the object).
    fn api_blocks(objects: &Objects) -> impl Iterator<Item = (IpNet, &serde_json::Value)> + '_ {
        objects
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "ipblocks")
            .filter_map(|(_, o)| Some((o["spec"]["cidr"].as_str()?.parse().ok()?, o)))
    }

    /// Every pin the store holds (fixed addresses: ).
    pub fn pins(&self) -> Vec<ipool_server::cluster::pin::Pin> {
        match self {
            Shared::Etcd(e) => e
                .keys()
                .filter(|(k, _)| k.starts_with(b"/ipool/v1/pins/"))
                .filter_map(|(_, kv)| serde_json::from_slice(&kv.value).ok())
                .collect(),
            Shared::Api { objects, .. } => objects
                .objects
                .iter()
                .filter(|(k, _)| k.0 == "ippins")
                .filter_map(|(_, o)| serde_json::from_value(o["spec"].clone()).ok())
                .collect(),
        }
    }

    /// Every block the store holds: CIDR, owner, pool.
    pub fn blocks(&self) -> Vec<StoreBlock> {
        match self {
            Shared::Etcd(e) => Shared::etcd_blocks(e)
                .filter_map(|(pool, net, kv)| {
                    let owner: serde_json::Value = serde_json::from_slice(&kv.value).ok()?;
                    Some((net, owner["node"].as_str()?.to_string(), pool))
                })
                .collect(),
            Shared::Api { objects, .. } => Shared::api_blocks(objects)
                .filter_map(|(net, o)| {
                    let spec = &o["spec"];
                    Some((
                        net,
                        spec["node"].as_str()?.to_string(),
                        spec["pool"].as_str()?.to_string(),
                    ))
                })
                .collect(),
        }
    }

    /// Each pool's CIDRs as the store has them now.
    pub fn pool_cidrs(&self) -> std::collections::BTreeMap<String, Vec<IpNet>> {
        match self {
            Shared::Etcd(e) => e
                .keys()
                .filter_map(|(k, kv)| {
                    let name = std::str::from_utf8(k)
                        .ok()?
                        .strip_prefix("/ipool/v1/pools/")?;
                    let spec: ipool_server::cluster::ippool::PoolSpec =
                        serde_json::from_slice(&kv.value).ok()?;
                    Some((name.to_string(), spec.cidrs))
                })
                .collect(),
            Shared::Api { objects, .. } => objects
                .objects
                .iter()
                .filter(|(k, _)| k.0 == "ippools")
                .map(|(k, o)| {
                    let cidrs = o["spec"]["cidrs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c.as_str()?.parse().ok())
                        .collect();
                    (k.2.clone(), cidrs)
                })
                .collect(),
        }
    }

    /// Whether pool `name` is in the store now (nothing parsed: asked at every step).
    pub fn has_pool(&self, name: &str) -> bool {
        match self {
            Shared::Etcd(e) => e.has_key(format!("/ipool/v1/pools/{name}").as_bytes()),
            Shared::Api { objects, .. } => objects
                .objects
                .keys()
                .any(|k| k.0 == "ippools" && k.2 == name),
        }
    }

    /// Each pool as the store has it now (for the liveness rules, `crate::settled`).
    pub fn pools(&self) -> Vec<PoolNow> {
        match self {
            Shared::Etcd(e) => e
                .keys()
                .filter_map(|(k, kv)| {
                    let name = std::str::from_utf8(k)
                        .ok()?
                        .strip_prefix("/ipool/v1/pools/")?
                        .to_string();
                    let spec: ipool_server::cluster::ippool::PoolSpec =
                        serde_json::from_slice(&kv.value).ok()?;
                    Some(PoolNow {
                        kept_out: [
                            spec.exclude.clone(),
                            spec.reserved.iter().map(|r| r.cidr).collect(),
                        ]
                        .concat(),
                        reserved: spec.reserved.iter().map(|r| r.cidr).collect(),
                        adding: spec.adding.clone(),
                        removing: spec.removing.clone(),
                        name,
                        cidrs: spec.cidrs,
                        block_v4: spec.block_v4,
                        block_v6: spec.block_v6,
                        disabled: spec.disabled,
                        node_selector: spec.node_selector,
                        // A creation and a deletion are one transaction each on etcd.
                        deleting: false,
                        pending: false,
                    })
                })
                .collect(),
            Shared::Api { objects, .. } => objects
                .objects
                .iter()
                .filter(|(k, _)| k.0 == "ippools")
                .map(|(k, o)| {
                    let spec = &o["spec"];
                    let nets = |v: &serde_json::Value| -> Vec<IpNet> {
                        v.as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c.as_str().or(c["cidr"].as_str())?.parse().ok())
                            .collect()
                    };
                    PoolNow {
                        name: k.2.clone(),
                        cidrs: nets(&spec["cidrs"]),
                        block_v4: spec["blockSizeV4"].as_u64().unwrap_or(32) as u8,
                        block_v6: spec["blockSizeV6"].as_u64().unwrap_or(128) as u8,
                        kept_out: [nets(&spec["exclude"]), nets(&spec["reserved"])].concat(),
                        reserved: nets(&spec["reserved"]),
                        disabled: spec["disabled"].as_bool().unwrap_or(false),
                        node_selector: spec["nodeSelector"].as_str().map(str::to_string),
                        adding: nets(&spec["cidrsAdding"]),
                        removing: nets(&spec["cidrsRemoving"]),
                        deleting: o["status"]["phase"].as_str() == Some("Deleting"),
                        pending: o["status"]["phase"].as_str() == Some("Pending"),
                    }
                })
                .collect(),
        }
    }

    /// Every block's revision (etcd: its key's mod revision; the Kubernetes API: its
    /// resourceVersion): it moves with every write of the block.
    pub fn block_revisions(&self) -> std::collections::BTreeMap<IpNet, u64> {
        match self {
            Shared::Etcd(e) => Shared::etcd_blocks(e)
                .map(|(_, net, kv)| (net, kv.mod_revision as u64))
                .collect(),
            Shared::Api { objects, .. } => Shared::api_blocks(objects)
                .filter_map(|(net, o)| {
                    Some((
                        net,
                        o["metadata"]["resourceVersion"].as_str()?.parse().ok()?,
                    ))
                })
                .collect(),
        }
    }

    /// On the Kubernetes API: each block's pool and its record of it (`spec.poolRevision`),
    /// and each pool's revision as it is now (from its uid); etcd's blocks record none.
    pub fn pool_revisions(&self) -> Option<PoolRevisions> {
        let Shared::Api { objects, .. } = self else {
            return None;
        };
        let blocks = Shared::api_blocks(objects)
            .filter_map(|(net, o)| {
                let pool = o["spec"]["pool"].as_str()?.to_string();
                Some((net, (pool, o["spec"]["poolRevision"].as_i64()?)))
            })
            .collect();
        let pools = objects
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "ippools")
            .filter_map(|(k, o)| {
                let uid = o["metadata"]["uid"].as_str()?;
                Some((
                    k.2.clone(),
                    ipool_server::cluster::kube::pool_revision_of_uid(uid),
                ))
            })
            .collect();
        Some((blocks, pools))
    }

    /// Who holds each node's name: (node, the holder's instance, until when its lease runs
    /// if nothing renews it; None: until another takes it, as on the Kubernetes API, whose
    /// Leases lapse only in their observers' eyes).
    pub fn holders(&self) -> Vec<Holder> {
        match self {
            Shared::Etcd(e) => e
                .keys()
                .filter_map(|(k, kv)| {
                    let key = std::str::from_utf8(k).ok()?;
                    let node = key
                        .strip_prefix("/ipool/v1/nodes/")?
                        .strip_suffix("/alive")?;
                    let alive: serde_json::Value = serde_json::from_slice(&kv.value).ok()?;
                    Some(Holder {
                        node: node.to_string(),
                        instance: alive["instance"].as_str()?.to_string(),
                        until: e.lease_expiry(kv.lease),
                    })
                })
                .collect(),
            Shared::Api { objects, .. } => objects
                .objects
                .iter()
                .filter(|(k, _)| k.0 == "leases")
                .filter_map(|(k, o)| {
                    Some(Holder {
                        node: k.2.strip_prefix("ipool-")?.to_string(),
                        instance: o["spec"]["holderIdentity"].as_str()?.to_string(),
                        until: None,
                    })
                })
                .collect(),
        }
    }

    /// A fingerprint of the store's contents (it changed when this did).
    pub fn version(&self) -> u64 {
        match self {
            Shared::Etcd(e) => e.revision() as u64,
            Shared::Api { objects, .. } => objects.rv,
        }
    }
}

/// A pool as the store has it (see [`Shared::pools`]).
pub struct PoolNow {
    pub name: String,
    pub cidrs: Vec<IpNet>,
    pub block_v4: u8,
    pub block_v6: u8,
    /// Excluded and reserved ranges.
    pub kept_out: Vec<IpNet>,
    /// Reserved ranges.
    pub reserved: Vec<IpNet>,
    pub disabled: bool,
    /// The nodes that may claim from it (a label selector; None: every node).
    pub node_selector: Option<String>,
    /// CIDRs on their way in, and on their way out (the Kubernetes API's two-step change:
    /// marked, checked, unmarked).
    pub adding: Vec<IpNet>,
    pub removing: Vec<IpNet>,
    /// Marked Deleting (the Kubernetes API).
    pub deleting: bool,
    /// Pending: being created (the Kubernetes API).
    pub pending: bool,
}

impl PoolNow {
    /// Nodes may claim a block of it.
    pub fn gives_blocks(&self) -> bool {
        !self.disabled && self.half_done().is_none()
    }

    /// The command that left it half done, if one did (its error told the operator to run it
    /// again): Pending, marked Deleting, or a CIDR marked on its way in or out.
    pub fn half_done(&self) -> Option<HalfDone> {
        if self.deleting {
            Some(HalfDone::Delete)
        } else if self.pending {
            Some(HalfDone::Create)
        } else if let Some(c) = self.adding.first() {
            Some(HalfDone::AddCidr(*c))
        } else {
            self.removing.first().map(|c| HalfDone::RemoveCidr(*c))
        }
    }
}

/// A pool command left half done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfDone {
    Delete,
    Create,
    AddCidr(IpNet),
    RemoveCidr(IpNet),
}

mod seed;
