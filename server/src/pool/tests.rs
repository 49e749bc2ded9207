use super::*;
use crate::range::{parse_set, RangeAllocator, RangeSpec};
use proptest::prelude::*;

fn cfg(capacity: usize, cooldown_ms: Millis) -> PoolConfig {
    PoolConfig {
        min_idle: 0,
        max_idle: 4,
        capacity,
        cooldown_ms,
    }
}

fn source(subnet: &str) -> RangeAllocator {
    RangeAllocator::new(
        parse_set(&[RangeSpec {
            subnet: subnet.into(),
            range_start: None,
            range_end: None,
            gateway: None,
        }])
        .expect("valid"),
    )
}

/// The engine's acquisition loop, without I/O: plan, fetch from the source when told, take.
fn acquire(
    pool: &mut Pool<u32>,
    src: &mut RangeAllocator,
    owner: u32,
    now: Millis,
) -> Result<IpAddr, PoolError> {
    let mut dry = false;
    loop {
        match pool.plan(now, dry, |_| true)? {
            Plan::Idle(ip) => {
                pool.take(ip, owner)?;
                return Ok(ip);
            }
            Plan::Source => match src.allocate_next() {
                Some(ip) => pool.admit(ip, Since::Never)?,
                None => dry = true,
            },
        }
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

#[test]
fn fresh_addresses_in_source_order_and_cooldown_respected() {
    let mut pool = Pool::new(cfg(100, 1_000));
    let mut src = source("10.0.0.0/24");
    let a = acquire(&mut pool, &mut src, 1, 0).expect("free");
    assert_eq!(a, ip("10.0.0.2"));
    assert_eq!(pool.put_idle(a, 10), Some(1));
    // Still cooling: a fresh one is taken instead.
    assert_eq!(acquire(&mut pool, &mut src, 2, 20), Ok(ip("10.0.0.3")));
    assert_eq!(pool.cooling(20), 1);
    assert_eq!(
        src.free(),
        251,
        "only one fresh address was drawn from the source"
    );
    // Past the cooldown the released one is reused before any fresh one.
    assert_eq!(acquire(&mut pool, &mut src, 3, 1_010), Ok(a));
}

#[test]
fn least_recently_released_first() {
    let mut pool = Pool::new(cfg(100, 0));
    let mut src = source("10.0.0.0/24");
    let xs: Vec<_> = (0..3)
        .map(|o| acquire(&mut pool, &mut src, o, 0).expect("free"))
        .collect();
    pool.put_idle(xs[2], 5);
    pool.put_idle(xs[0], 6);
    pool.put_idle(xs[1], 7);
    assert_eq!(acquire(&mut pool, &mut src, 9, 100), Ok(xs[2]));
    assert_eq!(acquire(&mut pool, &mut src, 9, 100), Ok(xs[0]));
    assert_eq!(acquire(&mut pool, &mut src, 9, 100), Ok(xs[1]));
}

#[test]
fn cooling_address_is_used_only_when_nothing_else_can_be_had() {
    let mut pool = Pool::new(cfg(2, 60_000));
    let mut src = source("10.0.0.0/24");
    let a = acquire(&mut pool, &mut src, 1, 0).expect("free");
    let _b = acquire(&mut pool, &mut src, 2, 0).expect("free");
    pool.put_idle(a, 1);
    // Capacity 2 is used up (1 idle + 1 in use): the cooling one is the only choice.
    assert_eq!(acquire(&mut pool, &mut src, 3, 2), Ok(a));
    let e = acquire(&mut pool, &mut src, 4, 3).expect_err("exhausted");
    assert!(
        matches!(
            e,
            PoolError::Exhausted {
                in_use: 2,
                capacity: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn dry_source_is_exhaustion_with_counts() {
    let mut pool = Pool::new(cfg(1_000, 0));
    let mut src = source("10.0.0.0/30"); // one address: .2
    acquire(&mut pool, &mut src, 1, 0).expect("free");
    let e = acquire(&mut pool, &mut src, 2, 0).expect_err("exhausted");
    assert_eq!(
        e.to_string(),
        "no address left: 1 in use of capacity 1000, source empty"
    );
}

/// A release at time 0 cools like any other: "never released" is not a time.
#[test]
fn a_release_at_time_zero_cools() {
    let mut pool = Pool::new(cfg(10, 100));
    pool.admit(ip("10.0.0.9"), Since::Never).expect("token");
    assert_eq!(pool.take(ip("10.0.0.9"), 1), Ok(Since::Never));
    assert_eq!(pool.put_idle(ip("10.0.0.9"), 0), Some(1));
    assert_eq!(pool.idle_since(ip("10.0.0.9")), Some(Since::At(0)));
    assert_eq!(pool.cooling(50), 1, "released at 0, cooling until 100");
    assert_eq!(pool.cooling(100), 0);
    assert_eq!(Since::from_stored(Since::At(0).to_stored()), Since::At(1));
    assert_eq!(Since::from_stored(Since::Never.to_stored()), Since::Never);
    assert_eq!(
        pool.admit(ip("10.0.0.9"), Since::Never),
        Err(PoolError::AlreadyHeld(ip("10.0.0.9")))
    );
}

/// After a restart with a lowered capacity, what the store holds comes back whole; the pool
/// takes nothing new until it is under its capacity again, and hands cooled idle addresses back.
#[test]
fn restored_holdings_may_exceed_a_lowered_capacity() {
    let mut pool: Pool<u32> = Pool::new(PoolConfig {
        min_idle: 0,
        max_idle: 8,
        capacity: 2,
        cooldown_ms: 100,
    });
    for i in 1..=3u8 {
        pool.restore_in_use(IpAddr::from([10, 0, 0, i]), u32::from(i))
            .expect("restored");
    }
    pool.restore_idle(ip("10.0.0.9"), Since::At(5))
        .expect("restored");
    assert_eq!((pool.in_use(), pool.idle(), pool.tokens()), (3, 1, 0));
    assert_eq!(
        pool.plan(1000, false, |_| true),
        Ok(Plan::Idle(ip("10.0.0.9"))),
        "a cooled idle address still serves"
    );
    assert_eq!(
        pool.maintenance(1000, false).give_back,
        vec![ip("10.0.0.9")],
        "over capacity: cooled idle addresses go back"
    );
    assert_eq!(pool.maintenance(50, false).give_back, Vec::<IpAddr>::new());
}

#[test]
fn maintenance_preloads_and_trims_only_cooled() {
    let mut pool: Pool<u32> = Pool::new(PoolConfig {
        min_idle: 3,
        max_idle: 4,
        capacity: 5,
        cooldown_ms: 100,
    });
    assert_eq!(pool.maintenance(0, false).fetch, 3);
    assert_eq!(pool.maintenance(0, true).fetch, 0);
    for i in 1..=5u8 {
        pool.admit(IpAddr::from([10, 0, 0, i]), Since::At(i as Millis * 10))
            .expect("token");
    }
    assert_eq!(pool.tokens(), 0);
    // 5 idle, max 4: one to give back, but only once more than 4 have cooled.
    assert_eq!(pool.maintenance(50, false).give_back, Vec::<IpAddr>::new());
    assert_eq!(pool.maintenance(110, false).give_back, Vec::<IpAddr>::new());
    assert_eq!(pool.maintenance(150, false).give_back, vec![ip("10.0.0.1")]);
    assert!(pool.evict(ip("10.0.0.1")));
    assert_eq!(pool.tokens(), 1);
}

/// AWS VPC CNI #2896: cooling addresses counted as available kept the pool from fetching, and
/// pods waited. Here only cooled idle addresses count toward min_idle.
#[test]
fn cooling_addresses_do_not_count_toward_min_idle() {
    let mut pool: Pool<u32> = Pool::new(PoolConfig {
        min_idle: 2,
        max_idle: 4,
        capacity: 10,
        cooldown_ms: 100,
    });
    for i in 1..=3u8 {
        pool.admit(IpAddr::from([10, 0, 0, i]), Since::At(1000))
            .expect("token");
    }
    assert_eq!(pool.cooling(1050), 3);
    assert_eq!(
        pool.maintenance(1050, false).fetch,
        2,
        "3 idle, none usable"
    );
    assert_eq!(
        pool.maintenance(1050, false).give_back,
        Vec::<IpAddr>::new()
    );
    // Once cooled they count: 3 is within [2, 4], nothing to do.
    assert_eq!(pool.maintenance(1100, false), Maintenance::default());
}

#[test]
fn reserved_addresses_hold_a_token_and_are_never_planned() {
    let mut pool: Pool<u32> = Pool::new(PoolConfig {
        min_idle: 0,
        max_idle: 4,
        capacity: 2,
        cooldown_ms: 100,
    });
    pool.admit(ip("10.0.0.1"), Since::Never).expect("token");
    pool.take(ip("10.0.0.1"), 7).expect("idle");
    assert_eq!(pool.reserve(ip("10.0.0.1")), Ok(7));
    assert_eq!(
        pool.reserve(ip("10.0.0.1")),
        Err(PoolError::NotInUse(ip("10.0.0.1")))
    );
    assert_eq!((pool.in_use(), pool.idle(), pool.reserved()), (0, 0, 1));
    assert_eq!(pool.tokens(), 1);
    assert_eq!(
        pool.plan(0, true, |_| true),
        Err(PoolError::Exhausted {
            in_use: 0,
            capacity: 2,
            source_state: "empty"
        })
    );
    assert_eq!(
        pool.admit(ip("10.0.0.1"), Since::Never),
        Err(PoolError::AlreadyHeld(ip("10.0.0.1")))
    );
    // Back to its pod...
    assert!(pool.take_reserved(ip("10.0.0.1"), 8));
    assert_eq!(pool.owner(ip("10.0.0.1")), Some(&8));
    // ...or, once the reservation ends, idle and cooling from then.
    pool.reserve(ip("10.0.0.1")).expect("in use");
    assert!(pool.unreserve(ip("10.0.0.1"), 500));
    assert!(!pool.unreserve(ip("10.0.0.1"), 500));
    assert_eq!(pool.idle_since(ip("10.0.0.1")), Some(Since::At(500)));
    assert_eq!(pool.cooling(550), 1);
    pool.restore_reserved(ip("10.0.0.2")).expect("token");
    assert_eq!((pool.reserved(), pool.tokens()), (1, 0));
}

#[derive(Clone, Debug)]
enum Op {
    Acquire,
    Release(usize),
    Tick(Millis),
    Maintain,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Release),
        2 => (0u64..500).prop_map(Op::Tick),
        1 => Just(Op::Maintain),
    ]
}

proptest! {
    /// Invariants 1, 4 and 5 of design.md under random acquire/release/maintenance sequences.
    #[test]
    fn invariants_hold(
        ops in proptest::collection::vec(arb_op(), 1..300),
        capacity in 1usize..40,
        min_idle in 0usize..6,
        extra_idle in 0usize..6,
        cooldown in 0u64..1_000,
    ) {
        let mut pool = Pool::new(PoolConfig { min_idle, max_idle: min_idle + extra_idle, capacity, cooldown_ms: cooldown });
        let mut src = source("10.9.0.0/27"); // 29 addresses
        let mut now: Millis = 1;
        let mut held: Vec<(IpAddr, u32)> = Vec::new();
        let mut next_owner = 0u32;
        for op in ops {
            match op {
                Op::Acquire => {
                    let before: Vec<(Since, IpAddr)> = pool.idle.iter().copied().collect();
                    let tokens = pool.tokens();
                    let src_free = src.free();
                    next_owner += 1;
                    match acquire(&mut pool, &mut src, next_owner, now) {
                        Ok(ip) => {
                            // 1: never an address that is held.
                            prop_assert!(held.iter().all(|(h, _)| *h != ip), "{ip} handed out twice");
                            if let Some(&(at, _)) = before.iter().find(|(_, i)| *i == ip) {
                                // 4: an idle address is the least recently released one...
                                prop_assert_eq!(before[0].1, ip);
                                // ...and a cooling one only when nothing else could be had.
                                if matches!(at, Since::At(t) if t + cooldown > now) {
                                    prop_assert!(tokens == 0 || src_free == 0);
                                }
                            }
                            held.push((ip, next_owner));
                        }
                        Err(PoolError::Exhausted { .. }) => {
                            prop_assert!(before.is_empty());
                            prop_assert!(tokens == 0 || src_free == 0);
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::Release(i) if !held.is_empty() => {
                    let (ip, owner) = held.swap_remove(i % held.len());
                    prop_assert_eq!(pool.put_idle(ip, now), Some(owner));
                }
                Op::Release(_) => {}
                Op::Tick(d) => now += d,
                Op::Maintain => {
                    let m = pool.maintenance(now, src.free() == 0);
                    for _ in 0..m.fetch {
                        if let Some(ip) = src.allocate_next() {
                            pool.admit(ip, Since::Never).expect("maintenance fetch within tokens");
                        }
                    }
                    for ip in m.give_back {
                        prop_assert!(pool.idle_since(ip).is_some_and(|at| pool.cooled(at, now)));
                        prop_assert!(pool.evict(ip));
                        prop_assert!(src.release(ip));
                    }
                    prop_assert!(pool.idle() <= (min_idle + extra_idle).max(min_idle)
                        || pool.cooling(now) > 0);
                }
            }
            // 5: idle + in use never above capacity; what the pool holds is what the source lent.
            prop_assert!(pool.idle() + pool.in_use() <= capacity);
            prop_assert_eq!(pool.in_use(), held.len());
            prop_assert_eq!((pool.idle() + pool.in_use()) as u128, src.size() - src.free());
        }
    }

    /// Source calls never exceed the bucket's rate: over any prefix, successes <= burst + rate*t.
    #[test]
    fn bucket_never_exceeds_rate(steps in proptest::collection::vec(0u64..300, 1..200), rate in 1u32..50, burst in 1u32..10) {
        let mut b = TokenBucket::new(rate as f64, burst, 0);
        let (mut now, mut ok) = (0u64, 0u64);
        for d in steps {
            now += d;
            if b.try_take(now).is_ok() { ok += 1; }
            prop_assert!(ok as f64 <= burst as f64 + rate as f64 * now as f64 / 1000.0 + 1e-9);
        }
    }
}
