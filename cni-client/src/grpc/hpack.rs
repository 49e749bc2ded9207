//! An HPACK decoder (RFC 7541) for the reply's header blocks: integers, string literals (plain
//! or Huffman-coded, the codes through `httlib-huffman`'s precomputed tables), the static table
//! and the dynamic table with its size limit. Every malformed input is an error, never a
//! panic: the plugin is built with panic=abort and must always print a CNI error.

use std::collections::VecDeque;

/// SETTINGS_HEADER_TABLE_SIZE: this client never changes it from the default.
const MAX_TABLE_SIZE: usize = 4096;

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

    /// A string literal (section 5.2).
    fn string(&mut self) -> Result<Vec<u8>, String> {
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
            return Ok(raw.to_vec());
        }
        let mut out = Vec::with_capacity(len * 8 / 5);
        httlib_huffman::decode(raw, &mut out, httlib_huffman::DecoderSpeed::FiveBits)
            .map_err(|e| format!("a bad Huffman code in the header block: {e:?}"))?;
        Ok(out)
    }
}

impl Decoder {
    fn max(&self) -> usize {
        self.max.unwrap_or(MAX_TABLE_SIZE)
    }

    fn get(&self, index: usize) -> Result<Field, String> {
        match index {
            0 => Err("header index 0".into()),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            }
            _ => self
                .table
                .get(index - 62)
                .cloned()
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
    pub fn decode(&mut self, block: &[u8], out: &mut Vec<Field>) -> Result<(), String> {
        let mut input = Input { b: block, at: 0 };
        let mut fields_seen = false;
        while input.at < block.len() {
            let first = block[input.at];
            if first & 0x80 != 0 {
                // Indexed field (6.1).
                let i = input.int(7)?;
                out.push(self.get(i)?);
            } else if first & 0xc0 == 0x40 {
                // Literal with incremental indexing (6.2.1).
                let i = input.int(6)?;
                let field = self.literal(&mut input, i)?;
                self.insert(&field);
                out.push(field);
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (6.3): only before the first field.
                if fields_seen {
                    return Err("a table size update after a header field".into());
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
                out.push(self.literal(&mut input, i)?);
            }
            fields_seen = true;
        }
        Ok(())
    }

    /// A literal's name (indexed when `index` > 0) and value.
    fn literal(&self, input: &mut Input, index: usize) -> Result<Field, String> {
        let name = if index == 0 {
            input.string()?
        } else {
            self.get(index)?.0
        };
        Ok((name, input.string()?))
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
