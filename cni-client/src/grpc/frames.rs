//! The HTTP/2 wire format this client needs: the frame types, flags and SETTINGS it knows,
//! building frames and the request's header block, and reading a frame's padding.

use super::broken;
use super::CallError;

pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types and flags (RFC 9113 section 6).
pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PUSH_PROMISE: u8 = 0x5;
pub(super) const PING: u8 = 0x6;
pub(super) const GOAWAY: u8 = 0x7;
pub(super) const WINDOW_UPDATE: u8 = 0x8;
pub(super) const CONTINUATION: u8 = 0x9;
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const ACK: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

// SETTINGS parameters.
pub(super) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(super) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

pub(super) fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l < 1 << 24)
        .expect("frames are built below 16 MiB");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 section 5.2).
fn hpack_string(out: &mut Vec<u8>, s: &str) {
    hpack_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// An HPACK integer with an `n`-bit prefix; `first` carries the bits above the prefix.
pub(super) fn hpack_int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// The request's header block: literals without indexing (no encoder state to keep), names
/// from the static table where it has them.
pub(super) fn request_headers(method: &str) -> Vec<u8> {
    let mut h = Vec::with_capacity(96);
    h.push(0x83); // :method: POST (static 3)
    h.push(0x86); // :scheme: http (static 6)
    hpack_int(&mut h, 0x00, 4, 4); // :path (static 4)
    hpack_string(&mut h, method);
    hpack_int(&mut h, 0x00, 4, 1); // :authority (static 1)
    hpack_string(&mut h, "localhost");
    hpack_int(&mut h, 0x00, 4, 31); // content-type (static 31)
    hpack_string(&mut h, "application/grpc");
    h.push(0x00); // te: a new name
    hpack_string(&mut h, "te");
    hpack_string(&mut h, "trailers");
    h
}

pub(super) fn be32(p: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?))
}

/// The payload of a DATA or HEADERS frame without its padding.
pub(super) fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], CallError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| broken("a padded frame without its pad length"))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
        .ok_or_else(|| broken("a frame's padding is longer than the frame"))
}
