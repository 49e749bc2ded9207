use super::*;

#[test]
fn prefix_end_follows_etcd() {
    assert_eq!(prefix_end(b"/ipool/"), b"/ipool0".to_vec());
    assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    assert_eq!(prefix_end(b""), vec![0]);
}
