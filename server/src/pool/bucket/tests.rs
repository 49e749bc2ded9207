use super::*;

#[test]
fn burst_then_rate() {
    let mut b = TokenBucket::new(10.0, 3, 1_000);
    for _ in 0..3 {
        assert_eq!(b.try_take(1_000), Ok(()));
    }
    assert_eq!(b.try_take(1_000), Err(100));
    assert_eq!(b.try_take(1_050), Err(50));
    assert_eq!(b.try_take(1_100), Ok(()));
    // A long pause refills only up to the burst.
    assert!((b.level(100_000) - 3.0).abs() < 1e-9);
}

#[test]
fn a_call_that_cannot_wait_takes_a_token_all_the_same() {
    let mut b = TokenBucket::new(10.0, 1, 1_000);
    b.take_now(1_000);
    b.take_now(1_000);
    // Two taken from one: the next waits for two refills.
    assert_eq!(b.try_take(1_000), Err(200));
    assert_eq!(b.try_take(1_200), Ok(()));
}

#[test]
fn clock_going_backwards_does_not_mint_tokens() {
    let mut b = TokenBucket::new(1.0, 1, 5_000);
    assert_eq!(b.try_take(5_000), Ok(()));
    assert!(b.try_take(4_000).is_err());
    assert!(b.try_take(5_500).is_err());
    assert_eq!(b.try_take(6_000), Ok(()));
}
