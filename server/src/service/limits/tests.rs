use super::*;
use tonic::transport::server::TcpConnectInfo;

fn from(ip: &str) -> Request<()> {
    let mut r = Request::new(());
    r.extensions_mut().insert(TcpConnectInfo {
        local_addr: None,
        remote_addr: Some(std::net::SocketAddr::new(ip.parse().expect("ip"), 40000)),
    });
    r
}

#[test]
fn each_peer_and_the_listener_are_bounded() {
    let l = Limits::new(true);
    let a: Vec<Slot> = (0..MAX_READS_PER_PEER)
        .map(|_| l.read(&from("10.0.0.1"), "ListAllocations").expect("slot"))
        .collect();
    let e = l
        .read(&from("10.0.0.1"), "ListAllocations")
        .err()
        .expect("peer full");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("10.0.0.1"), "{e}");
    // Watchers are counted apart from reads; other peers have their own share.
    let w = l.watch(&from("10.0.0.1")).expect("watch");
    let mut others: Vec<Slot> = (2..MAX_READS as u8)
        .map(|i| {
            l.read(&from(&format!("10.0.1.{i}")), "PoolStatus")
                .expect("slot")
        })
        .collect();
    let e = l
        .read(&from("10.0.2.1"), "PoolStatus")
        .err()
        .expect("listener full");
    assert!(e.message().contains("at once"), "{e}");
    drop(a);
    others.pop();
    l.read(&from("10.0.0.1"), "ListAllocations")
        .expect("a slot came free");
    drop(w);
    let watchers: Vec<Slot> = (0..MAX_WATCHERS_PER_PEER)
        .map(|_| l.watch(&from("10.0.0.9")).expect("watch"))
        .collect();
    assert!(l.watch(&from("10.0.0.9")).is_err());
    drop(watchers);
    assert!(l.watch(&from("10.0.0.9")).is_ok());
    // On the Unix socket only the listener's bound counts.
    let local = Limits::new(false);
    let held: Vec<Slot> = (0..MAX_READS)
        .map(|_| local.read(&Request::new(()), "PoolStatus").expect("slot"))
        .collect();
    assert!(local.read(&Request::new(()), "PoolStatus").is_err());
    drop(held);
}

/// Large reads over TCP come at most TCP_PAGES_PER_SEC after the burst; on the socket
/// they are not paced.
#[tokio::test(start_paused = true)]
async fn large_reads_over_tcp_are_paced() {
    let l = Limits::new(true);
    let t = Instant::now();
    for _ in 0..TCP_PAGES_BURST {
        l.pace().await;
    }
    assert_eq!(t.elapsed().as_millis(), 0, "the burst comes at once");
    for _ in 0..20 {
        l.pace().await;
    }
    let took = t.elapsed().as_secs_f64();
    assert!((0.95..1.2).contains(&took), "20 more took {took} s");
    let local = Limits::new(false);
    let t = Instant::now();
    for _ in 0..1000 {
        local.pace().await;
    }
    assert_eq!(t.elapsed().as_millis(), 0);
}
