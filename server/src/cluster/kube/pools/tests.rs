use super::*;

#[test]
fn a_pool_overlapping_another_of_any_phase_is_refused() {
    let pool = |name: &str, cidr: &str| PoolSpec {
        name: name.into(),
        cidrs: vec![cidr.parse().unwrap()],
        block_v4: 26,
        block_v6: 122,
        exclude: vec![],
        ..PoolSpec::default()
    };
    let me = pool("a", "10.0.0.0/16");
    for phase in [PoolPhase::Pending, PoolPhase::Ready, PoolPhase::Deleting] {
        let others = [(pool("b", "10.0.128.0/17"), phase, String::new())];
        let why = overlap(&me, &others, &[]).expect("overlaps");
        assert!(why.contains("overlaps 10.0.128.0/17"), "{why}");
    }
    let others = [(pool("b", "10.1.0.0/16"), PoolPhase::Ready, String::new())];
    assert_eq!(overlap(&me, &others, &[]), None);
    // Itself (its own name) is no other pool.
    let others = [(me.clone(), PoolPhase::Pending, String::new())];
    assert_eq!(overlap(&me, &others, &[]), None);
}
