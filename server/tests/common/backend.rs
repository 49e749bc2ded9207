//! The store a cluster test runs against, either of them: a real etcd, or the fake apiserver
//! (`datastore = "kubernetes"`). Both are driven the same way: pools made and blocks read with
//! the real ipoolctl (the same commands and outputs for both), daemons configured to reach the
//! store through an address of the test's choosing (a proxy), the store stopped and started.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;

use super::etcd::Etcd;
use super::fake_api::FakeApi;

pub enum Backend {
    Etcd(Mutex<Etcd>),
    Kube {
        api: FakeApi,
        dir: tempfile::TempDir,
        kubeconfig: PathBuf,
    },
}

impl Backend {
    pub fn etcd() -> Backend {
        Backend::Etcd(Mutex::new(Etcd::start()))
    }

    pub fn kube() -> Backend {
        let api = FakeApi::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.kubeconfig(dir.path());
        Backend::Kube {
            api,
            dir,
            kubeconfig,
        }
    }

    /// What messages call it.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Etcd(_) => "etcd",
            Backend::Kube { .. } => "the apiserver",
        }
    }

    /// host:port of the store (what a proxy forwards to).
    pub fn addr(&self) -> String {
        match self {
            Backend::Etcd(e) => e
                .lock()
                .unwrap()
                .client_url
                .trim_start_matches("http://")
                .to_string(),
            Backend::Kube { api, .. } => api.addr.to_string(),
        }
    }

    /// `ipoolctl cluster ARGS...` against the store, each call bounded by 2 s.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_within(2, args)
    }

    /// `ipoolctl cluster ARGS...` against the store, each call bounded by `secs`.
    pub fn ctl_within(&self, secs: u64, args: &[&str]) -> Output {
        let mut c = Command::new(super::ipoolctl_bin());
        c.arg("cluster");
        match self {
            Backend::Etcd(e) => c.args(["--etcd-endpoints", &e.lock().unwrap().client_url]),
            Backend::Kube { kubeconfig, .. } => c
                .args(["--datastore", "kubernetes", "--kubeconfig"])
                .arg(kubeconfig),
        };
        c.args(["--store-timeout", &secs.to_string()])
            .args(args)
            .output()
            .expect("run ipoolctl")
    }

    /// `ipoolctl cluster pool create ARGS...`, which must succeed.
    pub fn create_pool(&self, args: &[&str]) {
        let mut all = vec!["pool", "create"];
        all.extend_from_slice(args);
        let o = self.ctl(&all);
        assert!(o.status.success(), "pool create: {}", super::stderr(&o));
    }

    /// Each block and its owner, as `ipoolctl cluster blocks` lists them.
    pub fn owners(&self) -> std::collections::BTreeMap<ipnet::IpNet, String> {
        let o = self.ctl(&["-o", "json", "blocks"]);
        assert!(o.status.success(), "blocks: {}", super::stderr(&o));
        super::json(&o)
            .as_array()
            .expect("a list")
            .iter()
            .map(|b| {
                (
                    b["block"].as_str().expect("block").parse().expect("a CIDR"),
                    b["node"].as_str().expect("node").to_string(),
                )
            })
            .collect()
    }

    /// An ipoold config for node `node` with network "pods" on cluster pool `pool`, reaching
    /// the store at `via` (host:port); `extra` goes into `[cluster]`.
    pub fn daemon_config(&self, node: &str, pool: &str, extra: &str, via: &str) -> String {
        match self {
            Backend::Etcd(e) => {
                let e = e.lock().unwrap();
                e.daemon_config(node, pool, extra)
                    .replace(&e.client_url, &format!("http://{via}"))
            }
            Backend::Kube { api, dir, .. } => {
                let kubeconfig = api.kubeconfig_via(dir.path(), via);
                format!(
                    r#"
[cni]
add_wait_ms = 5000
[cluster]
datastore = "kubernetes"
kubeconfig = "{}"
node_name = "{node}"
store_timeout_ms = 500
{extra}
[[network]]
name = "pods"
ranges_from = "cluster"
cluster_pool = "{pool}"
routes = [{{ dst = "0.0.0.0/0" }}]
"#,
                    kubeconfig.display()
                )
            }
        }
    }

    /// A count that grows with every write of a block: on the apiserver, the requests that
    /// create, update or delete one; on etcd, its revision (every write moves it; lease
    /// renewals do not).
    pub fn block_writes(&self) -> u64 {
        match self {
            Backend::Etcd(e) => {
                let url = e.lock().unwrap().client_url.clone();
                super::etcd::with_store(&url, |s| async move {
                    let r = s
                        .client()
                        .range(ipool_server::cluster::etcd::request::get("/"))
                        .await
                        .expect("read etcd's revision");
                    r.header.expect("a header").revision as u64
                })
            }
            Backend::Kube { api, .. } => api
                .requests()
                .iter()
                .filter(|r| {
                    r.contains("/apis/ipool.io/v1/ipblocks")
                        && ["POST ", "PUT ", "DELETE "]
                            .iter()
                            .any(|m| r.starts_with(m))
                })
                .count() as u64,
        }
    }

    /// Block `block` of pool `pool`, `from`'s, made `to`'s in one write (as no ipool command
    /// does: what a forced release-node and another node's claim do in two): on the apiserver
    /// an update of its node (spec and label), on etcd one transaction over its key and both
    /// nodes' index entries.
    pub fn reown(&self, pool: &str, block: &str, from: &str, to: &str) {
        match self {
            Backend::Kube { api, .. } => {
                let name = block.replace(['.', '/', ':'], "-");
                let mut obj = api.get("ipblocks", "", &name).expect("the block's object");
                obj["spec"]["node"] = serde_json::json!(to);
                obj["metadata"]["labels"]["ipool.io/node"] = serde_json::json!(to);
                api.put_custom("ipblocks", obj);
            }
            Backend::Etcd(e) => {
                use ipool_server::cluster::etcd::request::{op, txn};
                let url = e.lock().unwrap().client_url.clone();
                let net: ipnet::IpNet = block.parse().expect("a CIDR");
                let part = ipool_server::cluster::etcd::block_key_part(&net);
                let root = ipool_server::cluster::etcd::DEFAULT_PREFIX;
                let owner = format!(r#"{{"node":"{to}","claimed_at_ms":1}}"#);
                let ops = [
                    op::put(format!("{root}/blocks/{pool}/{part}"), owner, 0),
                    op::delete(format!("{root}/nodes/{from}/blocks/{pool}/{part}")),
                    op::put(format!("{root}/nodes/{to}/blocks/{pool}/{part}"), "w1", 0),
                ];
                super::etcd::with_store(&url, |s| async move {
                    s.client().txn(txn([], ops, [])).await.expect("re-own");
                });
            }
        }
    }

    /// Block `block` of pool `pool` deleted and made again for the same node behind ipool's
    /// back (a forced release and a claim again, in short): the same owner, another identity
    /// (the apiserver's uid, etcd's create revision), so that a pin made in it is void.
    pub fn remake_block(&self, pool: &str, block: &str) {
        match self {
            Backend::Kube { api, .. } => {
                let name = block.replace(['.', '/', ':'], "-");
                let mut obj = api.get("ipblocks", "", &name).expect("the block's object");
                assert!(api.delete("ipblocks", "", &name));
                let uid = format!("{}-again", obj["metadata"]["uid"].as_str().unwrap_or("b"));
                obj["metadata"]["uid"] = serde_json::json!(uid);
                api.put_custom("ipblocks", obj);
            }
            Backend::Etcd(e) => {
                use ipool_server::cluster::etcd::request::{get, op, txn};
                let url = e.lock().unwrap().client_url.clone();
                let net: ipnet::IpNet = block.parse().expect("a CIDR");
                let part = ipool_server::cluster::etcd::block_key_part(&net);
                let key = format!(
                    "{}/blocks/{pool}/{part}",
                    ipool_server::cluster::etcd::DEFAULT_PREFIX
                );
                super::etcd::with_store(&url, |s| async move {
                    let now = s.client().range(get(key.clone())).await.expect("read");
                    let value = now.kvs[0].value.clone();
                    s.client()
                        .txn(txn([], [op::delete(key.clone())], []))
                        .await
                        .expect("delete");
                    s.client()
                        .txn(txn([], [op::put(key, value, 0)], []))
                        .await
                        .expect("put again");
                });
            }
        }
    }

    /// Deletes pool `pool` behind ipool's back (its blocks stay): on the apiserver the
    /// IPPool object, on etcd its key.
    pub fn drop_pool(&self, pool: &str) {
        match self {
            Backend::Kube { api, .. } => assert!(api.delete("ippools", "", pool)),
            Backend::Etcd(e) => {
                use ipool_server::cluster::etcd::request;
                let url = e.lock().unwrap().client_url.clone();
                let key = format!(
                    "{}/pools/{pool}",
                    ipool_server::cluster::etcd::DEFAULT_PREFIX
                );
                super::etcd::with_store(&url, |s| async move {
                    s.client()
                        .delete_range(request::delete(key))
                        .await
                        .expect("delete the pool's key");
                });
            }
        }
    }

    /// Writes an entry among the blocks that names no owner (its CIDR is not the one its
    /// name says, on the apiserver; not JSON, on etcd).
    pub fn put_malformed_block(&self, pool: &str) {
        match self {
            Backend::Kube { api, .. } => api.put_custom(
                "ipblocks",
                serde_json::json!({"apiVersion": "ipool.io/v1", "kind": "IPBlock",
                    "metadata": {"name": "10-250-0-0-28", "labels": {"ipool.io/node": "n1", "ipool.io/pool": pool}},
                    "spec": {"cidr": "10.250.0.16/28", "pool": pool, "node": "n1", "claimedAtMs": 1}}),
            ),
            Backend::Etcd(e) => {
                use ipool_server::cluster::etcd::request;
                let url = e.lock().unwrap().client_url.clone();
                let key = format!(
                    "{}/blocks/{pool}/10.250.0.0-28",
                    ipool_server::cluster::etcd::DEFAULT_PREFIX
                );
                super::etcd::with_store(&url, |s| async move {
                    s.client()
                        .put(request::put(key, "not json", 0))
                        .await
                        .expect("put");
                });
            }
        }
    }

    /// Forgets the store's history up to now: a watch resumed from before gets 410 Gone (the
    /// apiserver; its open watches cut too) or is cancelled as compacted (etcd).
    pub fn compact(&self) {
        match self {
            Backend::Kube { api, .. } => api.compact(),
            Backend::Etcd(e) => {
                use ipool_proto::etcd::etcdserverpb as pb;
                let url = e.lock().unwrap().client_url.clone();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let mut kv = pb::kv_client::KvClient::connect(url).await.expect("etcd");
                    let now = kv
                        .range(pb::RangeRequest {
                            key: b"/".to_vec(),
                            ..Default::default()
                        })
                        .await
                        .expect("read etcd's revision")
                        .into_inner()
                        .header
                        .expect("a header")
                        .revision;
                    kv.compact(pb::CompactionRequest {
                        revision: now,
                        physical: true,
                    })
                    .await
                    .expect("compact");
                });
            }
        }
    }

    /// A fake apiserver of the test's own for the Nodes and pods where the store is etcd
    /// (None on the Kubernetes API: the store's serves them); [`Backend::apiserver`] then
    /// names the one to use.
    pub fn own_api(&self) -> Option<FakeApi> {
        self.api().is_none().then(FakeApi::start)
    }

    /// The apiserver of the Nodes and pods: the store's, or `own` ([`Backend::own_api`]).
    pub fn apiserver<'a>(&'a self, own: &'a Option<FakeApi>) -> &'a FakeApi {
        self.api()
            .or(own.as_ref())
            .expect("the store's apiserver, or one of the test's own")
    }

    /// `ipoolctl cluster ARGS...` (bounded by `secs` a call) that also reads `api`'s Nodes and
    /// pods: the store's own on the Kubernetes API, `--kubeconfig` in `dir` with etcd.
    pub fn ctl_with_api(
        &self,
        api: &FakeApi,
        dir: &std::path::Path,
        secs: u64,
        args: &[&str],
    ) -> Output {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if self.api().is_none() {
            all.push("--kubeconfig".into());
            all.push(api.kubeconfig(dir).display().to_string());
        }
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        self.ctl_within(secs, &all)
    }

    /// The fake apiserver, when the store is the Kubernetes API.
    pub fn api(&self) -> Option<&FakeApi> {
        match self {
            Backend::Kube { api, .. } => Some(api),
            Backend::Etcd(_) => None,
        }
    }

    /// Arguments that make ipoolctl look for the nodes' names where the daemons do not keep
    /// them (an operator's slip): another Lease namespace, another etcd prefix.
    pub fn elsewhere(&self) -> [&'static str; 2] {
        match self {
            Backend::Etcd(_) => ["--etcd-prefix", "/elsewhere"],
            Backend::Kube { .. } => ["--lease-namespace", "elsewhere"],
        }
    }

    /// The store stops answering (etcd: stopped; the apiserver: every connection dropped).
    pub fn stop(&self) {
        match self {
            Backend::Etcd(e) => e.lock().unwrap().stop(),
            Backend::Kube { api, .. } => api.set_down(true),
        }
    }

    pub fn start(&self) {
        match self {
            Backend::Etcd(e) => e.lock().unwrap().spawn(),
            Backend::Kube { api, .. } => api.set_down(false),
        }
    }
}

/// Runs `f` with a store client of `store`'s, as ipoolctl.
pub fn with_datastore<T, F: std::future::Future<Output = T>>(
    store: &Backend,
    f: impl FnOnce(std::sync::Arc<dyn ipool_server::cluster::datastore::Datastore>) -> F,
) -> T {
    with_datastore_as(store, "ipoolctl", f)
}

/// Runs `f` with a store client of `store`'s whose writes the apiserver records as
/// `manager`'s (`ipoold`: a daemon's, whose Lease renewals release-node measures).
pub fn with_datastore_as<T, F: std::future::Future<Output = T>>(
    store: &Backend,
    manager: &str,
    f: impl FnOnce(std::sync::Arc<dyn ipool_server::cluster::datastore::Datastore>) -> F,
) -> T {
    match store {
        Backend::Etcd(e) => {
            let url = e.lock().unwrap().client_url.clone();
            super::etcd::with_store(&url, |s| f(std::sync::Arc::new(s)))
        }
        Backend::Kube { kubeconfig, .. } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let client =
                    ipool_server::k8s::client(Some(kubeconfig), std::time::Duration::from_secs(5))
                        .await
                        .expect("client");
                let s = ipool_server::cluster::kube::KubeStore::connect(
                    client,
                    "ipool-system",
                    None,
                    manager,
                )
                .await
                .expect("connect");
                f(std::sync::Arc::new(s)).await
            })
        }
    }
}
