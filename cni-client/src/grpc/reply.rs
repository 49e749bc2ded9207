//! What has arrived for the stream (`Response`), and the gRPC outcome made of it: the status,
//! the percent-decoded message, and the one reply message.

use super::frames::be32;
use super::{broken, CallError, Reply};

/// What has arrived for the stream so far.
#[derive(Default)]
pub(super) struct Response {
    /// Decoded header fields of every block (response headers, then trailers).
    pub(super) fields: Vec<(String, String)>,
    /// DATA payload.
    pub(super) body: Vec<u8>,
    /// A header block in progress (HEADERS without END_HEADERS, then CONTINUATIONs), and
    /// whether its HEADERS frame ended the stream.
    pub(super) block: Option<(Vec<u8>, bool)>,
    /// Header blocks begun on the stream.
    pub(super) blocks: usize,
    pub(super) ended: bool,
}

impl Response {
    fn field(&self, name: &str) -> Option<&str> {
        // The trailers come last and win over a header of the same name.
        self.fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The gRPC outcome of a finished stream.
pub(super) fn reply(resp: &Response) -> Result<Reply, CallError> {
    let status = resp.field(":status").unwrap_or("");
    if status != "200" {
        // The gRPC over HTTP/2 mapping of HTTP statuses.
        let code = match status {
            "400" => 13,
            "401" => 16,
            "403" => 7,
            "404" => 12,
            "429" | "502" | "503" | "504" => 14,
            _ => 2,
        };
        return Ok(Reply {
            code,
            message: format!("HTTP status {status:?} from ipoold"),
            body: Vec::new(),
        });
    }
    let Some(code) = resp.field("grpc-status") else {
        return Err(broken("the reply ended without a grpc-status"));
    };
    let code = code
        .parse::<i32>()
        .map_err(|_| broken(format!("grpc-status {code:?} is not a number")))?;
    let message = percent_decode(resp.field("grpc-message").unwrap_or(""));
    if code != 0 {
        return Ok(Reply {
            code,
            message,
            body: Vec::new(),
        });
    }
    let b = &resp.body;
    match b.first() {
        Some(0) => {}
        Some(_) => {
            return Err(broken(
                "ipoold sent a compressed reply, which was not asked for",
            ))
        }
        None => return Err(broken("the reply has status OK but no message")),
    }
    let len = b.get(1..5).and_then(be32).map(|l| l as usize);
    if len != Some(b.len().saturating_sub(5)) {
        return Err(broken(format!(
            "the reply is not one gRPC message ({} bytes, length prefix {len:?})",
            b.len()
        )));
    }
    Ok(Reply {
        code,
        message,
        body: b[5..].to_vec(),
    })
}

/// `grpc-message` is percent-encoded UTF-8; a `%` not followed by two hex digits stays as is.
pub(super) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
