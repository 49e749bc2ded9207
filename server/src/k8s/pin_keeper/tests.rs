use super::*;

fn hold(ordinal: u32, uid: &str) -> HoldKey {
    let owner = PinOwner::StatefulSet {
        namespace: "db".into(),
        name: "web".into(),
        ordinal,
    };
    (owner, uid.to_string(), "10.0.0.1".parse().unwrap())
}

/// A hold is let go once the keeper has seen it unused for the grace, by its own clock:
/// whatever the hold's writer stamped on it (a clock ahead stamps a time to come, which
/// a comparison with now never passes).
#[test]
fn an_unused_hold_is_due_after_the_grace_as_this_keeper_saw_it() {
    let grace = Duration::from_secs(120);
    let t0 = Instant::now();
    let mut unused = Unused::default();
    let (a, b) = (hold(0, "u0"), hold(1, "u1"));
    assert!(unused.due(t0, vec![a.clone()], grace).is_empty());
    let t1 = t0 + Duration::from_secs(60);
    assert!(unused.due(t1, vec![a.clone(), b.clone()], grace).is_empty());
    let t2 = t0 + grace;
    assert_eq!(
        unused.due(t2, vec![a.clone(), b.clone()], grace),
        vec![a.clone()]
    );
    // Used again in between (not seen unused): its count starts over.
    let t3 = t2 + Duration::from_secs(10);
    assert!(unused.due(t3, vec![b.clone()], grace).is_empty());
    let t4 = t1 + grace;
    assert_eq!(unused.due(t4, vec![a.clone(), b.clone()], grace), vec![b]);
    assert!(unused.due(t4, vec![a.clone()], grace).is_empty());
    assert_eq!(unused.due(t4 + grace, vec![a.clone()], grace), vec![a]);
}
