use super::*;

#[test]
fn a_seeded_run_replays_and_a_replay_runs_out_into_zeros() {
    let mut a = Choices::seeded(7);
    let drawn: Vec<u32> = (0..20).map(|i| a.pick(3 + i)).collect();
    let mut b = Choices::replay(a.picks());
    let again: Vec<u32> = (0..20).map(|i| b.pick(3 + i)).collect();
    assert_eq!(drawn, again);
    assert_eq!(b.pick(5), 0, "past the end");
}

#[test]
fn depth_first_walks_every_schedule_once() {
    // A tree of two picks of 2 and 3 options: 6 schedules.
    let mut prefix = Vec::new();
    let mut seen = Vec::new();
    loop {
        let mut c = Choices::depth_first(prefix.clone());
        let a = c.pick(2);
        let b = c.pick(3);
        seen.push((a, b));
        match next_prefix(&c.log, 2) {
            Some(p) => prefix = p,
            None => break,
        }
    }
    assert_eq!(seen.len(), 6);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 6);
}

#[test]
fn shrinking_makes_every_step_plain_but_those_that_make_it_fail() {
    // A set-up of 2 picks, steps of 3: fails while step 1 starts with a 3 and step 4
    // with a 7, whatever else.
    let fails = |p: &[u32]| p.get(2 + 3) == Some(&3) && p.get(2 + 3 * 4) == Some(&7);
    let picks = vec![1, 1, 5, 5, 5, 3, 2, 9, 9, 9, 9, 4, 4, 4, 7, 1, 1, 2, 2, 2];
    let small = shrink_steps(picks, 2, 3, fails, 1000);
    assert_eq!(
        small,
        vec![0, 0, 0, 0, 0, 3, 2, 9, 0, 0, 0, 0, 0, 0, 7, 1, 1]
    );
}

#[test]
fn a_frame_takes_its_width_whatever_is_picked_in_it() {
    let mut c = Choices::seeded(3);
    c.frame();
    c.pick(10);
    c.end_frame(5);
    assert_eq!(c.log.len(), 5);
    c.frame();
    c.end_frame(5);
    assert_eq!(c.log.len(), 10);
    assert!(c.log[1..5].iter().all(|(v, n)| (*v, *n) == (0, 1)));
}
