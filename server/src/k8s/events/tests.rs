use super::*;

#[test]
fn a_note_says_what_to_do_and_stays_within_the_apiservers_limit() {
    let n = note(Refusal::PoolDisabled, "cluster pool \"p\" is disabled");
    assert!(n.contains("ipoolctl cluster pool enable"), "{n}");
    let long = note(Refusal::PoolExhausted, &"é".repeat(2000));
    assert!(
        long.len() <= NOTE_MAX && long.ends_with("..."),
        "{}",
        long.len()
    );
}
