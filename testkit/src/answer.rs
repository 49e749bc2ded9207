//! An apiserver's answer: its HTTP status and body, and the `Status` object of a failure.

use serde_json::{json, Value};

/// An answer: the HTTP status and the JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// A status answer, as the apiserver writes one.
pub fn status(code: u16, reason: &str, message: &str) -> Answer {
    Answer {
        status: code,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": message, "reason": reason, "code": code}),
    }
}
