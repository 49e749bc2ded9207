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
    /// Where the frame under way began (see [`Choices::frame`]).
    frame: usize,
}

/// The picks a step takes, whatever it does (see [`Choices::frame`]).
pub const STEP: usize = 12;

/// The picks a run's set-up takes (its swarm).
pub const SETUP: usize = 20;

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
            frame: 0,
        }
    }

    pub fn replay(picks: Vec<u32>) -> Choices {
        Choices {
            source: Source::Replay(picks),
            log: Vec::new(),
            frame: 0,
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

    /// Starts a frame: what follows until [`Choices::end_frame`] takes exactly `width` picks
    /// (the rest padded with picks of one option), so that each step has picks of its own
    /// and a step made plain (its picks 0) leaves every other step as it was: what shrinking
    /// needs.
    pub fn frame(&mut self) {
        self.frame = self.log.len();
    }

    /// Ends the frame: `width` picks in all.
    pub fn end_frame(&mut self, width: usize) {
        while self.log.len() < self.frame + width {
            self.pick(1);
        }
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

/// Shrinks a run's failing picks made of frames (a set-up of `setup` picks, then steps of
/// `width` picks each: see [`Choices::frame`]), within `budget` runs: the set-up made plain,
/// then steps made plain (all their picks 0), in runs of steps halving down to one, so that
/// what is left is the few steps that make it fail, each still in its place; trailing plain
/// steps dropped.
pub fn shrink_steps(
    picks: Vec<u32>,
    setup: usize,
    width: usize,
    mut fails: impl FnMut(&[u32]) -> bool,
    budget: usize,
) -> Vec<u32> {
    let mut best = picks;
    let mut runs = 0;
    let zeroed = |p: &[u32], from: usize, to: usize| -> Option<Vec<u32>> {
        let to = to.min(p.len());
        (from < to && p[from..to].iter().any(|v| *v != 0)).then(|| {
            let mut c = p.to_vec();
            c[from..to].iter_mut().for_each(|v| *v = 0);
            c
        })
    };
    if let Some(c) = zeroed(&best, 0, setup) {
        runs += 1;
        if fails(&c) {
            best = c;
        }
    }
    let steps = best.len().saturating_sub(setup).div_ceil(width.max(1));
    let mut chunk = (steps / 2).max(1);
    loop {
        let mut k = 0;
        while k < steps && runs < budget {
            let (from, to) = (setup + k * width, setup + (k + chunk) * width);
            if let Some(c) = zeroed(&best, from, to) {
                runs += 1;
                if fails(&c) {
                    best = c;
                }
            }
            k += chunk;
        }
        if chunk == 1 || runs >= budget {
            break;
        }
        chunk /= 2;
    }
    while best.last() == Some(&0) {
        best.pop();
    }
    best
}

#[cfg(test)]
mod tests;
