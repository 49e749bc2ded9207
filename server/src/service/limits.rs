//! How much of ipoold operators' reads may take, so that they never starve the CNI path: the
//! number of read calls running at once (each page of `ListAllocations` is copied on a
//! blocking thread, not on the runtime's, which serves the CNI calls), the number of `Watch`
//! streams, and, over TCP, how many of each one peer address may hold. Past a limit a call
//! is refused at once with RESOURCE_EXHAUSTED naming it: a caller retries, nothing queues.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::pool::TokenBucket;
use tonic::{Request, Status};

/// Read calls running at once on one listener, and per TCP peer address.
pub const MAX_READS: usize = 8;
pub const MAX_READS_PER_PEER: usize = 2;
/// `Watch` streams open at once on one listener, and per TCP peer address.
pub const MAX_WATCHERS: usize = 64;
pub const MAX_WATCHERS_PER_PEER: usize = 8;

/// Slots held per (peer address, kind of call).
type PeerCounts = Arc<Mutex<HashMap<(IpAddr, Kind), usize>>>;

/// Pages of `ListAllocations` (and lists of reservations) served per second over TCP, and how
/// many may come at once: a full listing of 20 000 attachments takes a second; a flood of
/// them takes no more of the daemon than that. A call over the rate waits for its turn
/// (holding its slot).
pub const TCP_PAGES_PER_SEC: f64 = 20.0;
pub const TCP_PAGES_BURST: u32 = 10;

/// One listener's limits.
#[derive(Clone)]
pub struct Limits {
    reads: Arc<Semaphore>,
    watchers: Arc<Semaphore>,
    /// Per peer address (TCP only: on the Unix socket every caller is local).
    per_peer: Option<PeerCounts>,
    /// TCP only: the pace of large reads ([`TCP_PAGES_PER_SEC`]).
    pages: Option<Arc<Mutex<(TokenBucket, Instant)>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Read,
    Watch,
}

/// What a call holds while it runs (a stream: while it is open).
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    _peer: Option<PeerSlot>,
}

struct PeerSlot {
    map: PeerCounts,
    key: (IpAddr, Kind),
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl Limits {
    /// Limits for the Unix socket (`tcp` false) or a TCP listener.
    pub fn new(tcp: bool) -> Limits {
        Limits {
            reads: Arc::new(Semaphore::new(MAX_READS)),
            watchers: Arc::new(Semaphore::new(MAX_WATCHERS)),
            per_peer: tcp.then(Arc::default),
            pages: tcp.then(|| {
                Arc::new(Mutex::new((
                    TokenBucket::new(TCP_PAGES_PER_SEC, TCP_PAGES_BURST, 0),
                    Instant::now(),
                )))
            }),
        }
    }

    /// Waits for the turn of a large read (a page of allocations) over TCP.
    pub async fn pace(&self) {
        let Some(pages) = &self.pages else {
            return;
        };
        loop {
            let wait = {
                let mut b = pages.lock().unwrap_or_else(|p| p.into_inner());
                let now = b.1.elapsed().as_millis() as u64;
                match b.0.try_take(now) {
                    Ok(()) => return,
                    Err(ms) => ms.max(1),
                }
            };
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
    }

    /// A slot for a read call, or RESOURCE_EXHAUSTED.
    pub fn read<T>(&self, req: &Request<T>, call: &str) -> Result<Slot, Status> {
        self.take(req, call, Kind::Read)
    }

    /// A slot for a `Watch` stream, or RESOURCE_EXHAUSTED.
    pub fn watch<T>(&self, req: &Request<T>) -> Result<Slot, Status> {
        self.take(req, "Watch", Kind::Watch)
    }

    fn take<T>(&self, req: &Request<T>, call: &str, kind: Kind) -> Result<Slot, Status> {
        let (sem, max, per_peer_max, what) = match kind {
            Kind::Read => (&self.reads, MAX_READS, MAX_READS_PER_PEER, "read calls"),
            Kind::Watch => (
                &self.watchers,
                MAX_WATCHERS,
                MAX_WATCHERS_PER_PEER,
                "Watch streams",
            ),
        };
        let peer = match (&self.per_peer, req.remote_addr()) {
            (Some(map), Some(addr)) => {
                let key = (addr.ip(), kind);
                let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
                let n = m.entry(key).or_default();
                if *n >= per_peer_max {
                    return Err(Status::resource_exhausted(format!(
                        "{call}: {} already holds {per_peer_max} {what} over TCP, the most one address may; retry when one ends",
                        addr.ip()
                    )));
                }
                *n += 1;
                Some(PeerSlot {
                    map: map.clone(),
                    key,
                })
            }
            _ => None,
        };
        let permit = sem.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{call}: {max} {what} are running on this listener, the most ipoold serves at once (the CNI path comes first); retry shortly"
            ))
        })?;
        Ok(Slot {
            _permit: permit,
            _peer: peer,
        })
    }
}

#[cfg(test)]
mod tests;
