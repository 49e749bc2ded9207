//! The CNI spec's rules for the names that make up an attachment key, shared by the plugin
//! (which checks before it calls) and the daemon (which checks what it is sent).

/// A container ID or network name: non-empty, starts with a letter or digit, then letters,
/// digits, `_`, `.`, `-`. `what` names the value in the message.
pub fn check_name(what: &str, s: &str) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err(format!("{what} is empty")),
        Some(c) if !c.is_ascii_alphanumeric() => {
            return Err(format!("{what} {s:?} must start with a letter or digit"))
        }
        _ => {}
    }
    match chars.find(|c| !(c.is_ascii_alphanumeric() || "_.-".contains(*c))) {
        Some(c) => Err(format!(
            "{what} {s:?} has {c:?}; only letters, digits, '_', '.' and '-' are allowed"
        )),
        None => Ok(()),
    }
}

/// An interface name: non-empty, not `.` or `..`, at most 15 bytes, no `/`, `:` or white space.
pub fn check_ifname(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if s == "." || s == ".." {
        return Err(format!("{what} {s:?} is not allowed"));
    }
    if s.len() > 15 {
        return Err(format!(
            "{what} {s:?} is {} bytes long; the limit is 15",
            s.len()
        ));
    }
    match s
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace())
    {
        Some(c) => Err(format!("{what} {s:?} must not contain {c:?}")),
        None => Ok(()),
    }
}
