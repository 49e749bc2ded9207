use std::time::{Duration, SystemTime};

use super::*;

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn occ(name: &str, refusal: Refusal, secs: u64) -> Occurrence {
    Occurrence {
        pod: pod(name),
        refusal,
        note: format!("{refusal:?} for {name}"),
        at: at(secs),
    }
}

fn writes(o: &[Observed]) -> usize {
    o.iter().filter(|o| matches!(o, Observed::Write(_))).count()
}

#[test]
fn a_crash_loop_costs_a_create_and_a_patch_then_one_write_per_refresh_and_one_at_its_end() {
    let mut s = Series::default();
    let seen: Vec<Observed> = (0..200)
        .map(|i| s.observe(occ("web-0", Refusal::PoolExhausted, i)))
        .collect();
    assert_eq!(writes(&seen), 2, "a create and the series' first patch");
    let Observed::Write(Write::Create(made)) = &seen[0] else {
        panic!("{:?}", seen[0])
    };
    assert!(made.name.starts_with("web-0."), "{}", made.name);
    assert!(
        matches!(&seen[1], Observed::Write(Write::Series { count: 2, .. })),
        "{:?}",
        seen[1]
    );
    assert!(seen[2..].iter().all(|o| *o == Observed::Counted));
    // Going on: nothing at a finish within FINISH of the last; a refresh writes the count.
    assert!(s.finish(at(199 + 60)).is_empty());
    match s.refresh().as_slice() {
        [Write::Series {
            count: 200, last, ..
        }] => assert_eq!(*last, at(199)),
        other => panic!("{other:?}"),
    }
    // Over: counted since the refresh, the final count is written once and the event forgotten.
    s.observe(occ("web-0", Refusal::PoolExhausted, 300));
    assert_eq!(s.finish(at(300 + 359)), vec![], "not over yet");
    match s.finish(at(300 + 360)).as_slice() {
        [Write::Series { count: 201, .. }] => {}
        other => panic!("{other:?}"),
    }
    assert!(s.is_empty());
    // Its next occurrence is a new event.
    assert!(matches!(
        s.observe(occ("web-0", Refusal::PoolExhausted, 1000)),
        Observed::Write(Write::Create(_))
    ));
}

#[test]
fn each_pod_and_reason_is_its_own_event_and_a_single_one_is_forgotten_unwritten() {
    let mut s = Series::default();
    for (name, r) in [
        ("a", Refusal::PoolExhausted),
        ("a", Refusal::NodeFenced),
        ("b", Refusal::PoolExhausted),
    ] {
        assert!(matches!(
            s.observe(occ(name, r, 0)),
            Observed::Write(Write::Create(_))
        ));
    }
    assert_eq!(s.len(), 3);
    assert!(s.refresh().is_empty(), "no series");
    assert!(
        s.finish(at(FINISH.as_secs())).is_empty(),
        "nothing to write"
    );
    assert!(s.is_empty(), "all forgotten");
}

#[test]
fn an_event_not_created_is_made_again_at_its_next_occurrence() {
    let mut s = Series::default();
    let Observed::Write(Write::Create(made)) = s.observe(occ("a", Refusal::PoolDisabled, 0)) else {
        panic!("a create")
    };
    s.not_created(&made);
    assert!(matches!(
        s.observe(occ("a", Refusal::PoolDisabled, 1)),
        Observed::Write(Write::Create(_))
    ));
}

#[test]
fn past_the_limit_a_new_event_is_dropped_and_a_known_one_still_counts() {
    let mut s = Series::default();
    for i in 0..MAX_KEPT {
        s.observe(occ(&format!("p{i}"), Refusal::PoolExhausted, 0));
    }
    assert_eq!(
        s.observe(occ("late", Refusal::PoolExhausted, 1)),
        Observed::Dropped
    );
    assert!(matches!(
        s.observe(occ("p0", Refusal::PoolExhausted, 1)),
        Observed::Write(Write::Series { count: 2, .. })
    ));
}

#[test]
fn names_are_dns_subdomains_within_the_limit() {
    let long = format!("{}-", "a".repeat(260));
    let cut_at_a_dash = format!("{}-{}", "c".repeat(235), "d".repeat(20));
    for pod in ["web-0", &long, &"b".repeat(236), &cut_at_a_dash] {
        let n = name_for(pod, at(5));
        assert!(
            ipool_proto::names::check_kube_name("event name", &n, 253).is_ok(),
            "{n}"
        );
    }
}
