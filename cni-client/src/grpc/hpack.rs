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
mod tests;
