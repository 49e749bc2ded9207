//! The object pool of one address family of one network, after Terway's `simpleObjectPool`.
//!
//! Pure and deterministic: no I/O, no clock of its own (every call that depends on time takes
//! `now` in engine milliseconds). The engine drives the address source and the store around
//! it.
//!
//! Every address the pool holds is either *idle* (ordered by release time; never-used addresses
//! come first, [`Since::Never`]), *in use* by an owner, or *reserved* (kept for a pod identity
//! that is away; the engine knows for whom). Holding an address costs one capacity token:
//! `idle + in_use + reserved <= capacity`, except after a restart with a lowered capacity
//! (what is held is restored whole; the pool takes nothing new until it is under again).
//!
//! The transitions, each named once: `admit` (source -> idle), `take` (idle -> in use),
//! `put_idle` (in use -> idle, stamped), `reserve` (in use -> reserved), `take_reserved`
//! (reserved -> in use), `unreserve` (reserved -> idle, stamped), `evict` (idle -> back to the
//! source).
//!
//! Choosing an address (`plan`): the idle address released longest ago, if its cooldown has
//! passed; else a fresh one from the source if a token is left and the source is not dry; else
//! the idle address released longest ago even though it is still cooling (nothing else can be
//! had); else the pool is exhausted.
//!
//! # Layout
//! - `bucket`: a token bucket in front of an address source.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

mod bucket;
pub use bucket::TokenBucket;

pub use crate::model::Millis;

/// When an idle address was released: never (fresh from the source), or at a time. Never
/// sorts first and is always past its cooldown; a release at any time, 0 included, cools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Since {
    Never,
    At(Millis),
}

impl Since {
    /// As the store keeps it: 0 for never (a real release is stored as at least 1).
    pub fn to_stored(self) -> Millis {
        match self {
            Since::Never => 0,
            Since::At(t) => t.max(1),
        }
    }

    pub fn from_stored(v: Millis) -> Since {
        match v {
            0 => Since::Never,
            t => Since::At(t),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// The background loop keeps at least this many idle addresses (preloading from the source).
    pub min_idle: usize,
    /// Idle addresses beyond this many (and past their cooldown) go back to the source.
    pub max_idle: usize,
    /// Most addresses the pool may hold at once, idle and in use together.
    pub capacity: usize,
    /// How long a released address rests before it is handed out again (while others can be).
    pub cooldown_ms: Millis,
}

/// What `plan` decided for the next acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Take this idle address.
    Idle(IpAddr),
    /// Get a fresh address from the source, `receive` it, then `plan` again.
    Source,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("no address left: {in_use} in use of capacity {capacity}, source {source_state}")]
    Exhausted {
        in_use: usize,
        capacity: usize,
        source_state: &'static str,
    },
    #[error("{0} is not idle in this pool")]
    NotIdle(IpAddr),
    #[error("{0} is already held by this pool")]
    AlreadyHeld(IpAddr),
    #[error("{0} is not in use")]
    NotInUse(IpAddr),
    #[error("no capacity token left (capacity {0})")]
    NoToken(usize),
}

/// Work for the background loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Fetch this many addresses from the source into idle.
    pub fetch: usize,
    /// Give these idle addresses back to the source.
    pub give_back: Vec<IpAddr>,
}

#[derive(Clone, Debug)]
pub struct Pool<O> {
    cfg: PoolConfig,
    /// (released at, address): the first element is the one released longest ago.
    idle: BTreeSet<(Since, IpAddr)>,
    idle_since: HashMap<IpAddr, Since>,
    in_use: HashMap<IpAddr, O>,
    reserved: HashSet<IpAddr>,
}

impl<O: Clone> Pool<O> {
    pub fn new(cfg: PoolConfig) -> Pool<O> {
        Pool {
            cfg,
            idle: BTreeSet::new(),
            idle_since: HashMap::new(),
            in_use: HashMap::new(),
            reserved: HashSet::new(),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    pub fn in_use(&self) -> usize {
        self.in_use.len()
    }

    pub fn idle(&self) -> usize {
        self.idle.len()
    }

    pub fn reserved(&self) -> usize {
        self.reserved.len()
    }

    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        self.reserved.contains(&ip)
    }

    /// Idle addresses still inside their cooldown at `now`.
    pub fn cooling(&self, now: Millis) -> usize {
        self.idle.len() - self.cooled_idle(now)
    }

    /// Idle addresses past their cooldown at `now`: what an ADD can have without waiting.
    /// The idle set is ordered by release time, so they are a prefix of it.
    fn cooled_idle(&self, now: Millis) -> usize {
        self.idle
            .iter()
            .take_while(|(at, _)| self.cooled(*at, now))
            .count()
    }

    /// Capacity tokens left: how many more addresses the pool may take from the source.
    pub fn tokens(&self) -> usize {
        self.cfg
            .capacity
            .saturating_sub(self.idle.len() + self.in_use.len() + self.reserved.len())
    }

    pub fn is_in_use(&self, ip: IpAddr) -> bool {
        self.in_use.contains_key(&ip)
    }

    pub fn owner(&self, ip: IpAddr) -> Option<&O> {
        self.in_use.get(&ip)
    }

    /// When `ip` was released, if it is idle.
    pub fn idle_since(&self, ip: IpAddr) -> Option<Since> {
        self.idle_since.get(&ip).copied()
    }

    pub fn idle_addresses(&self) -> impl Iterator<Item = (IpAddr, Since)> + '_ {
        self.idle.iter().map(|(at, ip)| (*ip, *at))
    }

    /// Past its cooldown at `now`. A never-used address always is.
    pub fn cooled(&self, since: Since, now: Millis) -> bool {
        match since {
            Since::Never => true,
            Since::At(t) => t.saturating_add(self.cfg.cooldown_ms) <= now,
        }
    }

    /// Decides where the next address comes from. `source_dry` says the source has nothing
    /// left; idle addresses that are not `usable` now (their source withholds them) are passed
    /// over.
    pub fn plan(
        &self,
        now: Millis,
        source_dry: bool,
        usable: impl Fn(IpAddr) -> bool,
    ) -> Result<Plan, PoolError> {
        match self.idle.iter().find(|(_, ip)| usable(*ip)).copied() {
            Some((at, ip)) if self.cooled(at, now) => Ok(Plan::Idle(ip)),
            _ if self.tokens() > 0 && !source_dry => Ok(Plan::Source),
            _ => self.fallback(usable).map(Plan::Idle),
        }
    }

    /// What is left when the source cannot serve: the `usable` idle address released longest
    /// ago, cooled or not.
    pub fn fallback(&self, usable: impl Fn(IpAddr) -> bool) -> Result<IpAddr, PoolError> {
        match self.idle.iter().find(|(_, ip)| usable(*ip)).copied() {
            Some((_, ip)) => Ok(ip),
            None => Err(PoolError::Exhausted {
                in_use: self.in_use.len(),
                capacity: self.cfg.capacity,
                source_state: if self.tokens() == 0 {
                    "not asked (no capacity token left)"
                } else {
                    "empty"
                },
            }),
        }
    }

    /// Source -> idle: an address fresh from the source (`Since::Never`) or one coming back
    /// from the store. Takes a capacity token.
    pub fn admit(&mut self, ip: IpAddr, since: Since) -> Result<(), PoolError> {
        if self.holds(ip) {
            return Err(PoolError::AlreadyHeld(ip));
        }
        if self.tokens() == 0 {
            return Err(PoolError::NoToken(self.cfg.capacity));
        }
        self.idle.insert((since, ip));
        self.idle_since.insert(ip, since);
        Ok(())
    }

    /// `ip` is in use, idle or reserved here.
    pub fn holds(&self, ip: IpAddr) -> bool {
        self.idle_since.contains_key(&ip)
            || self.in_use.contains_key(&ip)
            || self.reserved.contains(&ip)
    }

    /// Idle -> in use. Returns when it had been released.
    pub fn take(&mut self, ip: IpAddr, owner: O) -> Result<Since, PoolError> {
        let at = self.idle_since.remove(&ip).ok_or(PoolError::NotIdle(ip))?;
        self.idle.remove(&(at, ip));
        self.in_use.insert(ip, owner);
        Ok(at)
    }

    /// Puts an address straight into idle (a restart rebuilding the pool), whatever the tokens.
    pub fn restore_idle(&mut self, ip: IpAddr, since: Since) -> Result<(), PoolError> {
        if self.holds(ip) {
            return Err(PoolError::AlreadyHeld(ip));
        }
        self.idle.insert((since, ip));
        self.idle_since.insert(ip, since);
        Ok(())
    }

    /// Puts an address straight into use (a restart rebuilding the pool), whatever the tokens:
    /// what the store holds comes back whole even if the capacity was lowered since.
    pub fn restore_in_use(&mut self, ip: IpAddr, owner: O) -> Result<(), PoolError> {
        if self.holds(ip) {
            return Err(PoolError::AlreadyHeld(ip));
        }
        self.in_use.insert(ip, owner);
        Ok(())
    }

    /// In use -> idle, stamped `now`. Returns the owner, or None if `ip` was not in use.
    pub fn put_idle(&mut self, ip: IpAddr, now: Millis) -> Option<O> {
        let owner = self.in_use.remove(&ip)?;
        self.idle.insert((Since::At(now), ip));
        self.idle_since.insert(ip, Since::At(now));
        Some(owner)
    }

    /// In use -> reserved. Returns the owner it had.
    pub fn reserve(&mut self, ip: IpAddr) -> Result<O, PoolError> {
        let owner = self.in_use.remove(&ip).ok_or(PoolError::NotInUse(ip))?;
        self.reserved.insert(ip);
        Ok(owner)
    }

    /// Puts an address straight into reserved (a restart rebuilding the pool), whatever the
    /// tokens.
    pub fn restore_reserved(&mut self, ip: IpAddr) -> Result<(), PoolError> {
        if self.holds(ip) {
            return Err(PoolError::AlreadyHeld(ip));
        }
        self.reserved.insert(ip);
        Ok(())
    }

    /// Reserved -> in use by `owner`. False if `ip` was not reserved.
    pub fn take_reserved(&mut self, ip: IpAddr, owner: O) -> bool {
        if !self.reserved.remove(&ip) {
            return false;
        }
        self.in_use.insert(ip, owner);
        true
    }

    /// Reserved -> idle, stamped `now` (its cooldown starts). False if `ip` was not reserved.
    pub fn unreserve(&mut self, ip: IpAddr, now: Millis) -> bool {
        if !self.reserved.remove(&ip) {
            return false;
        }
        self.idle.insert((Since::At(now), ip));
        self.idle_since.insert(ip, Since::At(now));
        true
    }

    /// Idle -> back to the source; returns the token. False if `ip` was not idle.
    pub fn evict(&mut self, ip: IpAddr) -> bool {
        match self.idle_since.remove(&ip) {
            Some(at) => {
                self.idle.remove(&(at, ip));
                true
            }
            None => false,
        }
    }

    /// What the background loop should do to bring idle within [min_idle, max_idle].
    ///
    /// Both bounds count only addresses past their cooldown: a cooling address cannot serve the
    /// next ADD, so it does not stop the loop from fetching (AWS VPC CNI #2896 counted them and
    /// left pods without addresses), and it is never given back, so the source cannot hand a
    /// just-released address to someone else.
    pub fn maintenance(&self, now: Millis, source_dry: bool) -> Maintenance {
        let ready = self.cooled_idle(now);
        let fetch = if source_dry {
            0
        } else {
            self.cfg.min_idle.saturating_sub(ready).min(self.tokens())
        };
        // Over capacity (lowered since a restart): cooled idle addresses go back first.
        let over = (self.idle.len() + self.in_use.len() + self.reserved.len())
            .saturating_sub(self.cfg.capacity);
        let surplus = ready
            .saturating_sub(self.cfg.max_idle.max(self.cfg.min_idle))
            .max(over.min(ready));
        let give_back = self
            .idle
            .iter()
            .filter(|(at, _)| self.cooled(*at, now))
            .take(surplus)
            .map(|(_, ip)| *ip)
            .collect();
        Maintenance { fetch, give_back }
    }
}

#[cfg(test)]
mod tests;
