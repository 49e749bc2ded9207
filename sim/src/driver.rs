//! The run: the daemons started, the steps the picks choose (each checked), the wind-down
//! that heals every fault, and the quiet period whose end the liveness rules judge.

use tokio::time::Instant;

use crate::world::World;
use crate::{Choices, Failure, Options, Outcome};

impl World {
    /// Runs the simulation's steps; the first failure ends it.
    pub async fn run(&mut self) -> Result<(), Failure> {
        for i in 0..self.slots.len() {
            self.start(i).map_err(|e| self.failure(e))?;
        }
        if self.opts.exhaustive {
            crate::actions::boot(self)
                .await
                .map_err(|e| self.failure(e))?;
        }
        while self.step < self.opts.steps {
            self.step += 1;
            self.kubelet.refused.clear();
            self.net.release_held(Instant::now());
            let wait = match self.opts.exhaustive {
                true => crate::actions::act_small(self),
                false => {
                    self.choices.frame();
                    let wait = crate::actions::act(self);
                    self.choices.end_frame(crate::choice::STEP);
                    wait
                }
            }
            .map_err(|e| self.failure(e))?;
            tokio::time::sleep(wait).await;
            // What was answered during the wait is checked against the store as it was then
            // (a lease that ran out meanwhile is gone from then on).
            self.drain().map_err(|e| self.failure(e))?;
            self.shared.expire(Instant::now());
            self.store_check("a lease's expiry", None, None)
                .map_err(|e| self.failure(e))?;
            self.liveness().map_err(|e| self.failure(e))?;
            if self.opts.trace {
                self.trace_blocks();
            }
        }
        crate::actions::wind_down(self)
            .await
            .map_err(|e| self.failure(e))?;
        if self.opts.exhaustive {
            return Ok(());
        }
        crate::quiet::quiet(self).await.map_err(|e| self.failure(e))
    }
}

/// Runs one simulation.
pub fn run(opts: &Options, choices: Choices) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let opts = opts.clone();
    ipool_server::bugs::set(&opts.bugs);
    let out = rt.block_on(async move {
        let mut w = World::new(opts, choices);
        let r = w.run().await;
        let out = w.outcome(r.err());
        for s in w.slots.iter_mut() {
            if let Some(d) = s.daemon.take() {
                d.kill();
            }
        }
        out
    });
    rt.shutdown_background();
    ipool_server::cluster::vocab::set_wall_clock(None);
    ipool_server::bugs::set(&[]);
    out
}
