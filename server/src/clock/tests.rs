use super::*;

fn anchor(boot: &str, boot_ms: u64, engine_ms: Millis) -> ClockAnchor {
    ClockAnchor {
        boot_id: boot.into(),
        boot_ms,
        engine_ms,
    }
}

#[test]
fn the_same_boot_continues_the_anchor_whatever_the_wall_clock_says() {
    let a = anchor("b1", 10_000, 1_000_000);
    // 5 s of boot time later; the wall clock was stepped an hour ahead, or two years.
    for wall in [1_000_000 + 3_600_000, 1_000_000 + 63_072_000_000, 5] {
        assert_eq!(
            resumed_time(Some(&a), 0, Some("b1"), 15_000, wall),
            1_005_000
        );
    }
}

#[test]
fn another_boot_starts_at_the_wall_clock_but_never_below_the_high_water_mark() {
    let a = anchor("b1", 10_000, 1_000_000);
    assert_eq!(
        resumed_time(Some(&a), 0, Some("b2"), 50, 2_000_000),
        2_000_000
    );
    // The wall clock is behind what the store holds (a bad RTC): engine time does not go back.
    assert_eq!(
        resumed_time(Some(&a), 1_200_000, Some("b2"), 50, 500),
        1_200_000
    );
    assert_eq!(resumed_time(None, 700, None, 50, 600), 700);
    // An anchor "from the future" of this boot's clock is another boot in disguise.
    assert_eq!(
        resumed_time(Some(&a), 0, Some("b1"), 5_000, 3_000_000),
        3_000_000
    );
}

#[test]
fn the_system_clock_never_goes_backwards() {
    let c = SystemClock::new();
    let a = c.resume(None, u64::MAX / 4, Some("b"));
    let first = c.now_ms();
    assert!(first >= u64::MAX / 4, "resumed above the floor");
    assert!(a.is_some_and(|a| a.engine_ms >= u64::MAX / 4));
    let mut last = first;
    for _ in 0..1000 {
        let now = c.now_ms();
        assert!(now >= last);
        last = now;
    }
}
