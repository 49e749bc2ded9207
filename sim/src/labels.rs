//! Node labels and a pool's nodeSelector (runs with [`Options::labels`](crate::Options::labels)):
//! each node is in zone `a` or `b` (its Node's label `zone`), a node's
//! label changes now and then (its daemon told at once, as ipoold's watch of its Node tells
//! `ClusterNode::set_labels`; a daemon that starts is told before it serves, as ipoold reads
//! its Node first), and the operator sets the pool's nodeSelector (`ipoolctl cluster pool
//! set-node-selector`, through the store as any command). A node the selector leaves out
//! hands nothing new out from the pool and gives its empty blocks back: the liveness rules
//! judge that (L1: no block it keeps without a pod), and an ADD refused there is no stuck ADD
//! (L4 counts only the pools that admit the node).

use std::collections::BTreeMap;

use ipool_server::cluster::ippool::PoolChange;
use ipool_server::selector::NodeSelector;

use crate::store::PoolNow;
use crate::world::World;
use crate::POOL;

/// The label's name, and the selectors the operator sets (None: every node).
const LABEL: &str = "zone";
const SELECTORS: [Option<&str>; 3] = [None, Some("zone=a"), Some("zone=b")];

/// Node `name`'s labels now: zone `a` for the first node, `b` for the second, and so on, each
/// flipped as often as the run flipped it.
pub(crate) fn labels_of(w: &World, name: &str) -> BTreeMap<String, String> {
    let zone = w
        .zones
        .get(name)
        .copied()
        .unwrap_or_else(|| first_zone(w, name));
    [(LABEL.to_string(), zone.to_string())].into()
}

fn first_zone(w: &World, name: &str) -> &'static str {
    match w.slots.iter().position(|s| s.name == name).unwrap_or(0) % 2 {
        0 => "a",
        _ => "b",
    }
}

/// Whether `pool`'s nodeSelector admits node `name` as it is labelled now (a selector that
/// cannot be read admits none, as the daemons read it).
pub(crate) fn admits(w: &World, pool: &PoolNow, name: &str) -> bool {
    match &pool.node_selector {
        None => true,
        Some(text) => NodeSelector::parse(text).is_ok_and(|s| s.matches(&labels_of(w, name))),
    }
}

/// Tells slot `i`'s daemon its node's labels (at its start, and when they change).
pub(crate) fn tell(w: &World, i: usize) {
    if !w.opts.labels {
        return;
    }
    if let Some(d) = &w.slots[i].daemon {
        d.node.set_labels(labels_of(w, &w.slots[i].name));
    }
}

/// One step: a node's label flipped, or the pool's nodeSelector set by the operator.
pub(crate) fn step(w: &mut World) {
    match w.choices.pick(2) {
        0 => relabel(w),
        _ => select(w),
    }
}

fn relabel(w: &mut World) {
    let i = w.choices.pick(w.opts.nodes as u32) as usize;
    let name = w.slots[i].name.clone();
    let now = match labels_of(w, &name)[LABEL].as_str() {
        "a" => "b",
        _ => "a",
    };
    w.zones.insert(name.clone(), now);
    w.note(format!("node {name} labelled {LABEL}={now}"));
    // Every daemon under the name (a second one too) watches the same Node.
    for k in 0..w.slots.len() {
        if w.slots[k].name == name {
            tell(w, k);
        }
    }
}

fn select(w: &mut World) {
    if w.operator.running.is_some() {
        return;
    }
    let sel = SELECTORS[w.choices.pick(SELECTORS.len() as u32) as usize].map(str::to_string);
    let what = match &sel {
        Some(s) => format!("pool set-node-selector {POOL} {s}"),
        None => format!("pool set-node-selector {POOL} (none)"),
    };
    let told = format!("{sel:?}");
    let change = crate::told::Change::of(vec![crate::told::Field::Selector], move |_| {
        vec![(crate::told::Field::Selector, told.clone())]
    });
    crate::operator::command(w, what, change, move |s| async move {
        s.change_pool(POOL, &PoolChange::SetNodeSelector(sel))
            .await
            .map(|_| "set".to_string())
    });
}
