//! The CNI spec's rules for the names that make up an attachment key, shared by the plugin
//! (which checks before it calls) and the daemon (which checks what it is sent).

/// The longest container ID or network name, in bytes (container IDs are 64 hex digits).
pub const MAX_NAME: usize = 255;
/// The longest pod namespace, name and UID, in bytes: Kubernetes's own limits (a namespace is
/// a DNS label, a name a DNS subdomain; a UID is 36 characters, with room to spare).
pub const MAX_POD_NAMESPACE: usize = 63;
pub const MAX_POD_NAME: usize = 253;
pub const MAX_POD_UID: usize = 128;

/// `s` for a message: quoted, and cut after 64 characters.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{:?}... ({} bytes)", &s[..i], s.len()),
        None => format!("{s:?}"),
    }
}

/// Refuses `s` when it is longer than `max` bytes.
pub fn check_len(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!(
            "{what} {} is too long: the limit is {max} bytes",
            shown(s)
        ));
    }
    Ok(())
}

/// A pod's identity from CNI_ARGS: each part within Kubernetes's limits.
pub fn check_pod(namespace: &str, name: &str, uid: &str) -> Result<(), String> {
    check_len("K8S_POD_NAMESPACE", namespace, MAX_POD_NAMESPACE)?;
    check_len("K8S_POD_NAME", name, MAX_POD_NAME)?;
    check_len("K8S_POD_UID", uid, MAX_POD_UID)
}

/// A container ID or network name: non-empty, at most [`MAX_NAME`] bytes, starts with a letter
/// or digit, then letters, digits, `_`, `.`, `-`. `what` names the value in the message.
pub fn check_name(what: &str, s: &str) -> Result<(), String> {
    check_len(what, s, MAX_NAME)?;
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
            "{what} {} is {} bytes long; the limit is 15",
            shown(s),
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

/// The longest name of an object that is also a label value on Kubernetes (a label value
/// holds at most 63 characters).
pub const MAX_KUBE_LABELLED_NAME: usize = 63;

/// A name Kubernetes accepts both as an object's name and as a label value: a DNS-1123
/// subdomain (lowercase letters, digits, '-' and '.'; each dot-separated part starting and
/// ending with a letter or digit) of at most `max` characters (63 where it is a label value
/// too). The message names the rule and the bad value.
pub fn check_kube_name(what: &str, s: &str, max: usize) -> Result<(), String> {
    let rule = format!(
        "on the Kubernetes API it must be a DNS-1123 subdomain of at most {max} characters (lowercase letters, digits, '-' and '.', each part between dots starting and ending with a letter or digit)"
    );
    let bad = |why: String| Err(format!("{what} {}: {why}; {rule}", shown(s)));
    if s.is_empty() {
        return bad("it is empty".into());
    }
    if s.len() > max {
        return bad(format!("it is {} characters", s.len()));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return bad(format!("it has {c:?}"));
    }
    for part in s.split('.') {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if !alnum(part.chars().next()) || !alnum(part.chars().last()) {
            return bad(format!(
                "{:?} does not start and end with a letter or digit",
                part
            ));
        }
    }
    Ok(())
}
