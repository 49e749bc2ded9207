use super::*;

#[test]
fn a_suspect_is_due_only_when_seen_missing_twice_a_grace_apart() {
    let mut s = Suspects::default();
    let first = s.check([("a", 0)], 1000);
    assert_eq!(first, vec![("a", 0, 1000)]);
    assert!(
        !Suspects::<&str>::due(1000, 0, 1000, 500),
        "the first sighting"
    );
    let again = s.check([("a", 0)], 1600);
    assert_eq!(again, vec![("a", 0, 1000)]);
    assert!(Suspects::<&str>::due(1000, 0, 1600, 500));
    // Found kept in between: cleared.
    s.check(std::iter::empty(), 1700);
    assert_eq!(s.check([("a", 0)], 1800), vec![("a", 0, 1800)]);
    // Re-created since: a new suspicion.
    assert_eq!(s.check([("a", 1750)], 1900), vec![("a", 1750, 1900)]);
    // Too young, however long it has been missing.
    assert!(!Suspects::<&str>::due(1000, 1500, 1600, 500));
    s.clear(&"a");
    assert!(s.is_empty());
}
