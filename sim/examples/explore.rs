use ipool_sim::{run, Choices, Options, StoreKind};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(50);
    let steps: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let bugs: Vec<String> = args
        .get(3)
        .map(|s| s.split(',').map(String::from).collect())
        .unwrap_or_default();
    let t = std::time::Instant::now();
    let mut reqs = 0;
    for seed in 0..n {
        for store in [StoreKind::Etcd, StoreKind::Kube] {
            for dual in [false, true] {
                let mut o = Options::new(seed, store);
                o.steps = steps;
                o.dual_stack = dual;
                let _ = &bugs;
                let out = run(&o, Choices::seeded(seed * 7 + dual as u64));
                reqs += out.requests;
                if let Some(f) = out.failure {
                    println!(
                        "seed {seed} {store:?} dual {dual}: step {} at {} ms: {}",
                        f.step, f.at_ms, f.what
                    );
                }
            }
        }
    }
    println!("{} requests in {:?}", reqs, t.elapsed());
}
