//! A simulated node's daemon: its state dir (a [`MemStore`] that outlives the daemon), and
//! while it runs the real engine ([`Ipam`]) with the real cluster wiring ([`ClusterNetworks`]:
//! `ClusterNode`, the sources, the heartbeat, the pools followed) and the background loop, as
//! ipoold runs them, its store clients going through the simulated network.
//!
//! A kill ends the incarnation: its clients refuse to send from then on (a dead process sends
//! nothing; what it sent before is still on its way), its tasks are aborted, and the state dir
//! keeps what was durable. A claim the engine was running finishes against the dead
//! incarnation's own memory, which nothing reads any more.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipool_server::clock::Clock;
use ipool_server::cluster::connect::Connector;
use ipool_server::cluster::datastore::StoreHandle;
use ipool_server::cluster::etcd::client::EtcdClient;
use ipool_server::cluster::etcd::EtcdStore;
use ipool_server::cluster::kube::KubeStore;
use ipool_server::cluster::node::ClusterNode;
use ipool_server::cluster::pin::hold::Holds;
use ipool_server::cluster::pin::PinOwner;
use ipool_server::cluster::vocab::ClusterError;
use ipool_server::config::DaemonConfig;
use ipool_server::ipam::{AddRequest, Ipam, Setup, Suspects};
use ipool_server::k8s::gc::Held;
use ipool_server::model::PodMeta;
use ipool_server::model::{ClockAnchor, Millis};
use ipool_server::node_ranges::cluster::ClusterNetworks;
use ipool_server::store::{AttachmentKey, MemStore, Pod};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::net::{ApiWire, EtcdWire, Net};
use crate::StoreKind;

mod kubernetes;
use kubernetes::Keeper;

/// Where the simulated pods' network namespaces would be: a directory no machine has, so that
/// no check of ipoold's (the pod GC's) ever sees one, whatever the host running the simulation.
pub const NETNS_DIR: &str = "/nonexistent-ipool-sim/netns";

/// The network the simulated pods are on.
pub const NETWORK: &str = "pods";
/// The network's name in the config of a daemon started with it renamed (`Swarm::renames`).
pub const RENAMED: &str = "pods-renamed";

/// The simulation's wall clock: a base, simulated time since, and jumps.
#[derive(Clone)]
pub struct Wall {
    start: Instant,
    base_ms: u64,
    /// Milliseconds the clock was moved by (forward or back).
    jump: Arc<std::sync::atomic::AtomicI64>,
}

impl Wall {
    pub fn new(base_ms: u64) -> Wall {
        Wall {
            start: Instant::now(),
            base_ms,
            jump: Arc::default(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        let t = self.base_ms as i64
            + self.start.elapsed().as_millis() as i64
            + self.jump.load(Ordering::Relaxed);
        t.max(0) as u64
    }

    /// Moves the wall clock by `ms` (monotonic time does not move).
    pub fn step(&self, ms: i64) {
        self.jump.fetch_add(ms, Ordering::Relaxed);
    }
}

/// Engine time of a simulated daemon: the wall clock when it starts (never below what its store
/// holds), then simulated monotonic time, as `SystemClock` does with the boot-time clock.
struct EngineClock {
    start: Instant,
    base: Mutex<Millis>,
}

impl EngineClock {
    /// The simulated instant at which this clock read `ms`.
    fn instant_of(&self, ms: Millis) -> Instant {
        let base = *self.base.lock().expect("clock");
        self.start + Duration::from_millis(ms.saturating_sub(base))
    }
}

impl Clock for EngineClock {
    fn now_ms(&self) -> Millis {
        *self.base.lock().expect("clock") + self.start.elapsed().as_millis() as Millis
    }

    fn resume(
        &self,
        anchor: Option<&ClockAnchor>,
        floor: Millis,
        _boot_id: Option<&str>,
    ) -> Option<ClockAnchor> {
        let high = anchor.map_or(0, |a| a.engine_ms).max(floor);
        let now = self.now_ms();
        if now <= high {
            *self.base.lock().expect("clock") += high + 1 - now;
        }
        None
    }
}

/// How a simulated daemon is set up.
#[derive(Clone)]
pub struct Setting {
    pub store: StoreKind,
    pub pool: String,
    /// A second pool of the network, tried once the first is full.
    pub second_pool: Option<String>,
    /// The network addressed as one subnet (`crate::SUBNET_GATEWAYS`, `crate::SUBNET_EXCLUDE`).
    pub subnet: bool,
    /// What the names of the nodes' Node objects start with (`--node-name`): "" where they are
    /// the store's names, else a store name that is not the Node's.
    pub node_prefix: &'static str,
    /// Pods with fixed addresses: the daemons run the pins' part of ADD and DEL
    /// (`ipool_server::service::fixed`), as ipoold does in cluster mode.
    pub pins: bool,
    /// The pool sets `crate::SET_ASIDE` aside, and the first ordinals choose their addresses
    /// there (`crate::owners::chosen`).
    pub set_aside: bool,
    /// `[cluster]`'s numbers and `[defaults]`, as TOML.
    pub tuning: String,
    pub timeout: Duration,
}

impl Setting {
    /// The name of node `name`'s Node object.
    pub fn k8s_node(&self, name: &str) -> String {
        format!("{}{name}", self.node_prefix)
    }

    /// The daemon config of node `name`; `renamed`: its network named [`RENAMED`] instead of
    /// [`NETWORK`] (the ADDs and DELs still name [`NETWORK`]).
    pub(crate) fn config(&self, name: &str, renamed: bool) -> DaemonConfig {
        let network = match renamed {
            true => RENAMED,
            false => NETWORK,
        };
        let store = match self.store {
            StoreKind::Etcd => "etcd_endpoints = [\"http://192.0.2.1:2379\"]",
            StoreKind::Kube => "datastore = \"kubernetes\"",
        };
        let pools = match &self.second_pool {
            None => format!("cluster_pool = \"{}\"", self.pool),
            Some(q) => format!("cluster_pools = [\"{}\", \"{q}\"]", self.pool),
        };
        let list = |v: &[&str]| {
            let quoted: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
            quoted.join(", ")
        };
        let addressing = match self.subnet {
            true => format!(
                "addressing = \"subnet\"\ngateway = [{}]\nexclude = [{}]\n",
                list(&crate::SUBNET_GATEWAYS),
                list(&crate::SUBNET_EXCLUDE)
            ),
            false => String::new(),
        };
        let text = format!(
            "[cni]\nadd_wait_ms = 1500\n[defaults]\ncooldown_secs = 0\nmax_idle = 2\n[cluster]\n{store}\nnode_name = \"{name}\"\nstore_timeout_ms = {}\n{}\n[[network]]\nname = \"{network}\"\nranges_from = \"cluster\"\n{pools}\n{addressing}",
            self.timeout.as_millis(),
            self.tuning,
        );
        DaemonConfig::parse(&text).expect("the simulation's daemon config")
    }
}

/// A store connection of sender `from` through `net` (dead once `alive` is false), writing on
/// the Kubernetes API as field manager `manager` (ipoold's, or ipoolctl's: release-node
/// measures absence by the times the apiserver stamps on each one's writes).
pub fn connector(
    kind: StoreKind,
    net: Net,
    from: usize,
    alive: Arc<AtomicBool>,
    manager: &'static str,
) -> Connector {
    Arc::new(move |settings, _tls, limiter| {
        let (net, alive, limiter) = (net.clone(), alive.clone(), limiter.clone());
        let timeout = Duration::from_millis(settings.store_timeout_ms);
        let (prefix, lease_ns) = (settings.prefix.clone(), settings.lease_namespace.clone());
        Box::pin(async move {
            if !alive.load(Ordering::Relaxed) {
                return Err(ClusterError::Refused("simulated: a dead process".into()));
            }
            match kind {
                StoreKind::Etcd => {
                    let wire = Arc::new(EtcdWire { net, from, alive });
                    let client = EtcdClient::with_transport(wire, timeout, Some(limiter));
                    let s = EtcdStore::with_client(client, &prefix).await?;
                    Ok(Arc::new(s) as StoreHandle)
                }
                StoreKind::Kube => {
                    let wire = ApiWire {
                        net,
                        from,
                        timeout,
                        alive,
                    };
                    let client = kube::Client::new(wire, "default");
                    let s = KubeStore::connect(client, &lease_ns, Some(limiter), manager).await?;
                    Ok(Arc::new(s) as StoreHandle)
                }
            }
        })
    })
}

/// What an ADD or a DEL came to.
#[derive(Debug)]
pub enum Done {
    Added {
        daemon: u64,
        container: String,
        result: Result<Vec<IpAddr>, String>,
        /// When it was answered.
        at: Instant,
        /// When the engine picked its addresses (its record's time).
        decided: Instant,
        /// Addresses handed out that the node's own view of the pool had reserved both when
        /// the ADD began and when it was answered.
        reserved: Vec<IpAddr>,
    },
    Deleted {
        daemon: u64,
        container: String,
        ok: bool,
    },
}

/// One incarnation of a daemon.
pub struct Daemon {
    /// Unique over the run: which incarnation answered.
    pub id: u64,
    pub ipam: Ipam,
    pub node: Arc<ClusterNode>,
    cluster: ClusterNetworks,
    /// The pins' part of ADD and DEL, in the runs with fixed addresses.
    holds: Option<Holds>,
    /// Its pin keeper's memory (`k8s::pin_keeper`): holds seen unused, owners seen gone,
    /// since when; lost with the daemon, as ipoold's is.
    keeper: Arc<tokio::sync::Mutex<Keeper>>,
    /// Its pod GC's memory (`k8s::gc`): what it has seen gone, since when; lost with the
    /// daemon, as ipoold's is.
    collector: Arc<tokio::sync::Mutex<Suspects<Held>>>,
    /// The pool sets addresses aside for the first ordinals (`Setting::set_aside`).
    set_aside: bool,
    maintenance: JoinHandle<()>,
    calls: Vec<JoinHandle<()>>,
    clock: Arc<EngineClock>,
    alive: Arc<AtomicBool>,
}

impl Daemon {
    /// Starts a daemon named `name` (instance `instance`) on the state dir `disk`, its
    /// clients sending as `from`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        id: u64,
        setting: &Setting,
        name: &str,
        instance: &str,
        disk: Arc<MemStore>,
        net: &Net,
        from: usize,
        wall: &Wall,
        renamed: bool,
    ) -> Result<Daemon, String> {
        let config = setting.config(name, renamed);
        let alive = Arc::new(AtomicBool::new(true));
        let conn = connector(
            setting.store,
            net.clone(),
            from,
            alive.clone(),
            ipool_server::cluster::kube::FIELD_MANAGER,
        );
        let settings = config.cluster.clone().expect("[cluster]");
        let metrics = Arc::new(ipool_server::metrics::Metrics::default());
        let node = ClusterNode::with_connector(
            settings,
            name.to_string(),
            instance.to_string(),
            metrics.clone(),
            conn,
        )
        .map_err(|e| e.to_string())?;
        // Its Node's name (ipoold's --node-name), the store's or another.
        node.set_k8s_node(&setting.k8s_node(name));
        let (cluster, sources) = ClusterNetworks::new(node.clone(), &config);
        let clock = Arc::new(EngineClock {
            start: Instant::now(),
            base: Mutex::new(wall.now_ms()),
        });
        let (load, serve) = (disk.clone(), disk);
        let ipam = Ipam::open_with(
            move || Ok(load as Arc<dyn ipool_server::store::Store>),
            move || Ok(serve as Arc<dyn ipool_server::store::Store>),
            Setup {
                config,
                clock: clock.clone(),
                boot_id: Some("simulated-boot".into()),
                metrics,
                sources,
            },
        )
        .map_err(|e| format!("the engine does not start: {e}"))?;
        cluster.start(&ipam);
        // As ipoold does: the holds of pins it confirms are those its engine holds.
        node.set_attachments(ipam.holds_for_weakly());
        let holds = setting
            .pins
            .then(|| Holds::new(node.clone()).with_migrations(Arc::new(crate::owners::Migrating)));
        let maintenance = ipool_server::ipam::spawn_maintenance(ipam.clone());
        Ok(Daemon {
            id,
            ipam,
            node,
            cluster,
            holds,
            keeper: Arc::default(),
            collector: Arc::default(),
            set_aside: setting.set_aside,
            maintenance,
            calls: Vec::new(),
            alive,
            clock,
        })
    }

    /// Kills it (-9): nothing more is sent, every task of its own ends.
    pub fn kill(mut self) {
        self.alive.store(false, Ordering::Relaxed);
        self.cluster.abort();
        self.maintenance.abort();
        for c in self.calls.drain(..) {
            c.abort();
        }
    }

    /// An ADD of `container` (a pod of its own), asking for the addresses `requested` (CNI
    /// args' `IP=`: none, or one), its outcome pushed to `done`. `fixed`: the pod's address
    /// is fixed for that owner (`ipool.io/fixed`), the pod is named `pod`, and a VM's
    /// launcher is of `instance`.
    pub fn add(
        &mut self,
        container: &str,
        requested: Vec<IpAddr>,
        fixed: Option<(PinOwner, String, Option<String>)>,
        done: &Arc<Mutex<Vec<Done>>>,
    ) {
        let (ipam, done, id) = (self.ipam.clone(), done.clone(), self.id);
        let (clock, node, holds) = (self.clock.clone(), self.node.clone(), self.holds.clone());
        let set_aside = self.set_aside;
        let container = container.to_string();
        self.calls.push(tokio::spawn(async move {
            let before = node.pool_reserved(crate::POOL);
            let name = fixed
                .as_ref()
                .map_or(container.clone(), |(_, p, _)| p.clone());
            let req = AddRequest {
                key: key(&container),
                pod: Pod {
                    namespace: "sim".into(),
                    name,
                    uid: format!("uid-{container}"),
                },
                netns: format!("{NETNS_DIR}/{container}"),
                ipam: None,
                requested,
                // The pod's own (its fixed address's owner is recorded there).
                k8s: fixed.is_some().then(PodMeta::default),
                pools: None,
                fixed: false,
            };
            let reply = match (fixed, &holds) {
                (Some((owner, _, instance)), Some(holds)) => {
                    let fixed = ipool_server::service::fixed::FixedFor {
                        chosen: crate::owners::chosen(&owner, set_aside),
                        migration: instance.as_ref().map(|_| "m".to_string()),
                        instance,
                        owner,
                    };
                    ipool_server::service::fixed::add(&ipam, holds, req, fixed).await
                }
                _ => ipam.add(req).await,
            };
            let result = reply
                .map(|r| r.leases.iter().map(|l| l.ip).collect::<Vec<IpAddr>>())
                .map_err(|e| e.to_string());
            let decided = ipam
                .get(&key(&container))
                .map_or_else(Instant::now, |r| clock.instant_of(r.created_at_ms));
            let after = node.pool_reserved(crate::POOL);
            let held = |v: &[ipool_server::cluster::ippool::Reserved], ip: &IpAddr| {
                v.iter().any(|r| r.cidr.contains(ip))
            };
            let reserved = match &result {
                Ok(ips) => ips
                    .iter()
                    .filter(|ip| held(&before, ip) && held(&after, ip))
                    .copied()
                    .collect(),
                Err(_) => Vec::new(),
            };
            done.lock().expect("done").push(Done::Added {
                daemon: id,
                container,
                result,
                at: Instant::now(),
                decided,
                reserved,
            });
        }));
        self.calls.retain(|c| !c.is_finished());
    }

    /// A DEL of `container`, its outcome pushed to `done`.
    pub fn del(&mut self, container: &str, done: &Arc<Mutex<Vec<Done>>>) {
        let (ipam, done, id) = (self.ipam.clone(), done.clone(), self.id);
        let holds = self.holds.clone();
        let container = container.to_string();
        self.calls.push(tokio::spawn(async move {
            let holds = holds.as_ref();
            let ok = ipool_server::service::fixed::del(&ipam, holds, &key(&container))
                .await
                .is_ok();
            done.lock().expect("done").push(Done::Deleted {
                daemon: id,
                container,
                ok,
            });
        }));
        self.calls.retain(|c| !c.is_finished());
    }

    /// Its cluster sources' blocks, as `ipoolctl status` shows them.
    pub fn detail(&self) -> Vec<String> {
        self.ipam
            .pool_status(Some(NETWORK))
            .into_iter()
            .filter_map(|p| p.detail)
            .collect()
    }

    /// The blocks its cluster sources serve, of every network (confirmed as this node's: in
    /// `ipoolctl status`, "<block> (<n> used)").
    pub fn confirmed_blocks(&self) -> Vec<ipnet::IpNet> {
        self.detail_anywhere()
            .iter()
            .flat_map(|d| d.split([',', ';']).map(str::to_string).collect::<Vec<_>>())
            .filter_map(|b| {
                let b = b.rsplit_once("here: ").map_or(b.trim(), |(_, l)| l);
                let (net, state) = b.split_once(' ')?;
                let used = state.strip_prefix('(')?.strip_suffix(" used)")?;
                used.parse::<u64>().ok()?;
                net.parse().ok()
            })
            .collect()
    }

    /// Its cluster sources' blocks on every network, as `ipoolctl status` shows them.
    pub fn detail_anywhere(&self) -> Vec<String> {
        self.ipam
            .pool_status(None)
            .into_iter()
            .filter_map(|p| p.detail)
            .collect()
    }

    /// The attachments it holds on every network: container and addresses.
    pub fn held_anywhere(&self) -> Vec<(String, Vec<IpAddr>)> {
        self.ipam
            .attachments(None)
            .into_iter()
            .map(|a| (a.key.container_id.clone(), a.addresses.clone()))
            .collect()
    }

    /// The attachments it holds: container and addresses.
    pub fn held(&self) -> Vec<(String, Vec<IpAddr>)> {
        self.ipam
            .attachments(Some(NETWORK))
            .into_iter()
            .map(|a| (a.key.container_id.clone(), a.addresses.clone()))
            .collect()
    }
}

fn key(container: &str) -> AttachmentKey {
    AttachmentKey {
        network: NETWORK.into(),
        container_id: container.to_string(),
        ifname: "eth0".into(),
    }
}

/// A state dir after a crash: what was durable.
pub fn crashed(disk: &MemStore) -> Arc<MemStore> {
    Arc::new(disk.crashed())
}
