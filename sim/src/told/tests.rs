use super::*;

fn pool(reserved: &[&str], disabled: bool) -> PoolNow {
    PoolNow {
        name: "p".into(),
        cidrs: vec!["10.70.0.0/24".parse().expect("a CIDR")],
        block_v4: 28,
        block_v6: 124,
        kept_out: Vec::new(),
        reserved: reserved
            .iter()
            .map(|r| r.parse().expect("a CIDR"))
            .collect(),
        disabled,
        node_selector: None,
        adding: Vec::new(),
        removing: Vec::new(),
        deleting: false,
        pending: false,
    }
}

fn x() -> IpNet {
    "10.70.0.3/32".parse().expect("a CIDR")
}

fn reserve(told: &mut Told, seq: usize) {
    told.start(
        seq,
        Change::of(vec![Field::Reserved(x())], |said| {
            vec![(
                Field::Reserved(x()),
                if said == "reserved" { "yes" } else { "no" }.into(),
            )]
        }),
    );
}

#[test]
fn a_reservation_acknowledged_and_then_lost_fails() {
    let mut told = Told::default();
    reserve(&mut told, 1);
    told.end(1, "reserve", &Ok("reserved".into()));
    assert!(told.check("p", &[pool(&["10.70.0.3/32"], false)]).is_ok());
    let e = told.check("p", &[pool(&[], false)]).unwrap_err();
    assert!(e.contains("acknowledged change lost"), "{e}");
    // The pool gone altogether loses it too.
    assert!(told.check("p", &[]).is_err());
}

#[test]
fn a_change_of_another_field_overwriting_an_acknowledged_one_fails() {
    let mut told = Told::default();
    reserve(&mut told, 1);
    // A second operator disables the pool meanwhile, and is told so.
    told.start(
        2,
        Change::of(vec![Field::Disabled], |_| {
            vec![(Field::Disabled, "yes".into())]
        }),
    );
    told.end(2, "disable", &Ok("disabled".into()));
    told.end(1, "reserve", &Ok("reserved".into()));
    assert!(told.check("p", &[pool(&["10.70.0.3/32"], true)]).is_ok());
    // The reservation's write, read before the disabling, applied over it.
    assert!(told.check("p", &[pool(&["10.70.0.3/32"], false)]).is_err());
}

#[test]
fn what_a_running_or_failed_command_may_change_is_not_judged() {
    let mut told = Told::default();
    reserve(&mut told, 1);
    told.end(1, "reserve", &Ok("reserved".into()));
    // An unreserve under way: either is right.
    reserve(&mut told, 2);
    assert!(told.check("p", &[pool(&[], false)]).is_ok());
    // It failed: it may have been applied, or may be still.
    told.end(2, "unreserve", &Err("timed out".into()));
    assert!(told.check("p", &[pool(&[], false)]).is_ok());
    assert!(told.check("p", &[pool(&["10.70.0.3/32"], false)]).is_ok());
    // While its write is on its way, a reservation answered does not say what stays.
    told.settle(&[2].into());
    reserve(&mut told, 5);
    told.end(5, "reserve", &Ok("reserved".into()));
    assert!(told.check("p", &[pool(&[], false)]).is_ok());
    // Once it is gone, one does.
    told.settle(&Default::default());
    reserve(&mut told, 6);
    told.end(6, "reserve", &Ok("reserved".into()));
    assert!(told.check("p", &[pool(&[], false)]).is_err());
    // Two at once on one field: the one answered first does not say what stays.
    reserve(&mut told, 3);
    reserve(&mut told, 4);
    told.end(3, "reserve", &Ok("reserved".into()));
    assert!(told.check("p", &[pool(&[], false)]).is_ok());
    told.end(4, "unreserve", &Ok("unreserved".into()));
    assert!(told.check("p", &[pool(&["10.70.0.3/32"], false)]).is_ok());
}

#[test]
fn a_command_of_the_whole_pool_and_a_restore_leave_nothing_known() {
    let mut told = Told::default();
    reserve(&mut told, 1);
    told.end(1, "reserve", &Ok("reserved".into()));
    told.start(2, Change::all());
    assert!(told.check("p", &[]).is_ok());
    told.end(2, "pool delete", &Ok("deleted".into()));
    reserve(&mut told, 3);
    told.end(3, "reserve", &Ok("reserved".into()));
    assert!(told.check("p", &[pool(&[], false)]).is_err());
    told.forget();
    assert!(told.check("p", &[pool(&[], false)]).is_ok());
    // A command that leaves the pool alone changes nothing known.
    reserve(&mut told, 4);
    told.end(4, "reserve", &Ok("reserved".into()));
    told.start(5, Change::none());
    assert!(told.check("p", &[pool(&[], false)]).is_err());
}
