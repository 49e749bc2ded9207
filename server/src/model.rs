//! The shared types every layer speaks: network definitions and their tuning, attachment and
//! reservation records, and time. A leaf: it imports only address math ([`crate::range`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::range::{parse_set, Range, RangeSpec};

/// A network definition, its ranges or its tuning that is not valid: the message names the
/// table or network and the bad value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Engine time in milliseconds: Unix time when the daemon started, then advanced by the
/// monotonic clock (see [`crate::clock`]).
pub type Millis = u64;

// === attachments and reservations ===

/// The key of an attachment: (network name, CNI_CONTAINERID, CNI_IFNAME).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

impl AttachmentKey {
    /// Store key. The parts never contain NUL (they are validated before they get here).
    pub fn encode(&self) -> Vec<u8> {
        format!("{}\0{}\0{}", self.network, self.container_id, self.ifname).into_bytes()
    }

    /// Checks the three names by the CNI spec's rules.
    pub fn validate(&self) -> Result<(), Invalid> {
        use ipool_proto::names::{check_ifname, check_name};
        check_name("network name", &self.network).map_err(Invalid)?;
        check_name("container ID", &self.container_id).map_err(Invalid)?;
        check_ifname("interface name", &self.ifname).map_err(Invalid)
    }
}

impl std::fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// The pod behind an attachment (from K8S_POD_* in CNI_ARGS); empty strings when unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The cluster pools an ADD may take its addresses from, in the order they are tried, and
/// who chose them ("pod annotation ipool.io/pool", "namespace tenant-a's annotation
/// ipool.io/pools"): each must be one of the pools its network lists. None on a request: the
/// network's pools, in its order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolChoice {
    pub pools: Vec<String>,
    pub from: String,
}

/// What the apiserver said about an attachment's pod at its ADD. Absent without Kubernetes,
/// and for an ADD that is not a pod's (no K8S_POD_NAME: podman, `ctr run --cni`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMeta {
    /// The pod's owner, "StatefulSet/web"; empty when it has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// The pod's addresses wait for it as a reservation when it goes.
    #[serde(default)]
    pub sticky: bool,
    /// How long that reservation lasts (the pod's `ipool.io/sticky-ttl`); None: the
    /// network's `sticky_ttl_secs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky_ttl_secs: Option<u64>,
    /// The owner of the pod's fixed address (`ipool.io/fixed`: "StatefulSet/ns/web/0",
    /// "VirtualMachine/ns/vm"): a cluster pin this node held for the pod at its ADD, ended for
    /// this node at its DEL; its address may be hosted outside this node's blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRecord {
    pub key: AttachmentKey,
    #[serde(default)]
    pub pod: Pod,
    #[serde(default)]
    pub netns: String,
    /// One per range set of the network, in range-set order.
    pub addresses: Vec<IpAddr>,
    pub created_at_ms: Millis,
    /// The pod as the apiserver described it (Kubernetes only): its rules apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s: Option<PodMeta>,
}

/// Whose a reservation is: a pod identity within a network.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReservationKey {
    pub network: String,
    pub namespace: String,
    pub name: String,
}

impl ReservationKey {
    pub fn encode(&self) -> Vec<u8> {
        format!("{}\0{}\0{}", self.network, self.namespace, self.name).into_bytes()
    }
}

impl std::fmt::Display for ReservationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}/{}", self.network, self.namespace, self.name)
    }
}

/// Addresses kept for a pod identity (a sticky pod that went away) until `expires_at_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub key: ReservationKey,
    /// At most one per range set of the network.
    pub addresses: Vec<IpAddr>,
    pub created_at_ms: Millis,
    pub expires_at_ms: Millis,
    /// Why it exists, for operators: "sticky pod deleted", "reboot", ...
    #[serde(default)]
    pub reason: String,
    /// A quarantine: the addresses a live pod (of this UID) reports that the store did not
    /// hold for it. It lasts until that pod is gone, whatever `expires_at_ms` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// Where the engine clock stood at a moment, so that a restart continues it (see
/// [`crate::clock`]). Persisted in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockAnchor {
    /// The machine's boot ID then: the boot-time clock below only compares within one boot.
    pub boot_id: String,
    /// Milliseconds since boot (CLOCK_BOOTTIME) then.
    pub boot_ms: u64,
    /// Engine time then.
    pub engine_ms: Millis,
}

// === networks ===

/// Pool tuning: the `[defaults]` of the daemon's TOML, overridden per network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    pub min_idle: usize,
    pub max_idle: usize,
    /// Most addresses one pool (network and family) holds; absent: the size of its ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<usize>,
    pub cooldown_secs: u64,
    /// Calls per second into the address source, and how many may come at once.
    pub source_rate: f64,
    pub source_burst: u32,
    /// Which pods keep their addresses after a DEL (as a reservation for their namespace/name).
    #[serde(default)]
    pub sticky: Sticky,
    /// How long such a reservation lasts.
    #[serde(default = "default_sticky_ttl")]
    pub sticky_ttl_secs: u64,
}

fn default_sticky_ttl() -> u64 {
    600
}

impl Tuning {
    /// Checks the values; `what` names the table in the message.
    pub fn validate(&self, what: &str) -> Result<(), Invalid> {
        let bad = |m: String| Err(Invalid(format!("{what}: {m}")));
        if self.max_idle < self.min_idle {
            return bad(format!(
                "max_idle ({}) is below min_idle ({})",
                self.max_idle, self.min_idle
            ));
        }
        if self.capacity == Some(0) {
            return bad("capacity must be at least 1".into());
        }
        if !(self.source_rate.is_finite() && self.source_rate > 0.0) {
            return bad(format!(
                "source_rate must be a positive number, not {}",
                self.source_rate
            ));
        }
        if self.source_burst == 0 {
            return bad("source_burst must be at least 1".into());
        }
        if self.sticky != Sticky::None && self.sticky_ttl_secs == 0 {
            return bad("sticky_ttl_secs must be at least 1 when sticky is on".into());
        }
        let bounded = || -> Result<(), Invalid> {
            at_most("min_idle", self.min_idle, MAX_COUNT, "16 Mi addresses")?;
            at_most("max_idle", self.max_idle, MAX_COUNT, "16 Mi addresses")?;
            at_most(
                "capacity",
                self.capacity.unwrap_or(0),
                MAX_COUNT,
                "16 Mi addresses",
            )?;
            at_most("cooldown_secs", self.cooldown_secs, MAX_SECS, "a year")?;
            at_most("sticky_ttl_secs", self.sticky_ttl_secs, MAX_SECS, "a year")
        };
        bounded().map_err(|e| Invalid(format!("{what}: {e}")))
    }
}

/// The longest duration in seconds any setting may have (a year): timers and clocks add them
/// to the current time, and a bigger value is a typo.
pub const MAX_SECS: u64 = 365 * 24 * 3600;
/// The most addresses an idle bound or a capacity may name.
pub const MAX_COUNT: usize = 1 << 24;

/// Refuses `v` above `max` ("`what` must be at most `max` (`meaning`), not `v`").
pub fn at_most<T: PartialOrd + std::fmt::Display>(
    what: &str,
    v: T,
    max: T,
    meaning: &str,
) -> Result<(), Invalid> {
    if v > max {
        return Err(Invalid(format!(
            "{what} must be at most {max} ({meaning}), not {v}"
        )));
    }
    Ok(())
}

/// Which pods are sticky: their address is reserved for their namespace/name when they go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sticky {
    /// Nobody (host-local's behaviour).
    #[default]
    None,
    /// Pods named like a StatefulSet's: `<name>-<ordinal>`.
    StatefulSet,
    /// Every pod with a name.
    All,
}

impl Sticky {
    /// Whether a pod called `name` keeps its address under this policy.
    pub fn applies_to(self, name: &str) -> bool {
        match self {
            Sticky::None => false,
            Sticky::All => !name.is_empty(),
            Sticky::StatefulSet => match name.rsplit_once('-') {
                Some((base, ordinal)) => {
                    !base.is_empty()
                        && !ordinal.is_empty()
                        && ordinal.bytes().all(|b| b.is_ascii_digit())
                        && (ordinal == "0" || !ordinal.starts_with('0'))
                }
                None => false,
            },
        }
    }
}

/// A route as host-local writes it: `{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteSpec {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// Where a network definition came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The daemon's TOML.
    Config,
    /// The `ipam` section of a CNI ADD for a network the daemon did not know.
    Cni,
    /// Ranges given while the daemon runs (`Ipam::set_ranges`: a Node's podCIDRs, flannel's
    /// subnet.env): they stand until the next change, across restarts.
    Runtime,
    /// The daemon's TOML, with `ranges_from`: the network's tuning and routes come from the
    /// config file, its ranges from this node (its Node's podCIDRs, flannel's subnet.env), given
    /// at runtime like [`Origin::Runtime`]'s.
    Node,
}

impl Origin {
    /// For messages: who defined the network.
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Config => "ipoold's config file",
            Origin::Cni => "an earlier CNI config",
            Origin::Runtime => "ranges given at runtime",
            Origin::Node => "ipoold's config file, with ranges from the node",
        }
    }

    /// True when the network's ranges come at runtime: a CNI config naming others is refused.
    pub fn ranges_at_runtime(self) -> bool {
        matches!(self, Origin::Runtime | Origin::Node)
    }

    /// True when ipoold's config file defines the network (its tuning stands).
    pub fn from_config(self) -> bool {
        matches!(self, Origin::Config | Origin::Node)
    }
}

/// The ranges of one range set, validated.
pub type RangeSet = Vec<Range>;

/// The persisted definition of a network: one pool per range set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkDef {
    pub name: String,
    /// The range sets that hand out addresses. Empty: the network's ranges are not known yet
    /// (they come at runtime, see `Ipam::set_ranges`); ADDs wait for them.
    pub range_sets: Vec<Vec<RangeSpec>>,
    /// Range sets the network had before its ranges changed, kept while attachments hold
    /// addresses in them (and not in any current set): DEL and CHECK work for those, nothing
    /// new comes from them. Dropped when the last such address is released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retiring: Vec<Vec<RangeSpec>>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    pub tuning: Tuning,
    pub origin: Origin,
    /// The cluster pool of each range's subnet, for a network with several pools
    /// (`cluster_pools`): of its current and retiring sets. Empty for every other.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set_pools: BTreeMap<String, String>,
    /// A cluster pool's network addressed as one subnet (`addressing = "subnet"`); None: by
    /// block (each node's blocks routed to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_mode: Option<SubnetMode>,
    /// The cluster pools of a network a CNI config declared with `ipam.clusterPool` (its
    /// ranges come from them at runtime); empty for every other (the config file's cluster
    /// networks name theirs there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_pools: Vec<String>,
}

/// `addressing = "subnet"`: a cluster pool's CIDRs are each one L2 subnet shared by the nodes
/// (a secondary network, macvlan, a bridge on a VLAN). Blocks stay how nodes own addresses;
/// a pod gets its pool CIDR's prefix and that CIDR's gateway, every address of a block is
/// handed out but the CIDR's network, broadcast and gateway addresses and the excluded ones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetMode {
    /// At most one per pool CIDR: an address gets the one inside its CIDR, else none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<IpAddr>,
    /// Never handed out, address by address (the blocks holding them serve the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<ipnet::IpNet>,
}

impl SubnetMode {
    /// The gateway of the CIDR `cidr`, if one is configured.
    pub fn gateway_in(&self, cidr: &ipnet::IpNet) -> Option<IpAddr> {
        self.gateways.iter().copied().find(|g| cidr.contains(g))
    }

    /// What does not fit `subnets` (a pool's CIDRs): a gateway in none of them, two gateways
    /// in one, an exclusion in none.
    pub fn misfits(&self, subnets: &[ipnet::IpNet]) -> Vec<String> {
        let mut out = Vec::new();
        for g in &self.gateways {
            if !subnets.iter().any(|s| s.contains(g)) {
                out.push(format!(
                    "gateway {g} is in none of the CIDRs (it is not used)"
                ));
            }
        }
        for s in subnets {
            let inside: Vec<String> = self
                .gateways
                .iter()
                .filter(|g| s.contains(*g))
                .map(|g| g.to_string())
                .collect();
            if inside.len() > 1 {
                out.push(format!(
                    "gateways {} are all in {s} (the first is used; the others are handed out)",
                    inside.join(", ")
                ));
            }
        }
        for x in &self.exclude {
            if !subnets.iter().any(|s| s.contains(x) || x.contains(s)) {
                out.push(format!("exclude {x} is in none of the CIDRs"));
            }
        }
        out
    }

    /// Whether a change from `a` to `b` leaves every address in use as it was given, while
    /// the network holds addresses of the families `held`: the same addressing (one subnet, or
    /// by block), and gateways added or dropped only in a family it holds no address of (a
    /// family added to the pool: none of its addresses was given with or without one here,
    /// and the new gateway is none of them).
    /// The gateways of the held families must stay exactly as they were, in their order too
    /// (of two in one CIDR the first is used, the second handed out).
    pub fn keeps_gateways(
        a: Option<&SubnetMode>,
        b: Option<&SubnetMode>,
        held: &std::collections::BTreeSet<crate::range::Family>,
    ) -> bool {
        let of_held = |m: &SubnetMode| -> Vec<IpAddr> {
            m.gateways
                .iter()
                .copied()
                .filter(|g| held.contains(&crate::range::Family::of(g)))
                .collect()
        };
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => of_held(a) == of_held(b),
            _ => false,
        }
    }

    /// Whether `a` and `b` give every address the same gateway, whatever it holds.
    pub fn same_gateways(a: Option<&SubnetMode>, b: Option<&SubnetMode>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.gateways == b.gateways,
            _ => false,
        }
    }
}

impl NetworkDef {
    /// The validated ranges, one list per range set.
    pub fn ranges(&self) -> Result<Vec<Vec<Range>>, Invalid> {
        validate_ranges(&self.name, &self.range_sets)
    }

    /// The current range sets, validated; none while the ranges are not known yet.
    pub fn current_ranges(&self) -> Result<Vec<RangeSet>, Invalid> {
        match self.range_sets.is_empty() {
            true => Ok(Vec::new()),
            false => self.ranges(),
        }
    }

    /// The current range sets (none while the ranges are not known yet) and then the retiring
    /// ones, validated: no overlap among the current ones, each retiring set valid on its own
    /// (a retiring set may overlap a current one: what it holds there belongs to the current
    /// one).
    pub fn all_ranges(&self) -> Result<(Vec<RangeSet>, Vec<RangeSet>), Invalid> {
        let current = self.current_ranges()?;
        let retiring = self
            .retiring
            .iter()
            .enumerate()
            .map(|(i, set)| {
                parse_set(set).map_err(|e| {
                    Invalid(format!(
                        "network {:?}: retiring ranges[{i}]: {e}",
                        self.name
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((current, retiring))
    }

    /// The cluster pools whose blocks the network holds on this node: those a CNI config
    /// declared it with, and those its current and retiring range sets are of.
    pub fn pools_taken(&self) -> impl Iterator<Item = &String> + '_ {
        self.cluster_pools.iter().chain(self.set_pools.values())
    }

    /// True when both definitions hand out the same addresses. The same spelling (every ADD
    /// of an unchanged conflist) is answered without parsing anything.
    pub fn same_addresses(&self, other: &NetworkDef) -> bool {
        if self.range_sets == other.range_sets {
            return true;
        }
        match (self.ranges(), other.ranges()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }

    /// "[10.1.0.0/24] [fd00::/64]", "none yet" when the ranges are not known yet.
    pub fn describe_ranges(&self) -> String {
        if self.range_sets.is_empty() {
            return "none yet".to_string();
        }
        describe_sets(&self.range_sets)
    }
}

/// "10.1.0.0/24", with what else the spec sets: "10.1.0.0/24 (10.1.0.10-10.1.0.20, gateway
/// 10.1.0.254)".
fn describe_spec(r: &RangeSpec) -> String {
    let some = |v: &Option<String>| {
        v.as_deref()
            .filter(|s| !s.trim().is_empty())
            .map(str::to_string)
    };
    let mut extra = Vec::new();
    match (some(&r.range_start), some(&r.range_end)) {
        (None, None) => {}
        (start, end) => extra.push(format!(
            "{}-{}",
            start.unwrap_or_default(),
            end.unwrap_or_default()
        )),
    }
    if let Some(g) = some(&r.gateway) {
        extra.push(format!("gateway {g}"));
    }
    match extra.is_empty() {
        true => r.subnet.clone(),
        false => format!("{} ({})", r.subnet, extra.join(", ")),
    }
}

/// "[10.1.0.0/24 10.2.0.0/24] [fd00::/64]".
pub fn describe_sets(sets: &[Vec<RangeSpec>]) -> String {
    let sets: Vec<String> = sets
        .iter()
        .map(|set| {
            let rs: Vec<String> = set.iter().map(describe_spec).collect();
            format!("[{}]", rs.join(" "))
        })
        .collect();
    sets.join(" ")
}

fn overlaps(a: &Range, b: &Range) -> bool {
    a.subnet.contains(&b.subnet.network()) || b.subnet.contains(&a.subnet.network())
}

/// Refuses ranges of network `name` that overlap those of another network in `others`: one
/// address handed out in two networks is one address on two pods.
pub fn check_apart<'a>(
    name: &str,
    sets: &[RangeSet],
    others: impl IntoIterator<Item = &'a NetworkDef>,
) -> Result<(), Invalid> {
    for other in others.into_iter().filter(|d| d.name != name) {
        let Ok((current, retiring)) = other.all_ranges() else {
            continue;
        };
        for b in current.iter().chain(&retiring).flatten() {
            if let Some(a) = sets.iter().flatten().find(|a| overlaps(a, b)) {
                return Err(Invalid(format!(
                    "network {name:?}: subnet {} overlaps subnet {} of network {:?} (an address handed out in both would be on two pods)",
                    a.subnet, b.subnet, other.name
                )));
            }
        }
    }
    Ok(())
}

/// Parses and checks range sets: each valid, no two subnets overlapping.
pub fn validate_ranges(network: &str, sets: &[Vec<RangeSpec>]) -> Result<Vec<Vec<Range>>, Invalid> {
    if sets.is_empty() {
        return Err(Invalid(format!(
            "network {network:?} declares no ranges (set ipam.ranges or ipam.subnet)"
        )));
    }
    let parsed = sets
        .iter()
        .enumerate()
        .map(|(i, set)| {
            parse_set(set).map_err(|e| Invalid(format!("network {network:?}: ranges[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let all: Vec<&Range> = parsed.iter().flatten().collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if overlaps(a, b) {
                return Err(Invalid(format!(
                    "network {network:?}: subnets {} and {} overlap",
                    a.subnet, b.subnet
                )));
            }
        }
    }
    Ok(parsed)
}
