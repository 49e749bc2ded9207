//! `ipoolctl cluster ...`: cluster mode's pools and blocks, read and written in its store
//! (etcd or the Kubernetes API) directly (no ipoold involved).

use std::process::ExitCode;

use ipnet::IpNet;
use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::ippool::{PoolChange, PoolSpec, Reserved};
use ipool_server::cluster::vocab::{ClusterError, PoolPhase, DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6};
use ipool_server::range::Family;
use ipool_server::selector::NodeSelector;

use crate::cluster_out::{exit_for, print_blocks, warn_malformed};
pub(super) use crate::cluster_store::StoreArgs;
use crate::{Output, EXIT_USAGE};

#[derive(clap::Subcommand, Debug)]
pub(super) enum ClusterCommand {
    /// Cluster pools: create, list, delete; grow, shrink, disable, enable.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// The pools, how full each is (as `pool list`).
    Pools,
    /// Owned blocks (filters combine).
    Blocks {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        node: Option<String>,
    },
    /// Keep an address (or a range) of a pool from every node from now on: never handed out
    /// (one in use stays with its pod, and is not handed out again once released). Each node
    /// takes it in as soon as its watch says the pool was written.
    Reserve {
        pool: String,
        /// An address (10.244.3.7) or a CIDR (10.244.3.0/28).
        address: String,
        /// Why (shown by `cluster reservations`; at most 256 characters).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// End a reservation (the address or CIDR exactly as reserved).
    Unreserve { pool: String, address: String },
    /// The reservations of every pool (or of one), with the block and node holding each.
    Reservations {
        #[arg(long)]
        pool: Option<String>,
    },
    /// Fixed addresses (pins): the address, its owner (a StatefulSet's ordinal, a VM), the
    /// node(s) holding it and the block it lies in.
    Pins {
        #[arg(long)]
        pool: Option<String>,
    },
    /// End the pin of an address: its block's owner may hand it out again. Refused while a
    /// node holds it, unless that node is gone as release-node judges one (--absent-for, and
    /// its fence); --force unpins it anyway.
    Unpin {
        address: std::net::IpAddr,
        /// Seconds a holding node's daemon must have been away for the pin to end.
        #[arg(long, default_value_t = 0)]
        absent_for: u64,
        #[arg(long)]
        force: bool,
    },
    /// Release departed nodes once, as the daemon that leads this work does (`[cluster]
    /// release_departed_after_secs`): each node owning blocks whose Node the apiserver does not
    /// have and whose daemon has been away past its fence and --after seconds, released as
    /// release-node releases one. For a CronJob where the daemons may not (the Kubernetes API
    /// store's admission policy).
    ReleaseDeparted {
        /// Seconds a departed node's daemon must have been away.
        #[arg(long, default_value_t = 3600)]
        after: u64,
        /// Seconds a pin's owner must have been gone (as the store measures it, from the look
        /// that first found it gone) before a pin nobody holds in a departed node's block ends
        /// [default: --config's [cluster] pin_ttl_secs, else 600].
        #[arg(long)]
        pin_ttl: Option<u64>,
    },
    /// Check the cluster, reading only: blocks of nodes that do not exist, nodes away past
    /// their fence, pods whose addresses lie in another node's block or in no block, an
    /// address on two pods, blocks outside their pool, malformed entries; each with what to
    /// do. The Nodes and pods are read from the apiserver (the store's, or --kubeconfig's).
    /// Exit 0 when clean, 1 with findings.
    Check,
    /// Every node the store knows (a heartbeat, or a block it owns): alive, or away for how
    /// long; its blocks and the addresses they hold; who leads the release of departed nodes.
    Nodes,
    /// Give back every block of a node that is gone. Refused while its daemon's heartbeat
    /// lease lives, or while etcd has seen it within --absent-for seconds (and its fence);
    /// each give-back holds only while the node stays away. --force gives them back anyway
    /// (and reports what it dropped). A block a pin was made in stays; the node's holds on
    /// pins end.
    ReleaseNode {
        #[arg(required_unless_present = "from_check")]
        node: Option<String>,
        /// Release the nodes a check found gone or away (the output of `cluster check -o
        /// json`), each checked again first (its Node still gone, and away as --absent-for
        /// says); not with --force.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["node", "force"])]
        from_check: Option<std::path::PathBuf>,
        /// Seconds the node's daemon must have been away, as etcd counts (its `seen` lease).
        #[arg(long, default_value_t = 3600)]
        absent_for: u64,
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Subcommand, Debug)]
pub(super) enum PoolCommand {
    /// Create a pool of one or more CIDRs (IPv4 and/or IPv6).
    Create {
        name: String,
        #[arg(long = "cidr", required = true)]
        cidrs: Vec<String>,
        /// Block prefix length for IPv4 CIDRs.
        #[arg(long, default_value_t = DEFAULT_BLOCK_V4)]
        block_size: u8,
        /// Block prefix length for IPv6 CIDRs.
        #[arg(long, default_value_t = DEFAULT_BLOCK_V6)]
        block_size_v6: u8,
        /// Ranges never handed out (the service CIDR, say).
        #[arg(long = "exclude")]
        exclude: Vec<String>,
        /// The nodes that may claim from the pool: a label selector over the Node's labels,
        /// as kubectl -l takes one ("zone=a,rack in (r1,r2),!gpu"). Default: every node.
        #[arg(long)]
        node_selector: Option<String>,
        /// Succeed when the pool exists already with exactly this spec (a Job that may run
        /// again); a pool of that name with another spec is still refused.
        #[arg(long)]
        exists_ok: bool,
    },
    /// Each pool: its CIDRs, state, blocks owned and free addresses.
    List,
    /// Delete a pool (refused while any of its blocks is owned).
    Delete { name: String },
    /// Grow a pool by a CIDR (checked for overlap with every pool, as a creation is).
    AddCidr {
        name: String,
        cidr: String,
        /// The prefix length of the blocks of the CIDR's family, for a family the pool has no
        /// CIDR of yet (a single-stack pool made dual-stack); else its blocks keep the size
        /// they have (the pool's from its creation), and a different one is refused.
        #[arg(long, value_name = "PREFIX")]
        block_size: Option<u8>,
    },
    /// Take a CIDR out of a pool (refused while a block of it is owned; nodes claim there no
    /// more). Excluded ranges inside it go with it.
    RemoveCidr { name: String, cidr: String },
    /// No new block is claimed from the pool; its blocks in use keep serving, its empty ones
    /// are given back after the hold-down.
    Disable { name: String },
    /// Blocks are claimed from the pool again.
    Enable { name: String },
    /// Which nodes may claim from the pool from now on: a label selector over the Node's
    /// labels ("zone=a,rack in (r1,r2)"), or --all-nodes. A node that stops matching claims no
    /// new block and gives its empty ones back; addresses in use stay.
    SetNodeSelector {
        name: String,
        #[arg(required_unless_present = "all_nodes", conflicts_with = "all_nodes")]
        selector: Option<String>,
        /// Every node may claim from the pool (no selector).
        #[arg(long)]
        all_nodes: bool,
    },
}

/// An address (as its own CIDR) or a CIDR.
fn parse_address(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

fn parse_nets(what: &str, v: &[String]) -> Result<Vec<IpNet>, String> {
    v.iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|_| format!("{what} {s:?} is not a CIDR"))
        })
        .collect()
}

/// `pool create`: with `exists_ok`, a pool of this name and exactly this spec is success.
async fn create_pool(
    store: &dyn Datastore,
    spec: &PoolSpec,
    exists_ok: bool,
    out: Output,
) -> Result<(), ClusterError> {
    let name = &spec.name;
    if exists_ok {
        let listed = store.pools().await?;
        if let Some(found) = listed.pools.iter().find(|p| p.spec.name == *name) {
            if found.spec != *spec {
                return Err(ClusterError::Refused(format!(
                    "pool {name:?} exists with another spec ({}), not the one asked ({})",
                    serde_json::to_string(&found.spec).unwrap_or_default(),
                    serde_json::to_string(spec).unwrap_or_default()
                )));
            }
            match found.phase {
                PoolPhase::Ready => {
                    if out == Output::Table {
                        outln!("pool {name} exists, as asked");
                    }
                    return Ok(());
                }
                PoolPhase::Deleting => {
                    return Err(ClusterError::Refused(format!(
                        "pool {name:?} is being deleted: create it again once the deletion is done (or refused)"
                    )))
                }
                // Left Pending by a creation that stopped: the creation below finishes it.
                PoolPhase::Pending => {}
            }
        }
    }
    store.create_pool(spec).await?;
    if out == Output::Table {
        outln!("pool {name} created");
    }
    Ok(())
}

pub(super) async fn run(args: &StoreArgs, cmd: &ClusterCommand, out: Output) -> ExitCode {
    let reads_apiserver = matches!(
        cmd,
        ClusterCommand::Check
            | ClusterCommand::ReleaseDeparted { .. }
            | ClusterCommand::ReleaseNode {
                from_check: Some(_),
                ..
            }
    );
    if !reads_apiserver && args.kubeconfig_beside_etcd() {
        eprintln!("ipoolctl: --kubeconfig is for --datastore kubernetes (with etcd, only check, release-departed and release-node --from-check read the apiserver)");
        return ExitCode::from(EXIT_USAGE);
    }
    let (store, place) = match crate::cluster_store::connect(args).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let store = store.as_ref();
    let result = match cmd {
        ClusterCommand::Check => {
            return match crate::cluster_store::apiserver(args).await {
                Ok(client) => crate::check::run(store, place, client, out).await,
                Err(code) => code,
            };
        }
        ClusterCommand::ReleaseDeparted { after, pin_ttl } => {
            let pin_ttl = match pin_ttl
                .map(Ok)
                .or_else(|| args.config_pin_ttl().transpose())
            {
                None => 600,
                Some(Ok(t)) => t,
                Some(Err(e)) => {
                    eprintln!("ipoolctl: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let limits = ipool_server::cluster::departed::Thresholds {
                after: *after,
                pin_ttl,
            };
            return match crate::cluster_store::apiserver(args).await {
                Ok(client) => crate::release::release_departed(store, place, client, limits).await,
                Err(code) => code,
            };
        }
        ClusterCommand::ReleaseNode {
            from_check: Some(file),
            absent_for,
            ..
        } => {
            return match crate::cluster_store::apiserver(args).await {
                Ok(client) => {
                    crate::check::release_from(store, place, client, file, *absent_for, out).await
                }
                Err(code) => code,
            };
        }
        ClusterCommand::Pool(PoolCommand::Create {
            name,
            cidrs,
            block_size,
            block_size_v6,
            exclude,
            node_selector,
            exists_ok,
        }) => {
            let selector = match node_selector.as_deref().map(NodeSelector::parse) {
                None => Ok(None),
                Some(Ok(s)) => Ok(Some(s.to_string())),
                Some(Err(e)) => Err(format!("--node-selector: {e}")),
            };
            let spec = match (
                parse_nets("--cidr", cidrs),
                parse_nets("--exclude", exclude),
                selector,
            ) {
                (Ok(cidrs), Ok(exclude), Ok(node_selector)) => PoolSpec {
                    name: name.clone(),
                    cidrs,
                    block_v4: *block_size,
                    block_v6: *block_size_v6,
                    exclude,
                    node_selector,
                    ..PoolSpec::default()
                },
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                    eprintln!("ipoolctl: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            create_pool(store, &spec, *exists_ok, out).await
        }
        ClusterCommand::Pool(PoolCommand::List) | ClusterCommand::Pools => {
            match store.pools().await {
                Err(e) => Err(e),
                Ok(listed) => store.list_blocks(None, None).await.map(|blocks| {
                    warn_malformed(place, &listed.malformed);
                    warn_malformed(place, &blocks.malformed);
                    crate::pools::print_pools(&listed.pools, &blocks, out);
                }),
            }
        }
        ClusterCommand::Pool(
            c @ (PoolCommand::AddCidr { name, .. }
            | PoolCommand::RemoveCidr { name, .. }
            | PoolCommand::Disable { name }
            | PoolCommand::Enable { name }
            | PoolCommand::SetNodeSelector { name, .. }),
        ) => {
            let change = match c {
                PoolCommand::SetNodeSelector { selector, .. } => {
                    match selector.as_deref().map(NodeSelector::parse) {
                        None => PoolChange::SetNodeSelector(None),
                        Some(Ok(s)) => PoolChange::SetNodeSelector(Some(s.to_string())),
                        Some(Err(e)) => {
                            eprintln!("ipoolctl: {e}");
                            return ExitCode::from(EXIT_USAGE);
                        }
                    }
                }
                PoolCommand::AddCidr { cidr, .. } | PoolCommand::RemoveCidr { cidr, .. } => {
                    let Ok(net) = cidr.parse::<IpNet>() else {
                        eprintln!("ipoolctl: {cidr:?} is not a CIDR");
                        return ExitCode::from(EXIT_USAGE);
                    };
                    match c {
                        PoolCommand::AddCidr { .. } => PoolChange::AddCidr(net),
                        _ => PoolChange::RemoveCidr(net),
                    }
                }
                PoolCommand::Disable { .. } => PoolChange::Disable,
                _ => PoolChange::Enable,
            };
            // The new family's block size first: set while the pool has no CIDR of it (a
            // second run finds it set, and adds the CIDR).
            let sized = match (c, &change) {
                (
                    PoolCommand::AddCidr {
                        block_size: Some(prefix),
                        ..
                    },
                    PoolChange::AddCidr(net),
                ) => {
                    let size = PoolChange::SetBlockSize {
                        family: Family::of(&net.addr()),
                        prefix: *prefix,
                    };
                    store.change_pool(name, &size).await.map(|_| ())
                }
                _ => Ok(()),
            };
            let changed = match sized {
                Ok(()) => store.change_pool(name, &change).await,
                Err(e) => Err(e),
            };
            changed.map(|now| {
                if out == Output::Json {
                    outln!("{}", crate::pools::pool_json(&now, PoolPhase::Ready, None));
                    return;
                }
                outln!("pool {name}: {change} done");
            })
        }
        ClusterCommand::Pool(PoolCommand::Delete { name }) => {
            store.delete_pool(name).await.map(|()| {
                if out == Output::Table {
                    outln!("pool {name} deleted");
                }
            })
        }
        ClusterCommand::Reserve {
            pool,
            address,
            reason,
        } => {
            let Some(cidr) = parse_address(address) else {
                eprintln!("ipoolctl: {address:?} is neither an address nor a CIDR");
                return ExitCode::from(EXIT_USAGE);
            };
            let change = PoolChange::Reserve(Reserved {
                cidr,
                reason: reason.clone(),
            });
            crate::reservations::reserve(store, pool, &change, out).await
        }
        ClusterCommand::Unreserve { pool, address } => {
            let Some(cidr) = parse_address(address) else {
                eprintln!("ipoolctl: {address:?} is neither an address nor a CIDR");
                return ExitCode::from(EXIT_USAGE);
            };
            store
                .change_pool(pool, &PoolChange::Unreserve(cidr))
                .await
                .map(|_| {
                    if out == Output::Table {
                        outln!("pool {pool}: unreserved {cidr}");
                    }
                })
        }
        ClusterCommand::Reservations { pool } => {
            crate::reservations::list(store, place, pool.as_deref(), out).await
        }
        ClusterCommand::Blocks { pool, node } => store
            .list_blocks(pool.as_deref(), node.as_deref())
            .await
            .map(|listed| {
                warn_malformed(place, &listed.malformed);
                print_blocks(&listed.blocks, out)
            }),
        ClusterCommand::Nodes => crate::nodes::list(store, place, out).await,
        ClusterCommand::Pins { pool } => crate::pins::list(store, pool.as_deref(), out).await,
        ClusterCommand::Unpin {
            address,
            absent_for,
            force,
        } => crate::pins::unpin(store, place, *address, *absent_for, *force, out).await,
        ClusterCommand::ReleaseNode {
            node,
            absent_for,
            force,
            ..
        } => {
            let node = node.as_deref().unwrap_or_default();
            crate::release::release_node(store, place, node, *absent_for, *force, out).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            ExitCode::from(exit_for(&e))
        }
    }
}
