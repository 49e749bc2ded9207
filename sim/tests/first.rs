use ipool_sim::{run, Choices, Options, StoreKind};

#[test]
fn replays() {
    for store in [StoreKind::Etcd, StoreKind::Kube] {
        let mut o = Options::new(1, store);
        o.steps = 20000;
        let a = run(&o, Choices::seeded(1));
        let b = run(&o, Choices::replay(a.picks.clone()));
        eprintln!(
            "{store:?}: {} / {} steps, {} / {} requests, {:?} / {:?}",
            a.steps,
            b.steps,
            a.requests,
            b.requests,
            a.failure.as_ref().map(|f| f.step),
            b.failure.as_ref().map(|f| f.step)
        );
        assert_eq!((a.steps, a.requests, a.adds), (b.steps, b.requests, b.adds));
    }
}
