use ipool_sim::{run, Bug, Choices, Options, StoreKind};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let max_seeds: u64 = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let steps: u64 = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let only: Option<String> = a.get(3).cloned();
    for bug in Bug::ALL {
        if only.as_ref().is_some_and(|o| o != bug.name()) {
            continue;
        }
        let t = std::time::Instant::now();
        let mut total_steps = 0;
        let mut found = None;
        for seed in 0..max_seeds {
            let store = if seed % 2 == 0 {
                StoreKind::Etcd
            } else {
                StoreKind::Kube
            };
            let mut o = Options::new(seed, store);
            o.steps = steps;
            o.dual_stack = (seed / 2) % 2 == 1;
            o.bugs = vec![*bug];
            let out = run(&o, Choices::seeded(seed * 7 + o.dual_stack as u64));
            total_steps += out.steps;
            if let Some(f) = out.failure {
                found = Some((seed, store, o.dual_stack, f));
                break;
            }
        }
        match found {
            Some((seed, store, dual, f)) => println!("{:28} found: seed {seed} {store:?} dual {dual} step {} ({} steps in all, {:?}): {}", bug.name(), f.step, total_steps, t.elapsed(), f.what),
            None => println!("{:28} NOT found in {max_seeds} seeds ({total_steps} steps, {:?})", bug.name(), t.elapsed()),
        }
    }
}
