use super::*;
use proptest::prelude::*;

proptest! {
    #[test]
    fn entries_roundtrip(ops in prop::collection::vec(
        (any::<bool>(), 0usize..=META, prop::collection::vec(any::<u8>(), 0..40),
         prop::collection::vec(any::<u8>(), 0..80)),
        0..12,
    )) {
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|(put, idx, k, v)| if put { Op::Put(idx, k, v) } else { Op::Del(idx, k) })
            .collect();
        prop_assert_eq!(decode_entry(&encode_entry(&ops)).expect("decodes"), ops);
    }

    #[test]
    fn decoding_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode_entry(&bytes);
    }
}
