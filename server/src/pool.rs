//! The object pool of one address family of one network, after Terway's `simpleObjectPool`.
//!
//! Pure and deterministic: no I/O, no clock of its own (every call that depends on time takes
//! `now` in Unix milliseconds). The engine drives the address source (the factory) and the
//! store around it.
//!
//! Every address the pool holds is either *idle* (ordered by release time; never-used addresses
//! count as released at 0), *in use* by an owner, or *reserved* (kept for a pod identity that
//! is away; the engine knows for whom). Holding an address costs one capacity token:
//! `idle + in_use + reserved <= capacity` always.
//!
//! Choosing an address (`plan`): the idle address released longest ago, if its cooldown has
//! passed; else a fresh one from the source if a token is left and the source is not dry; else
//! the idle address released longest ago even though it is still cooling (nothing else can be
//! had); else the pool is exhausted.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

mod bucket;
pub use bucket::TokenBucket;

/// Unix time in milliseconds.
pub type Millis = u64;

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
    idle: BTreeSet<(Millis, IpAddr)>,
    idle_since: HashMap<IpAddr, Millis>,
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
    pub fn idle_since(&self, ip: IpAddr) -> Option<Millis> {
        self.idle_since.get(&ip).copied()
    }

    pub fn idle_addresses(&self) -> impl Iterator<Item = (IpAddr, Millis)> + '_ {
        self.idle.iter().map(|(at, ip)| (*ip, *at))
    }

    /// Past its cooldown at `now`. A never-used address (released at 0) always is.
    fn cooled(&self, released_at: Millis, now: Millis) -> bool {
        released_at == 0 || released_at.saturating_add(self.cfg.cooldown_ms) <= now
    }

    /// Decides where the next address comes from. `source_dry` says the source has nothing left.
    pub fn plan(&self, now: Millis, source_dry: bool) -> Result<Plan, PoolError> {
        let oldest = self.idle.first().copied();
        match oldest {
            Some((at, ip)) if self.cooled(at, now) => Ok(Plan::Idle(ip)),
            _ if self.tokens() > 0 && !source_dry => Ok(Plan::Source),
            Some((_, ip)) => Ok(Plan::Idle(ip)),
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

    /// Puts an address fresh from the source into idle, stamped `released_at` (0 for never used).
    /// Takes a capacity token.
    pub fn receive(&mut self, ip: IpAddr, released_at: Millis) -> Result<(), PoolError> {
        if self.idle_since.contains_key(&ip)
            || self.in_use.contains_key(&ip)
            || self.reserved.contains(&ip)
        {
            return Err(PoolError::AlreadyHeld(ip));
        }
        if self.tokens() == 0 {
            return Err(PoolError::NoToken(self.cfg.capacity));
        }
        self.idle.insert((released_at, ip));
        self.idle_since.insert(ip, released_at);
        Ok(())
    }

    /// Moves an idle address to in use. Returns its release time, for `untake`.
    pub fn take(&mut self, ip: IpAddr, owner: O) -> Result<Millis, PoolError> {
        let at = self.idle_since.remove(&ip).ok_or(PoolError::NotIdle(ip))?;
        self.idle.remove(&(at, ip));
        self.in_use.insert(ip, owner);
        Ok(at)
    }

    /// Undoes `take` (when what followed it failed): back to idle with its old release time.
    pub fn untake(&mut self, ip: IpAddr, released_at: Millis) -> Option<O> {
        let owner = self.in_use.remove(&ip)?;
        self.idle.insert((released_at, ip));
        self.idle_since.insert(ip, released_at);
        Some(owner)
    }

    /// Puts an address straight into use (a restart rebuilding the pool). Takes a token.
    pub fn restore_in_use(&mut self, ip: IpAddr, owner: O) -> Result<(), PoolError> {
        self.receive(ip, 0)?;
        self.take(ip, owner).map(|_| ())
    }

    /// In use -> idle, stamped `now`. Returns the owner, or None if `ip` was not in use.
    pub fn release(&mut self, ip: IpAddr, now: Millis) -> Option<O> {
        self.untake(ip, now)
    }

    /// In use -> reserved. Returns the owner it had.
    pub fn reserve(&mut self, ip: IpAddr) -> Result<O, PoolError> {
        let owner = self.in_use.remove(&ip).ok_or(PoolError::NotInUse(ip))?;
        self.reserved.insert(ip);
        Ok(owner)
    }

    /// Puts an address straight into reserved (a restart rebuilding the pool). Takes a token.
    pub fn restore_reserved(&mut self, ip: IpAddr) -> Result<(), PoolError> {
        self.receive(ip, 0)?;
        self.give_back(ip);
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
        self.idle.insert((now, ip));
        self.idle_since.insert(ip, now);
        true
    }

    /// Idle -> back to the source; returns the token. False if `ip` was not idle.
    pub fn give_back(&mut self, ip: IpAddr) -> bool {
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
        let surplus = ready.saturating_sub(self.cfg.max_idle.max(self.cfg.min_idle));
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
