use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

fn written(at: i64) -> Lease {
    let mut l = Lease::default();
    l.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("ipoold".into()),
        time: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(at).expect("a time"),
        )),
        ..ManagedFieldsEntry::default()
    }]);
    l
}

#[test]
fn the_apiserver_clock_is_its_newest_stamp_whatever_this_machines_clock_says() {
    // This machine's clock is the test's (2026 and on); the apiserver's is an hour ahead
    // of the stamps' epoch: only the stamps count.
    let listed = [written(4_000_000_000), written(4_000_000_120)];
    assert_eq!(super::apiserver_now(&listed), 4_000_000_120);
}
