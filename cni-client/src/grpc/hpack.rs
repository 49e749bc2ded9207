//! An HPACK decoder (RFC 7541) for the reply's header blocks: integers, string literals (plain
//! or Huffman-coded, the codes through `httlib-huffman`'s precomputed tables), the static table
//! and the dynamic table with its size limit. Every malformed input is an error, never a
//! panic: the plugin is built with panic=abort and must always print a CNI error.
//!
//! What a block may cost is bounded: it decodes to at most [`MAX_LIST_SIZE`] bytes (checked
//! before each field is copied, so a block of one-byte references to a 4 KiB table entry is
//! refused after four, not expanded 4 000-fold), and opens with at most two table size
//! updates, none above [`MAX_TABLE_SIZE`].

use std::collections::VecDeque;

/// SETTINGS_HEADER_TABLE_SIZE: this client never changes it from the default.
const MAX_TABLE_SIZE: usize = 4096;

/// SETTINGS_MAX_HEADER_LIST_SIZE, which this client announces: the most one header block may
/// decode to, counted as RFC 9113 section 6.5.2 does (name + value + 32 per field). A gRPC
/// reply's headers or trailers are a few hundred bytes.
pub(super) const MAX_LIST_SIZE: usize = 16 << 10;

/// Table size updates at the start of one block: the encoder signals at most the smallest
/// size since the last block and the final one (RFC 7541 section 4.2).
const MAX_SIZE_UPDATES: usize = 2;

/// Per field, on top of its name and value (RFC 7541 section 4.1, RFC 9113 section 6.5.2).
const FIELD_OVERHEAD: usize = 32;

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

pub type Field = (Vec<u8>, Vec<u8>);

/// The decoding state of one connection (the dynamic table spans its header blocks).
#[derive(Debug, Default)]
pub struct Decoder {
    /// Newest first: index 62 is `table[0]`.
    table: VecDeque<Field>,
    /// The table's size as RFC 7541 counts it (name + value + 32 per entry).
    size: usize,
    /// The limit set by the encoder's size updates (at most MAX_TABLE_SIZE).
    max: Option<usize>,
}

/// Reads through a header block.
struct Input<'a> {
    b: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let v = *self.b.get(self.at).ok_or("the header block ends early")?;
        self.at += 1;
        Ok(v)
    }

    /// An integer with an `n`-bit prefix (section 5.1), the prefix byte included.
    fn int(&mut self, n: u8) -> Result<usize, String> {
        let mask = (1u8 << n) - 1;
        let mut v = usize::from(self.byte()? & mask);
        if v < usize::from(mask) {
            return Ok(v);
        }
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            if shift > 28 {
                return Err("an integer too large in the header block".into());
            }
            v += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
    }

    /// A string literal (section 5.2) of at most `room` bytes once decoded; a longer one is
    /// refused before it is copied (a Huffman string decodes to at least a quarter of its
    /// length: no code is longer than 30 bits).
    fn string(&mut self, room: usize) -> Result<Vec<u8>, String> {
        let huffman = self.b.get(self.at).ok_or("the header block ends early")? & 0x80 != 0;
        let len = self.int(7)?;
        let end = self
            .at
            .checked_add(len)
            .filter(|e| *e <= self.b.len())
            .ok_or("a string runs past the header block")?;
        let raw = &self.b[self.at..end];
        self.at = end;
        if !huffman {
            if len > room {
                return Err(too_large());
            }
            return Ok(raw.to_vec());
        }
        if len / 4 > room {
            return Err(too_large());
        }
        let mut out = Vec::with_capacity((len * 8 / 5).min(room));
        httlib_huffman::decode(raw, &mut out, httlib_huffman::DecoderSpeed::FiveBits)
            .map_err(|e| format!("a bad Huffman code in the header block: {e:?}"))?;
        if out.len() > room {
            return Err(too_large());
        }
        Ok(out)
    }
}

fn too_large() -> String {
    format!(
        "the header list is over {MAX_LIST_SIZE} bytes, the SETTINGS_MAX_HEADER_LIST_SIZE ipool announces"
    )
}

/// Counts a field of `len` bytes (name + value) into a block's list size.
fn count(list: &mut usize, len: usize) -> Result<(), String> {
    *list += len + FIELD_OVERHEAD;
    if *list > MAX_LIST_SIZE {
        return Err(too_large());
    }
    Ok(())
}

impl Decoder {
    fn max(&self) -> usize {
        self.max.unwrap_or(MAX_TABLE_SIZE)
    }

    /// The name and value at `index`, not copied.
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), String> {
        match index {
            0 => Err("header index 0".into()),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            _ => self
                .table
                .get(index - 62)
                .map(|(n, v)| (n.as_slice(), v.as_slice()))
                .ok_or_else(|| format!("header index {index} is not in the table")),
        }
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn insert(&mut self, field: &Field) {
        let entry = field.0.len() + field.1.len() + 32;
        let max = self.max();
        // An entry larger than the table empties it and is not added (section 4.4).
        self.evict_to(max.saturating_sub(entry));
        if entry <= max {
            self.table.push_front(field.clone());
            self.size += entry;
        }
    }

    /// Decodes one whole header block (CONTINUATIONs joined), appending its fields to `out`.
    /// A block that decodes to more than [`MAX_LIST_SIZE`] bytes is an error (the fields
    /// before the one that crossed it may have been appended).
    pub fn decode(&mut self, block: &[u8], out: &mut Vec<Field>) -> Result<(), String> {
        let mut input = Input { b: block, at: 0 };
        let mut fields_seen = false;
        let mut size_updates = 0;
        // The block's list size so far.
        let mut list = 0;
        while input.at < block.len() {
            let first = block[input.at];
            if first & 0x80 != 0 {
                // Indexed field (6.1): counted before it is copied.
                let i = input.int(7)?;
                let (n, v) = self.get(i)?;
                count(&mut list, n.len() + v.len())?;
                out.push((n.to_vec(), v.to_vec()));
            } else if first & 0xc0 == 0x40 {
                // Literal with incremental indexing (6.2.1).
                let i = input.int(6)?;
                let field = self.literal(&mut input, i, &mut list)?;
                self.insert(&field);
                out.push(field);
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (6.3): only before the first field, at most two.
                if fields_seen {
                    return Err("a table size update after a header field".into());
                }
                size_updates += 1;
                if size_updates > MAX_SIZE_UPDATES {
                    return Err(format!(
                        "more than {MAX_SIZE_UPDATES} table size updates at the start of a header block"
                    ));
                }
                let size = input.int(5)?;
                if size > MAX_TABLE_SIZE {
                    return Err(format!(
                        "a table size update to {size}, over the {MAX_TABLE_SIZE} allowed"
                    ));
                }
                self.max = Some(size);
                self.evict_to(size);
                continue;
            } else {
                // Literal without indexing (6.2.2) or never indexed (6.2.3).
                let i = input.int(4)?;
                out.push(self.literal(&mut input, i, &mut list)?);
            }
            fields_seen = true;
        }
        Ok(())
    }

    /// A literal's name (indexed when `index` > 0) and value, counted into `list`: neither
    /// string is copied if it would take the list past [`MAX_LIST_SIZE`].
    fn literal(&self, input: &mut Input, index: usize, list: &mut usize) -> Result<Field, String> {
        let room = MAX_LIST_SIZE
            .checked_sub(*list + FIELD_OVERHEAD)
            .ok_or_else(too_large)?;
        let name = if index == 0 {
            input.string(room)?
        } else {
            let name = self.get(index)?.0;
            if name.len() > room {
                return Err(too_large());
            }
            name.to_vec()
        };
        let value = input.string(room - name.len())?;
        count(list, name.len() + value.len())?;
        Ok((name, value))
    }
}

#[cfg(test)]
mod tests {
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
}
