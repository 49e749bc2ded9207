//! The HPACK decoder against an encoder of its own (httlib-hpack), and its limits.

use super::*;
use httlib_hpack::Encoder;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn strings(fields: &[Field]) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect()
}

/// RFC 7541 C.4: three requests with Huffman codes, the later ones referring to the dynamic
/// table the earlier ones filled.
#[test]
fn the_rfc_examples_with_huffman_codes() {
    let mut d = Decoder::default();
    let mut out = Vec::new();
    d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"), &mut out)
        .expect("C.4.1");
    d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf"), &mut out)
        .expect("C.4.2");
    d.decode(
        &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
        &mut out,
    )
    .expect("C.4.3");
    let want: Vec<(String, String)> = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    assert_eq!(strings(&out), want);
    // The table: custom-key, cache-control, :authority (54 + 53 + 57 bytes).
    assert_eq!(d.size, 164);
}

#[test]
fn size_updates_evict_and_bad_blocks_are_errors() {
    let mut d = Decoder::default();
    let mut out = Vec::new();
    d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"), &mut out)
        .expect("C.4.1");
    assert_eq!(d.table.len(), 1);
    // A size update to 0 empties the table; index 62 is then gone.
    d.decode(&[0x20], &mut out).expect("size update");
    assert!(d.table.is_empty());
    assert!(d.decode(&[0x80 | 62], &mut out).is_err());
    for bad in [
        &[0x80][..],                                     // index 0
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f][..], // integer overflow
        &[0x40, 0x05, b'a'][..],                         // a name longer than the block
        &[0x3f, 0xe2, 0x1f][..],                         // a size update to 4097
        &[0x82, 0x20][..],                               // a size update after a field
        &[0x40, 0x81, 0xff, 0x00][..],                   // a bad Huffman code (EOS)
    ] {
        assert!(Decoder::default().decode(bad, &mut out).is_err(), "{bad:?}");
    }
}

/// A string literal, its Huffman bit set or not (the bytes are taken as they are).
fn string(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
    crate::grpc::frames::hpack_int(out, if huffman { 0x80 } else { 0 }, 7, s.len());
    out.extend_from_slice(s);
}

/// A literal with incremental indexing and a new name (6.2.1), not Huffman-coded.
fn indexed_literal(name: &str, value: &[u8]) -> Vec<u8> {
    let mut b = vec![0x40];
    string(&mut b, name.as_bytes(), false);
    string(&mut b, value, false);
    b
}

/// A table entry of 4 033 bytes ("x" and 4 000 bytes), then one-byte references to it:
/// three fit in 16 KiB, the fourth is refused before it is copied.
#[test]
fn references_that_expand_past_the_list_size_are_refused() {
    let mut block = indexed_literal("x", &[b'a'; 4000]);
    block.extend_from_slice(&[0x80 | 62; 3]);
    let mut out = Vec::new();
    Decoder::default()
        .decode(&block, &mut out)
        .expect("4 x 4033 bytes");
    assert_eq!(out.len(), 4);
    // The cap is per block: the same block again, on a new decoder, is fine, and a block
    // with one reference more is not.
    block.push(0x80 | 62);
    let mut out = Vec::new();
    let e = Decoder::default()
        .decode(&block, &mut out)
        .expect_err("5 x 4033 bytes");
    assert!(
        e.contains("16384") && e.contains("SETTINGS_MAX_HEADER_LIST_SIZE"),
        "{e}"
    );
    assert_eq!(out.len(), 4, "the field over the limit was copied");
    // 1 000 references in a 1 KiB block: refused after the fourth, never 4 MB decoded.
    let mut block = indexed_literal("x", &[b'a'; 4000]);
    block.extend_from_slice(&[0x80 | 62; 1000]);
    let mut out = Vec::new();
    assert!(Decoder::default().decode(&block, &mut out).is_err());
    assert_eq!(out.len(), 4);
}

/// One field of exactly 16 384 bytes (1 + 16 351 + 32) is accepted, one byte more is not:
/// a plain or Huffman-coded value, and an indexed name with a literal value.
#[test]
fn the_list_size_limit_is_exact() {
    for huffman in [false, true] {
        for (name, extra) in [("n", 0), ("n", 1), ("age", 0), ("age", 1)] {
            let value = "v".repeat(MAX_LIST_SIZE - FIELD_OVERHEAD - name.len() + extra);
            let mut flags = Encoder::NEVER_INDEXED | Encoder::BEST_FORMAT;
            if huffman {
                flags |= Encoder::HUFFMAN_VALUE;
            }
            let mut block = Vec::new();
            Encoder::default()
                .encode(
                    (name.as_bytes().to_vec(), value.clone().into_bytes(), flags),
                    &mut block,
                )
                .expect("encode");
            let mut out = Vec::new();
            let r = Decoder::default().decode(&block, &mut out);
            if extra == 0 {
                r.expect("at the limit");
                assert_eq!(strings(&out), vec![(name.to_string(), value)]);
            } else {
                let e = r.expect_err("one byte over");
                assert!(e.contains("16384"), "{e}");
                assert!(out.is_empty());
            }
        }
    }
    // A Huffman string whose length alone says it is too long is refused before decoding.
    let mut block = vec![0x00];
    string(&mut block, b"n", false);
    string(&mut block, &vec![0xff; 4 * MAX_LIST_SIZE + 8], true);
    let e = Decoder::default()
        .decode(&block, &mut Vec::new())
        .expect_err("too long");
    assert!(e.contains("16384"), "{e}");
}

/// At most two size updates open a block (RFC 7541 4.2), each at most 4 096.
#[test]
fn size_updates_are_bounded() {
    let mut out = Vec::new();
    Decoder::default()
        .decode(&[0x20, 0x3f, 0xe1, 0x1f, 0x82], &mut out)
        .expect("to 0, then to 4096");
    let e = Decoder::default()
        .decode(&[0x20, 0x20, 0x20, 0x82], &mut out)
        .expect_err("three updates");
    assert!(e.contains("more than 2"), "{e}");
    // A long run of updates is refused at the third, not looped through.
    assert!(Decoder::default()
        .decode(&[0x20; 60_000], &mut out)
        .is_err());
}

fn field_strategy() -> impl Strategy<Value = (String, String)> {
    let names = prop_oneof![
        proptest::sample::select(
            STATIC
                .iter()
                .map(|(n, _)| n.to_string())
                .collect::<Vec<_>>()
        ),
        "[a-z][a-z0-9-]{0,20}",
    ];
    (names, "[ -~]{0,40}")
}

proptest! {
    /// Against an independent encoder (httlib-hpack): Huffman or plain, indexed or not, over
    /// several blocks sharing the table, with a small table so entries are evicted.
    #[test]
    fn decodes_what_an_encoder_wrote(
        blocks in prop::collection::vec(prop::collection::vec((field_strategy(), 0u8..32), 0..8), 1..6),
    ) {
        let mut enc = Encoder::with_dynamic_size(256);
        let mut dec = Decoder::default();
        let mut first = true;
        for block in blocks {
            let mut bytes = Vec::new();
            if first {
                enc.update_max_dynamic_size(256, &mut bytes).expect("size update");
                first = false;
            }
            for ((n, v), flags) in &block {
                let flags = flags & (Encoder::HUFFMAN_NAME | Encoder::HUFFMAN_VALUE
                    | Encoder::WITH_INDEXING | Encoder::NEVER_INDEXED | Encoder::BEST_FORMAT);
                enc.encode((n.as_bytes().to_vec(), v.as_bytes().to_vec(), flags), &mut bytes)
                    .expect("encode");
            }
            let mut out = Vec::new();
            dec.decode(&bytes, &mut out).expect("decode");
            prop_assert_eq!(strings(&out), block.into_iter().map(|(f, _)| f).collect::<Vec<_>>());
        }
    }

    #[test]
    fn garbage_is_an_error_or_fields_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut out = Vec::new();
        let _ = Decoder::default().decode(&bytes, &mut out);
    }
}
