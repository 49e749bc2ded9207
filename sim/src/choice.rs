//! Where a run's decisions come from. Every decision the simulation makes (which action, which
//! request, which node, how long) is one [`Choices::pick`] among `n` options, and 0 is always
//! the plainest one (deliver the oldest request as it is; let a little time pass). So a run is
//! its list of picks:
//!
//! - [`Choices::seeded`]: drawn from a seed (splitmix64), and recorded;
//! - [`Choices::replay`]: a recorded list played back (past its end, every pick is 0): a run
//!   replays exactly, and a list made shorter or plainer is still a run, which is what
//!   shrinking ([`shrink`]) does;
//! - [`Choices::depth_first`]: the picks of a prefix, then 0 while recording how many options
//!   each of the first `depth` picks had: [`next_prefix`] walks the whole tree of the first
//!   `depth` picks, one run (from the start) per schedule, as shuttle's depth-first scheduler
//!   and stateless model checkers do.

/// A run's picks.
#[derive(Clone, Debug)]
pub struct Choices {
    source: Source,
    /// Every pick made: (value, options).
    pub log: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
enum Source {
    Seeded(u64),
    Replay(Vec<u32>),
}

impl Choices {
    pub fn seeded(seed: u64) -> Choices {
        Choices {
            source: Source::Seeded(seed),
            log: Vec::new(),
        }
    }

    pub fn replay(picks: Vec<u32>) -> Choices {
        Choices {
            source: Source::Replay(picks),
            log: Vec::new(),
        }
    }

    /// The picks of `prefix`, then 0.
    pub fn depth_first(prefix: Vec<u32>) -> Choices {
        Choices::replay(prefix)
    }

    /// A pick among `n` options (`n` at least 1): within `0..n`.
    pub fn pick(&mut self, n: u32) -> u32 {
        let n = n.max(1);
        let v = match &mut self.source {
            Source::Seeded(state) => {
                *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = *state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                (z % u64::from(n)) as u32
            }
            Source::Replay(picks) => picks.get(self.log.len()).copied().unwrap_or(0) % n,
        };
        self.log.push((v, n));
        v
    }

    /// True with odds `num` in `den` (a pick of 0 is false: the plainest).
    pub fn chance(&mut self, num: u32, den: u32) -> bool {
        let v = self.pick(den);
        v != 0 && v <= num
    }

    /// The picks made, as a list a replay takes.
    pub fn picks(&self) -> Vec<u32> {
        self.log.iter().map(|(v, _)| *v).collect()
    }
}

/// The next prefix of a depth-first walk after a run whose first picks were `log` (value,
/// options), `depth` of them counted; None when the tree is walked.
pub fn next_prefix(log: &[(u32, u32)], depth: usize) -> Option<Vec<u32>> {
    let mut picks: Vec<(u32, u32)> = log.iter().take(depth).copied().collect();
    while let Some((v, n)) = picks.pop() {
        if v + 1 < n {
            let mut next: Vec<u32> = picks.iter().map(|(v, _)| *v).collect();
            next.push(v + 1);
            return Some(next);
        }
    }
    None
}

/// Shrinks a failing list of picks: chunks removed, then single picks made 0 or smaller, as
/// long as `fails` still says the run fails; at most `budget` runs.
pub fn shrink(picks: Vec<u32>, mut fails: impl FnMut(&[u32]) -> bool, budget: usize) -> Vec<u32> {
    let mut best = picks;
    let mut runs = 0;
    let mut try_it = |cand: &[u32], runs: &mut usize| -> bool {
        *runs += 1;
        fails(cand)
    };
    // Trailing picks past the failure are never read; drop them at once.
    let mut chunk = (best.len() / 2).max(1);
    while chunk >= 1 && runs < budget {
        let mut i = 0;
        let mut progress = false;
        while i + chunk <= best.len() && runs < budget {
            let mut cand = best.clone();
            cand.drain(i..i + chunk);
            if try_it(&cand, &mut runs) {
                best = cand;
                progress = true;
            } else {
                i += chunk;
            }
        }
        if !progress {
            chunk /= 2;
        }
    }
    for i in 0..best.len() {
        if runs >= budget {
            break;
        }
        if best[i] == 0 {
            continue;
        }
        for smaller in [0, best[i] / 2, best[i] - 1] {
            if smaller >= best[i] {
                continue;
            }
            let mut cand = best.clone();
            cand[i] = smaller;
            if try_it(&cand, &mut runs) {
                best = cand;
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
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
    fn shrinking_keeps_what_makes_it_fail() {
        // Fails when a 7 comes somewhere after a 3.
        let fails = |p: &[u32]| {
            p.iter()
                .position(|v| *v == 3)
                .is_some_and(|i| p[i..].contains(&7))
        };
        let picks = vec![1, 5, 3, 2, 9, 9, 7, 4, 4, 1];
        let small = shrink(picks, fails, 1000);
        assert_eq!(small, vec![3, 7]);
    }
}
