//! One address family's pool of a network: the pure [`Pool`], its source ([`Factory`]) and the
//! source's token bucket, and how an address is acquired, claimed and given back.

use std::net::IpAddr;

use super::{Lease, Step};
use crate::config::Tuning;
use crate::factory::Factory;
use crate::pool::{Millis, Plan, Pool, PoolConfig, PoolError, TokenBucket};
use crate::range::Family;

pub(super) struct FamilyPool {
    pub(super) family: Family,
    /// The pool tracks which addresses are in use, not by whom: the engine's attachments say
    /// that, and a second copy of every key would cost memory on a node with many pods.
    pub(super) pool: Pool<()>,
    pub(super) factory: Box<dyn Factory>,
    pub(super) bucket: TokenBucket,
    /// The last time the pool could not serve an acquisition, and why.
    pub(super) last_error: Option<(Millis, String)>,
    /// Addresses asked of the source, times it had none, times its bucket was empty.
    pub(super) source_calls: u64,
    pub(super) source_errors: u64,
    pub(super) bucket_waits: u64,
}

/// How one family's address was obtained, so it can be undone.
#[derive(Clone, Copy, Debug)]
pub(super) enum Origin {
    Idle {
        released_at: Millis,
    },
    Source {
        prev_cursor: Option<IpAddr>,
    },
    /// A requested address claimed straight from the source.
    Claimed,
    /// The address reserved for the pod's identity.
    Reserved,
}

/// Why a requested address could not be claimed.
pub(super) enum ClaimError {
    /// In use by an attachment (the engine finds which).
    Held,
    /// Reserved for another pod identity.
    Reserved,
    NotHandedOut(String),
    Pool(PoolError),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Acquired {
    pub(super) set: usize,
    pub(super) ip: IpAddr,
    pub(super) origin: Origin,
}

// === impl FamilyPool ===

impl FamilyPool {
    pub(super) fn new(
        family: Family,
        factory: Box<dyn Factory>,
        tuning: &Tuning,
        now: Millis,
    ) -> Self {
        let size = usize::try_from(factory.size()).unwrap_or(usize::MAX);
        FamilyPool {
            family,
            pool: Pool::new(PoolConfig {
                min_idle: tuning.min_idle,
                max_idle: tuning.max_idle,
                capacity: tuning.capacity.map_or(size, |c| c.min(size)),
                cooldown_ms: tuning.cooldown_secs.saturating_mul(1000),
            }),
            factory,
            bucket: TokenBucket::new(tuning.source_rate, tuning.source_burst, now),
            last_error: None,
            source_calls: 0,
            source_errors: 0,
            bucket_waits: 0,
        }
    }

    /// One address. `may_wait`: an empty bucket is reported as a wait instead of
    /// treating the source as dry.
    pub(super) fn acquire(
        &mut self,
        set: usize,
        now: Millis,
        may_wait: bool,
    ) -> Result<Step<Acquired>, PoolError> {
        let mut dry = self.factory.free() == 0;
        loop {
            match self.pool.plan(now, dry)? {
                Plan::Idle(ip) => {
                    let released_at = self.pool.take(ip, ())?;
                    return Ok(Step::Done(Acquired {
                        set,
                        ip,
                        origin: Origin::Idle { released_at },
                    }));
                }
                Plan::Source => {
                    if let Err(wait) = self.bucket.try_take(now) {
                        self.bucket_waits += 1;
                        if may_wait {
                            return Ok(Step::Wait(wait));
                        }
                        dry = true;
                        continue;
                    }
                    let prev_cursor = self.factory.cursor();
                    self.source_calls += 1;
                    match self.factory.allocate() {
                        Some(ip) => {
                            self.pool.receive(ip, 0)?;
                            self.pool.take(ip, ())?;
                            return Ok(Step::Done(Acquired {
                                set,
                                ip,
                                origin: Origin::Source { prev_cursor },
                            }));
                        }
                        None => {
                            self.source_errors += 1;
                            dry = true;
                        }
                    }
                }
            }
        }
    }

    /// The requested address `ip`: from idle (even if cooling: it was asked for by
    /// name), or straight from the source.
    pub(super) fn claim(&mut self, set: usize, ip: IpAddr) -> Result<Acquired, ClaimError> {
        if self.pool.is_in_use(ip) {
            return Err(ClaimError::Held);
        }
        if self.pool.is_reserved(ip) {
            return Err(ClaimError::Reserved);
        }
        if self.pool.idle_since(ip).is_some() {
            let released_at = self.pool.take(ip, ()).map_err(ClaimError::Pool)?;
            return Ok(Acquired {
                set,
                ip,
                origin: Origin::Idle { released_at },
            });
        }
        self.source_calls += 1;
        self.factory.occupy(ip).map_err(|e| {
            self.source_errors += 1;
            ClaimError::NotHandedOut(e.to_string())
        })?;
        if let Err(e) = self.pool.receive(ip, 0) {
            self.factory.release(ip);
            return Err(ClaimError::Pool(e));
        }
        self.pool.take(ip, ()).map_err(ClaimError::Pool)?;
        Ok(Acquired {
            set,
            ip,
            origin: Origin::Claimed,
        })
    }

    /// The address `ip`, reserved for the requester's identity, goes into use.
    pub(super) fn take_reserved(&mut self, set: usize, ip: IpAddr) -> Option<Acquired> {
        self.pool.take_reserved(ip, ()).then_some(Acquired {
            set,
            ip,
            origin: Origin::Reserved,
        })
    }

    pub(super) fn unwind(&mut self, a: &Acquired) {
        match a.origin {
            Origin::Reserved => {
                let _ = self.pool.reserve(a.ip);
            }
            Origin::Claimed => {
                self.pool.untake(a.ip, 0);
                self.pool.give_back(a.ip);
                self.factory.release(a.ip);
            }
            Origin::Idle { released_at } => {
                self.pool.untake(a.ip, released_at);
            }
            Origin::Source { prev_cursor } => {
                self.pool.untake(a.ip, 0);
                self.pool.give_back(a.ip);
                self.factory.release(a.ip);
                self.factory.set_cursor(prev_cursor);
            }
        }
    }

    pub(super) fn lease(&self, ip: IpAddr) -> Lease {
        let (prefix_len, gateway) = self
            .factory
            .interface_of(ip)
            .unwrap_or((if ip.is_ipv4() { 32 } else { 128 }, None));
        Lease {
            ip,
            prefix_len,
            gateway,
        }
    }
}
