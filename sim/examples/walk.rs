use ipool_sim::{search, StoreKind};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let depth: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let secs: u64 = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let store = if a.get(3).map(String::as_str) == Some("kube") {
        StoreKind::Kube
    } else {
        StoreKind::Etcd
    };
    let bugs: Vec<ipool_sim::Bug> = a
        .get(4)
        .map(|s| s.split(',').filter_map(ipool_sim::Bug::named).collect())
        .unwrap_or_default();
    let w = search::exhaustive(store, depth, &bugs, std::time::Duration::from_secs(secs));
    println!(
        "{store:?} depth {depth}: {} schedules in {:?}, complete {}, failure {:?}",
        w.schedules,
        w.elapsed,
        w.complete,
        w.failure.map(|(p, o)| (p, o.failure))
    );
}
