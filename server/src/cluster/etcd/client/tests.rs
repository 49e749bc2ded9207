use super::super::request::get;
use super::*;

#[tokio::test]
async fn no_endpoint_is_an_error_and_bad_urls_are_named() {
    assert!(EtcdClient::new(&[], None, Duration::from_secs(1), None).is_err());
    let e = EtcdClient::new(&["not a url".into()], None, Duration::from_secs(1), None)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("not a url"), "{e}");
}

#[tokio::test]
async fn unreachable_endpoints_are_each_named_and_count_as_unreachable() {
    // Two closed loopback ports: both are tried within the one call.
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .expect("bind")
                .local_addr()
                .expect("addr")
                .port()
        })
        .collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let c = EtcdClient::new(&urls, None, Duration::from_secs(2), None).expect("client");
    let e = c.range(get("k")).await.expect_err("no etcd there");
    assert!(e.is_unreachable(), "{e}");
    for p in ports {
        assert!(e.to_string().contains(&p.to_string()), "{e}");
    }
}
