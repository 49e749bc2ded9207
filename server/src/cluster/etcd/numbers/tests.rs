use super::Numbers;

#[test]
fn numbers_rise_from_the_clock_and_never_repeat() {
    let n = Numbers::new();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let a = n.next();
    let b = n.next();
    assert!(a >= before, "{a} < {before}");
    assert_eq!(b, a + 1);
    // Another sequence starts from the clock, not from this one.
    let other = Numbers::new();
    assert!(other.next() >= before);
}
