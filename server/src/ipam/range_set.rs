//! One range set of a network: the pure [`Pool`], its [`Source`] and the source's token
//! bucket. Picking an address (`pick*`) decides without taking anything; [`RangeSetPool::take`]
//! takes what was picked, once the store has the change.

use std::net::IpAddr;

use super::diverged::Diverged;
use super::{Lease, Pending, Step};
use crate::error::Refusal;
use crate::model::{Millis, Tuning};
use crate::pool::{Plan, Pool, PoolConfig, PoolError, Since, TokenBucket};
use crate::range::Family;
use crate::source::{Next, Source};
use crate::store::Change;

pub(super) struct RangeSetPool {
    pub(super) family: Family,
    /// The set's id in the store: its ranges (`Source::describe`), which do not depend on
    /// where the set stands among the network's others.
    pub(super) id: String,
    /// The pool tracks which addresses are in use, not by whom: the engine's attachments say
    /// that, and a second copy of every key would cost memory on a node with many pods.
    pub(super) pool: Pool<()>,
    pub(super) source: Box<dyn Source>,
    pub(super) bucket: TokenBucket,
    /// A set the network's ranges no longer name: it takes addresses back, hands none out,
    /// and goes once nothing it holds is in use.
    pub(super) retiring: bool,
    /// The last time the pool could not serve an acquisition, and why.
    pub(super) last_error: Option<(Millis, String)>,
    /// Addresses asked of the source, times it had none, times its bucket was empty.
    pub(super) source_calls: u64,
    pub(super) source_errors: u64,
    pub(super) bucket_waits: u64,
}

/// Where a picked address comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum From {
    /// Idle in the pool.
    Idle,
    /// The source's next address.
    Source,
    /// A requested address, straight from the source.
    Claimed,
    /// The address reserved for the requester's pod.
    Reserved,
    /// A requested address fixed for the requester's pod (a cluster pin), straight from the
    /// source.
    Fixed,
}

/// An address picked for range set `set`, not taken yet.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pick {
    pub(super) set: usize,
    pub(super) ip: IpAddr,
    pub(super) from: From,
}

/// What a requested address is held for.
#[derive(Clone, Copy)]
enum Hold {
    /// To be handed out to the requester (`fixed`: the address is fixed for its pod).
    Requested { fixed: bool },
    /// To be kept from everyone (a quarantine).
    Quarantine,
}

/// Why no address could be picked.
#[derive(Debug)]
pub(super) enum PickError {
    /// Nothing idle, and the source has nothing left.
    Pool(PoolError),
    /// Nothing idle, and the source cannot get more now: why (and what an operator can act
    /// on in it).
    Unavailable(Option<Refusal>, String),
}

impl std::convert::From<PoolError> for PickError {
    fn from(e: PoolError) -> Self {
        PickError::Pool(e)
    }
}

/// Why a requested address cannot be had.
#[derive(Debug)]
pub(super) enum ClaimError {
    /// In use by an attachment (the engine finds which).
    Held,
    /// Reserved for a pod identity.
    Reserved,
    NotHandedOut(String),
    /// The source hands nothing out from where the address is, now: why (and what an
    /// operator can act on in it).
    Unavailable(Option<Refusal>, String),
    Pool(PoolError),
}

// === impl RangeSetPool ===

impl RangeSetPool {
    pub(super) fn new(
        family: Family,
        source: Box<dyn Source>,
        tuning: &Tuning,
        now: Millis,
    ) -> Self {
        let size = usize::try_from(source.size()).unwrap_or(usize::MAX);
        RangeSetPool {
            family,
            id: source.describe(),
            pool: Pool::new(PoolConfig {
                min_idle: tuning.min_idle,
                max_idle: tuning.max_idle,
                capacity: tuning.capacity.map_or(size, |c| c.min(size)),
                cooldown_ms: tuning.cooldown_secs.saturating_mul(1000),
            }),
            source,
            bucket: TokenBucket::new(tuning.source_rate, tuning.source_burst, now),
            retiring: false,
            last_error: None,
            source_calls: 0,
            source_errors: 0,
            bucket_waits: 0,
        }
    }

    /// Picks the next address: a cooled idle one, else the source's next (through the bucket),
    /// else a cooling one. `may_wait`: an empty bucket or a source whose addresses are on
    /// their way is reported as a wait instead of settling for a cooling address. Takes
    /// nothing (the bucket's token is spent).
    pub(super) fn pick(
        &mut self,
        set: usize,
        now: Millis,
        may_wait: bool,
    ) -> Result<Step<Pick>, PickError> {
        let idle = |ip| Pick {
            set,
            ip,
            from: From::Idle,
        };
        match self.source.blocks().and_then(|b| b.held_back()) {
            Some(Next::Pending(why)) if may_wait => return Ok(Step::Pending(Pending::new(why))),
            Some(n) => {
                if let Some((refusal, why)) = n.why_not() {
                    return Err(PickError::Unavailable(refusal, why));
                }
            }
            None => {}
        }
        let next = self.source.next();
        let source = &self.source;
        let lost_idle_served = crate::bugs::on(crate::bugs::Bug::LostIdleServed);
        let usable =
            |ip| lost_idle_served || source.blocks().and_then(|b| b.withheld(ip)).is_none();
        if let Plan::Idle(ip) = self.pool.plan(now, next == Next::Exhausted, usable)? {
            return Ok(Step::Done(idle(ip)));
        }
        // The pool asks the source (it has a token, and no cooled idle address).
        let why = match next {
            // A source that offers what this pool holds has lost track of it: nothing is taken
            // (no change set names it twice), and the ADD is refused saying so.
            Next::Ready(ip) if self.pool.holds(ip) => {
                self.source_errors += 1;
                tracing::error!(%ip, ranges = %self.source.describe(), "the source offered an address this pool holds: refused (a bug)");
                Some((
                    None,
                    format!(
                        "internal: its source offered {ip}, which is held here already; nothing was handed out"
                    ),
                ))
            }
            Next::Ready(ip) => match self.bucket.try_take(now) {
                Ok(()) => {
                    self.source_calls += 1;
                    return Ok(Step::Done(Pick {
                        set,
                        ip,
                        from: From::Source,
                    }));
                }
                Err(wait) => {
                    self.bucket_waits += 1;
                    if may_wait {
                        return Ok(Step::Wait(wait));
                    }
                    Some((
                        None,
                        format!(
                            "its source is rate-limited (source_rate {}/s, source_burst {}): the next call is allowed in {wait} ms",
                            self.bucket.rate(),
                            self.bucket.burst()
                        ),
                    ))
                }
            },
            Next::Pending(why) if may_wait => return Ok(Step::Pending(Pending::new(why))),
            Next::Pending(why) | Next::Unavailable(why) => {
                self.source_errors += 1;
                Some((None, why))
            }
            Next::Refused(refusal, why) => {
                self.source_errors += 1;
                Some((Some(refusal), why))
            }
            Next::Exhausted => None,
        };
        // Settle for a cooling address.
        let source = &self.source;
        match (
            self.pool.fallback(|ip| {
                lost_idle_served || source.blocks().and_then(|b| b.withheld(ip)).is_none()
            }),
            why,
        ) {
            (Ok(ip), _) => Ok(Step::Done(idle(ip))),
            (Err(_), Some((refusal, why))) => Err(PickError::Unavailable(refusal, why)),
            (Err(e), None) => Err(PickError::Pool(e)),
        }
    }

    /// Picks the requested address `ip`: from idle (even if cooling: it was asked for by
    /// name), or straight from the source. Nothing is picked where the source hands nothing
    /// out now.
    /// `fixed`: the address is fixed for the requester's pod (see [`crate::source::BlockSource::can_occupy_fixed`]).
    pub(super) fn pick_requested(
        &mut self,
        set: usize,
        ip: IpAddr,
        fixed: bool,
    ) -> Result<Pick, ClaimError> {
        if let Some((refusal, why)) = self
            .source
            .blocks()
            .and_then(|b| b.held_back())
            .and_then(Next::why_not)
        {
            return Err(ClaimError::Unavailable(refusal, why));
        }
        self.pick_to_hold(set, ip, Hold::Requested { fixed })
    }

    /// Picks `ip` to be kept for a live pod (a quarantine): wherever the source holds it, even
    /// where it hands nothing out now (keeping an address from everyone is always safe).
    pub(super) fn pick_quarantined(&mut self, set: usize, ip: IpAddr) -> Result<Pick, ClaimError> {
        self.pick_to_hold(set, ip, Hold::Quarantine)
    }

    /// Whether `ip` may be handed out now to the pod it is fixed for (`fixed`), or to anyone.
    fn withheld(&self, ip: IpAddr, fixed: bool) -> Option<String> {
        match fixed {
            true => self.source.blocks().and_then(|b| b.withheld_fixed(ip)),
            false => self.source.blocks().and_then(|b| b.withheld(ip)),
        }
    }

    fn pick_to_hold(&mut self, set: usize, ip: IpAddr, hold: Hold) -> Result<Pick, ClaimError> {
        let (keep, fixed) = match hold {
            Hold::Quarantine => (true, false),
            Hold::Requested { fixed } => (false, fixed),
        };
        if self.pool.is_in_use(ip) {
            return Err(ClaimError::Held);
        }
        if self.pool.is_reserved(ip) {
            return Err(ClaimError::Reserved);
        }
        if self.pool.idle_since(ip).is_some() {
            if let Some(why) = self.withheld(ip, fixed).filter(|_| !keep) {
                return Err(ClaimError::Unavailable(None, why));
            }
            return Ok(Pick {
                set,
                ip,
                from: From::Idle,
            });
        }
        self.source_calls += 1;
        let can = match (keep, fixed) {
            (true, _) => self.source.can_hold(ip),
            (false, true) => match self.source.blocks() {
                Some(b) => b.can_occupy_fixed(ip),
                None => self.source.can_occupy(ip),
            },
            (false, false) => self.source.can_occupy(ip),
        };
        if let Err(e) = can {
            self.source_errors += 1;
            return Err(match e {
                crate::range::OccupyError::Withheld(_, why) => ClaimError::Unavailable(None, why),
                e => ClaimError::NotHandedOut(e.to_string()),
            });
        }
        if self.pool.tokens() == 0 {
            return Err(ClaimError::Pool(PoolError::NoToken(
                self.pool.config().capacity,
            )));
        }
        Ok(Pick {
            set,
            ip,
            from: match fixed {
                true => From::Fixed,
                false => From::Claimed,
            },
        })
    }

    /// Picks `ip`, reserved for the requester's pod, if it is reserved here and its source
    /// hands it out now (else the pod gets another address, or waits with the rest while its
    /// source holds everything back).
    /// `fixed`: as in [`RangeSetPool::pick_requested`].
    pub(super) fn pick_reserved(&self, set: usize, ip: IpAddr, fixed: bool) -> Option<Pick> {
        let serves = self.source.blocks().and_then(|b| b.held_back()).is_none()
            && self.withheld(ip, fixed).is_none();
        (serves && self.pool.is_reserved(ip)).then_some(Pick {
            set,
            ip,
            from: From::Reserved,
        })
    }

    /// Takes what `pick` picked into use. Fails only if the pool changed since the pick.
    pub(super) fn take(&mut self, pick: &Pick) -> Result<(), Diverged> {
        let ip = pick.ip;
        let taken = match pick.from {
            From::Idle => self.pool.take(ip, ()).map(|_| ()),
            From::Reserved => {
                if self.pool.take_reserved(ip, ()) {
                    Ok(())
                } else {
                    Err(PoolError::NotIdle(ip))
                }
            }
            From::Source | From::Claimed | From::Fixed => {
                let occupied = match pick.from {
                    From::Source => self.source.take_next(ip),
                    From::Fixed => match self.source.blocks_mut() {
                        Some(b) => b.occupy_fixed(ip),
                        None => self.source.occupy(ip),
                    },
                    _ => self.source.occupy(ip),
                };
                occupied.map_err(|e| Diverged(e.to_string()))?;
                self.pool
                    .admit(ip, Since::Never)
                    .and_then(|()| self.pool.take(ip, ()).map(|_| ()))
            }
        };
        taken.map_err(|e| Diverged(format!("taking {ip}: {e}")))
    }

    /// What taking `pick` changes in the store besides the attachment, added to `out`: an idle
    /// entry gone, or the source's cursor moved on (and the block the address comes from, the
    /// first time one is taken from it).
    pub(super) fn store_changes(&self, network: &str, pick: &Pick, out: &mut Vec<Change>) {
        match pick.from {
            From::Idle => out.push(Change::DeleteIdle {
                network: network.to_string(),
                ip: pick.ip,
            }),
            From::Source => out.push(Change::PutCursor {
                network: network.to_string(),
                set: self.id.clone(),
                cursor: Some(pick.ip),
            }),
            From::Claimed | From::Reserved | From::Fixed => {}
        }
        if matches!(pick.from, From::Source | From::Claimed | From::Fixed) {
            self.block_change(network, pick.ip, out);
        }
    }

    /// Records the block `ip` comes from, if the store does not hold it yet.
    pub(super) fn block_change(&self, network: &str, ip: IpAddr, out: &mut Vec<Change>) {
        if let Some(block) = self.source.blocks().and_then(|b| b.unrecorded(ip)) {
            let change = Change::PutBlock {
                network: network.to_string(),
                set: self.id.clone(),
                block: block.to_string(),
                held: true,
            };
            // Two addresses of one change set may come from the same new block.
            if !out.contains(&change) {
                out.push(change);
            }
        }
    }

    pub(super) fn lease(&self, ip: IpAddr) -> Lease {
        let (prefix_len, gateway) = self
            .source
            .interface_of(ip)
            .unwrap_or((if ip.is_ipv4() { 32 } else { 128 }, None));
        Lease {
            ip,
            prefix_len,
            gateway,
        }
    }

    /// "pool "n" IPv4 (10.1.0.1-10.1.0.254)", for messages.
    pub(super) fn describe(&self, network: &str) -> String {
        format!(
            "pool {network:?} IPv{} ({})",
            self.family.as_str(),
            self.source.describe()
        )
    }
}
