use super::super::request::get;
use super::*;

/// Answers every call with a header of `cluster_id` (revision 7).
struct Answering(std::sync::Mutex<u64>);

#[async_trait::async_trait]
impl Transport for Answering {
    async fn call(&self, call: Call, _deadline: Instant) -> Result<Reply, EtcdError> {
        let header = Some(pb::ResponseHeader {
            cluster_id: *self.0.lock().expect("lock"),
            revision: 7,
            ..Default::default()
        });
        Ok(match call {
            Call::Range(_) => Reply::Range(pb::RangeResponse {
                header,
                ..Default::default()
            }),
            Call::LeaseKeepAlive(_) => Reply::LeaseKeepAlive(pb::LeaseKeepAliveResponse {
                header,
                ttl: 6,
                ..Default::default()
            }),
            other => return Err(EtcdError::Connect(format!("not here: {other:?}"))),
        })
    }
}

#[tokio::test]
async fn a_heartbeat_answer_from_an_etcd_made_anew_counts_as_a_reset() {
    let t = Arc::new(Answering(std::sync::Mutex::new(0xa)));
    let c = EtcdClient::with_transport(t.clone(), Duration::from_secs(1), None);
    c.range(get("k")).await.expect("range");
    assert_eq!(c.resets().0, 0);
    // etcd restored from a backup, as a new cluster: the heartbeat hears it first.
    *t.0.lock().expect("lock") = 0xb;
    c.lease_keep_alive(1).await.expect("keep-alive");
    assert_eq!(c.resets().0, 1, "{:?}", c.resets().1);
    // A lease answer's revision says nothing of the keys: no reset from it.
    c.range(get("k")).await.expect("range");
    assert_eq!(c.resets().0, 1);
}
