//! Sources that get their addresses asynchronously: claims run outside the
//! state lock, ADDs that wait for one are woken when it lands, a claimed block is written in the
//! same change set as its first use, and the wait is bounded.
//!
//! The source here claims /28 blocks of its range from a backend the test steers: a claim
//! finishes only when the test gives the gate a permit, and fails when the test says so.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::*;
use crate::range::{OccupyError, Range};
use crate::source::{BlockRefused, BlockSource, Claim, Landing, Next, Source, Sources, WorkFailed};

const NET: &str = r#"
    [[network]]
    name = "c"
    ranges = [[{ subnet = "10.8.0.0/24" }]]
"#;

/// What the blocks are claimed from.
struct Backend {
    /// One permit per claim allowed to finish.
    gate: tokio::sync::Semaphore,
    /// Set: claims fail with this.
    fail: Mutex<Option<String>>,
    started: AtomicUsize,
    next_block: AtomicUsize,
}

impl Default for Backend {
    fn default() -> Self {
        Backend {
            gate: tokio::sync::Semaphore::new(0),
            fail: Mutex::default(),
            started: AtomicUsize::default(),
            next_block: AtomicUsize::default(),
        }
    }
}

struct Block {
    first: u32,
    recorded: bool,
}

const BLOCK: u32 = 16;

/// Hands out the addresses of the /28 blocks it claimed (but each block's first and last).
struct FakeBlocks {
    range: Range,
    backend: Arc<Backend>,
    blocks: Vec<Block>,
    taken: BTreeSet<IpAddr>,
    in_flight: bool,
    failed: Option<String>,
    /// Where its claim leaves the block it claimed.
    inbox: Arc<Mutex<Option<Result<String, String>>>>,
}

fn v4(ip: IpAddr) -> Option<u32> {
    match ip {
        IpAddr::V4(a) => Some(u32::from(a)),
        IpAddr::V6(_) => None,
    }
}

impl FakeBlocks {
    fn block_of(&self, ip: IpAddr) -> Option<&Block> {
        let n = v4(ip)?;
        self.blocks
            .iter()
            .find(|b| n > b.first && n < b.first + BLOCK - 1)
    }

    fn free_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.blocks
            .iter()
            .flat_map(|b| (b.first + 1..b.first + BLOCK - 1).map(|n| IpAddr::V4(Ipv4Addr::from(n))))
            .filter(|ip| !self.taken.contains(ip))
    }

    fn name(first: u32) -> String {
        format!("{}/28", Ipv4Addr::from(first))
    }

    fn net(first: u32) -> ipnet::IpNet {
        FakeBlocks::name(first).parse().expect("a /28")
    }

    fn add_block(&mut self, block: &str, recorded: bool) -> Result<(), String> {
        let first: Ipv4Addr = block
            .strip_suffix("/28")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("bad block {block}"))?;
        self.blocks.push(Block {
            first: u32::from(first),
            recorded,
        });
        Ok(())
    }

    fn take(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.can_occupy(ip)?;
        self.taken.insert(ip);
        let n = v4(ip).unwrap_or_default();
        if let Some(b) = self
            .blocks
            .iter_mut()
            .find(|b| n > b.first && n < b.first + BLOCK - 1)
        {
            b.recorded = true;
        }
        Ok(())
    }
}

impl Source for FakeBlocks {
    fn describe(&self) -> String {
        format!("blocks of {}", self.range.subnet)
    }
    fn next(&self) -> Next {
        if let Some(ip) = self.free_addresses().next() {
            return Next::Ready(ip);
        }
        match &self.failed {
            Some(why) if !self.in_flight => Next::Unavailable(why.clone()),
            _ if self.blocks.len() as u32 == 256 / BLOCK => Next::Exhausted,
            _ => Next::Pending(format!("waiting for a block of {}", self.range.subnet)),
        }
    }
    fn peek_next_n(&self, n: usize) -> Vec<IpAddr> {
        self.free_addresses().take(n).collect()
    }
    fn take_next(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.take(ip)
    }
    fn can_occupy(&self, ip: IpAddr) -> Result<(), OccupyError> {
        match self.block_of(ip) {
            None => Err(OccupyError::NotInRange(ip)),
            Some(_) if self.taken.contains(&ip) => Err(OccupyError::Taken(ip)),
            Some(_) => Ok(()),
        }
    }
    fn occupy(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.take(ip)
    }
    fn vacate(&mut self, ip: IpAddr) -> bool {
        self.taken.remove(&ip)
    }
    fn contains(&self, ip: IpAddr) -> bool {
        self.block_of(ip).is_some()
    }
    fn covers(&self, ip: IpAddr) -> bool {
        self.range.subnet.contains(&ip)
    }
    fn interface_of(&self, ip: IpAddr) -> Option<(u8, Option<IpAddr>)> {
        self.contains(ip).then_some((24, None))
    }
    fn free(&self) -> u128 {
        self.free_addresses().count() as u128
    }
    fn size(&self) -> u128 {
        256
    }
    fn cursor(&self) -> Option<IpAddr> {
        None
    }
    fn set_cursor(&mut self, _cursor: Option<IpAddr>) {}
    fn blocks(&self) -> Option<&dyn BlockSource> {
        Some(self)
    }
    fn blocks_mut(&mut self) -> Option<&mut dyn BlockSource> {
        Some(self)
    }
}

impl BlockSource for FakeBlocks {
    fn start_claim(&mut self) -> Option<Claim> {
        if self.in_flight || self.free() > 0 || matches!(self.next(), Next::Exhausted) {
            return None;
        }
        self.in_flight = true;
        let (backend, inbox) = (self.backend.clone(), self.inbox.clone());
        let base = v4(self.range.subnet.network()).unwrap_or_default();
        Some(Box::pin(async move {
            let claimed: Result<String, String> = async {
                backend.started.fetch_add(1, Ordering::SeqCst);
                backend
                    .gate
                    .acquire()
                    .await
                    .map_err(|e| e.to_string())?
                    .forget();
                if let Some(why) = backend.fail.lock().expect("lock").clone() {
                    return Err(why);
                }
                let i = backend.next_block.fetch_add(1, Ordering::SeqCst) as u32;
                Ok(FakeBlocks::name(base + i * BLOCK))
            }
            .await;
            *inbox.lock().expect("inbox") = Some(claimed);
        }))
    }
    fn land(&mut self) -> Result<Landing, WorkFailed> {
        let Some(claimed) = self.inbox.lock().expect("inbox").take() else {
            return Ok(Landing::Nothing);
        };
        self.in_flight = false;
        match claimed {
            Ok(block) => {
                self.failed = None;
                self.add_block(&block, false)
                    .map(|()| Landing::Took(block))
                    .map_err(WorkFailed)
            }
            Err(why) => {
                self.failed = Some(why.clone());
                Err(WorkFailed(why))
            }
        }
    }
    fn unrecorded(&self, ip: IpAddr) -> Option<ipnet::IpNet> {
        self.block_of(ip)
            .filter(|b| !b.recorded)
            .map(|b| FakeBlocks::net(b.first))
    }
    fn restore_block(&mut self, block: ipnet::IpNet) -> Result<(), BlockRefused> {
        self.add_block(&block.to_string(), true)
            .map_err(BlockRefused::Outside)
    }
    fn recorded_blocks(&self) -> Vec<ipnet::IpNet> {
        self.blocks
            .iter()
            .filter(|b| b.recorded)
            .map(|b| FakeBlocks::net(b.first))
            .collect()
    }
}

/// An engine over a MemStore whose network "c" claims its addresses from `backend`.
fn open(store: &Arc<MemStore>, backend: &Arc<Backend>, cni: &str) -> Ipam {
    let config = DaemonConfig::parse(&format!("{NET}\n[cni]\n{cni}")).expect("config");
    let backend = backend.clone();
    let sources = Sources::new(move |_, mut ranges| {
        Box::new(FakeBlocks {
            range: ranges.remove(0),
            backend: backend.clone(),
            blocks: Vec::new(),
            taken: BTreeSet::new(),
            in_flight: false,
            failed: None,
            inbox: Arc::default(),
        })
    });
    let (load, serve) = (store.clone(), store.clone());
    Ipam::open_with(
        move || Ok(load as Arc<dyn Store>),
        move || Ok(serve as Arc<dyn Store>),
        Setup {
            config,
            clock: Arc::new(ManualClock::new(T0)),
            boot_id: Some("boot-1".into()),
            metrics: Arc::default(),
            sources,
        },
    )
    .expect("open")
}

/// Lets pending tasks run: a claim's task must get as far as the gate.
async fn settle() {
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// The ADD's result, which must come long before its wait (60 s) runs out: it is woken when
/// its claim lands.
async fn within(add: tokio::task::JoinHandle<Result<AddReply, Error>>) -> Result<AddReply, Error> {
    tokio::time::timeout(std::time::Duration::from_secs(5), add)
        .await
        .expect("woken when the claim landed")
        .expect("join")
}

fn blocks_in(set: &[Change]) -> Vec<&str> {
    set.iter()
        .filter_map(|c| match c {
            Change::PutBlock { block, held, .. } => Some(block.as_str()).filter(|_| *held),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn adds_wait_for_one_claim_and_its_block_is_written_with_its_first_use() {
    let store = Arc::new(MemStore::new());
    let backend = Arc::new(Backend::default());
    let ipam = open(&store, &backend, "add_wait_ms = 60000");
    store.keep_history();
    let waiting: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|cid| {
            let ipam = ipam.clone();
            tokio::spawn(async move { ipam.add(req("c", cid, "")).await })
        })
        .collect();
    settle().await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "nothing landed yet"
    );
    assert_eq!(
        backend.started.load(Ordering::SeqCst),
        1,
        "one claim for all"
    );
    // Claims run outside the lock: the engine serves meanwhile.
    assert_eq!(ipam.pool_status(Some("c"))[0].in_use, 0);

    backend.gate.add_permits(1);
    let mut got = BTreeSet::new();
    for w in waiting {
        let r = w
            .await
            .expect("join")
            .expect("served once the block landed");
        got.extend(ips(&r));
    }
    let want: BTreeSet<IpAddr> = ["10.8.0.1", "10.8.0.2", "10.8.0.3"].map(ip).into();
    assert_eq!(got, want);
    assert_eq!(backend.started.load(Ordering::SeqCst), 1);

    // The block is in exactly one change set: the one of the first ADD it served.
    let history = store.history();
    let with_block: Vec<_> = history
        .iter()
        .filter(|s| !blocks_in(s).is_empty())
        .collect();
    assert_eq!(with_block.len(), 1, "{history:?}");
    assert_eq!(blocks_in(with_block[0]), vec!["10.8.0.0/28"]);
    assert!(
        with_block[0]
            .iter()
            .any(|c| matches!(c, Change::PutAttachment(_))),
        "{:?}",
        with_block[0]
    );

    // A restart gives the block back: no claim, no wait.
    drop(ipam);
    let ipam = open(&store, &backend, "add_wait_ms = 0");
    let d = ipam
        .add(req("c", "d", ""))
        .await
        .expect("served from the block");
    assert_eq!(ips(&d), vec![ip("10.8.0.4")]);
    assert_eq!(backend.started.load(Ordering::SeqCst), 1);
    assert_eq!(ipam.pool_status(Some("c"))[0].in_use, 4);
}

#[tokio::test]
async fn a_failed_claim_fails_the_waiting_add_retryably_and_a_later_one_serves() {
    let store = Arc::new(MemStore::new());
    let backend = Arc::new(Backend::default());
    let ipam = open(&store, &backend, "add_wait_ms = 60000");
    *backend.fail.lock().expect("lock") = Some("etcd: connection refused".into());
    let waiting = {
        let ipam = ipam.clone();
        tokio::spawn(async move { ipam.add(req("c", "a", "")).await })
    };
    settle().await;
    backend.gate.add_permits(1);
    let e = within(waiting).await.expect_err("the claim failed");
    assert!(matches!(e, Error::Busy(_)), "{e}");
    assert!(e.to_string().contains("etcd: connection refused"), "{e}");
    let status = &ipam.pool_status(Some("c"))[0];
    assert!(status
        .last_error
        .as_ref()
        .is_some_and(|(_, why)| why.contains("connection refused")));
    assert!(store.load().expect("load").blocks.is_empty());

    // The background loop claims again, ahead of the next ADD.
    *backend.fail.lock().expect("lock") = None;
    ipam.maintain().await.expect("maintain");
    settle().await;
    assert_eq!(backend.started.load(Ordering::SeqCst), 2);
    backend.gate.add_permits(1);
    let a = ipam.add(req("c", "a", "")).await.expect("add");
    assert_eq!(ips(&a), vec![ip("10.8.0.1")]);
}

#[tokio::test]
async fn the_wait_for_a_claim_is_bounded_by_add_wait_ms() {
    let store = Arc::new(MemStore::new());
    let backend = Arc::new(Backend::default());
    let ipam = open(&store, &backend, "add_wait_ms = 30");
    let e = ipam
        .add(req("c", "a", ""))
        .await
        .expect_err("nothing landed");
    assert!(matches!(e, Error::Busy(_)), "{e}");
    assert!(
        e.to_string().contains("waiting for a block of 10.8.0.0/24"),
        "{e}"
    );
    assert_eq!(backend.started.load(Ordering::SeqCst), 1);
    // The claim goes on; once it lands, the next ADD is served at once.
    backend.gate.add_permits(1);
    settle().await;
    let a = ipam.add(req("c", "a", "")).await.expect("add");
    assert_eq!(ips(&a), vec![ip("10.8.0.1")]);
}

/// A network declared by an ADD that waits for a claim is declared at once, so the claim lands
/// in it; new ranges keep the blocks of the sets they name again.
#[tokio::test]
async fn a_declared_network_gets_its_claim_and_new_ranges_keep_its_blocks() {
    let store = Arc::new(MemStore::new());
    let backend = Arc::new(Backend::default());
    let ipam = open(&store, &backend, "add_wait_ms = 60000");
    let waiting = {
        let ipam = ipam.clone();
        tokio::spawn(async move { ipam.add(req("d", "a", r#"{"subnet":"10.9.0.0/24"}"#)).await })
    };
    settle().await;
    assert_eq!(backend.started.load(Ordering::SeqCst), 1);
    backend.gate.add_permits(1);
    let a = within(waiting).await.expect("served");
    assert_eq!(ips(&a), vec![ip("10.9.0.1")]);

    let spec = |subnet: &str| {
        vec![crate::range::RangeSpec {
            subnet: subnet.into(),
            range_start: None,
            range_end: None,
            gateway: None,
        }]
    };
    let two = vec![spec("10.9.0.0/24"), spec("10.10.0.0/24")];
    let changed = ipam
        .set_ranges("d", two)
        .await
        .expect("set")
        .expect("changed");
    assert_eq!(changed.retiring, "", "the first set is named again");
    let waiting = {
        let ipam = ipam.clone();
        tokio::spawn(async move { ipam.add(req("d", "b", "")).await })
    };
    settle().await;
    backend.gate.add_permits(1);
    let b = within(waiting).await.expect("served");
    assert_eq!(ips(&b), vec![ip("10.9.0.2"), ip("10.10.0.17")]);
    assert_eq!(backend.started.load(Ordering::SeqCst), 2);

    drop(ipam);
    let ipam = open(&store, &backend, "add_wait_ms = 0");
    let c = ipam
        .add(req("d", "c", ""))
        .await
        .expect("both blocks came back");
    assert_eq!(ips(&c), vec![ip("10.9.0.3"), ip("10.10.0.18")]);
    assert_eq!(backend.started.load(Ordering::SeqCst), 2);
}
