use ipool_sim::{run, Bug, Choices, Options, StoreKind};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let seed: u64 = a[1].parse().unwrap();
    let store = if a[2] == "kube" {
        StoreKind::Kube
    } else {
        StoreKind::Etcd
    };
    let dual = a[3] == "true";
    let steps: u64 = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let tail: usize = a.get(5).and_then(|s| s.parse().ok()).unwrap_or(80);
    let grep = a.get(6).cloned().filter(|g| !g.is_empty());
    let bugs: Vec<Bug> = a
        .get(7)
        .map(|s| s.split(',').filter_map(Bug::named).collect())
        .unwrap_or_default();
    let mut o = Options::new(seed, store);
    o.steps = steps;
    o.dual_stack = dual;
    o.trace = true;
    o.bugs = bugs;
    let pick_seed: u64 = a
        .get(8)
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed * 7 + dual as u64);
    let out = run(&o, Choices::seeded(pick_seed));
    let lines: Vec<&String> = out
        .trace
        .iter()
        .filter(|l| grep.as_ref().is_none_or(|g| l.contains(g.as_str())))
        .collect();
    for l in lines.iter().skip(lines.len().saturating_sub(tail)) {
        println!("{l}");
    }
    println!("{:?}", out.failure);
}
