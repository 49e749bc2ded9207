//! A pool's `nodeSelector`: a Kubernetes label selector over the Node's labels, written as
//! `kubectl -l` takes one (`zone=a,rack in (r1,r2),!gpu`): requirements joined by commas, all
//! of which must hold. `k=v` / `k==v`, `k!=v` (also true where the label is absent), `k in
//! (a,b)`, `k notin (a,b)` (also true where absent), `k` (present), `!k` (absent). Keys and
//! values are checked by Kubernetes' rules (a qualified name; a value of at most 63
//! characters).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The longest selector kept in a pool.
pub const MAX_SELECTOR: usize = 1024;

/// A parsed selector; its text is `NodeSelector::to_string`, in a normal form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSelector(Vec<Requirement>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    Absent(String),
}

impl NodeSelector {
    /// Parses `text`; the error names the requirement that is wrong and why.
    pub fn parse(text: &str) -> Result<NodeSelector, BadSelector> {
        if text.chars().count() > MAX_SELECTOR {
            return Err(BadSelector(format!(
                "node selector is longer than {MAX_SELECTOR} characters"
            )));
        }
        let mut out = Vec::new();
        for part in split_top(text)? {
            let part = part.trim();
            if part.is_empty() {
                return Err(BadSelector(format!(
                    "node selector {text:?} has an empty requirement"
                )));
            }
            out.push(
                requirement(part)
                    .map_err(|e| BadSelector(format!("node selector {text:?}: {e}")))?,
            );
        }
        if out.is_empty() {
            return Err(BadSelector(
                "node selector is empty (leave it out to let every node use the pool)".into(),
            ));
        }
        Ok(NodeSelector(out))
    }

    /// Whether a Node with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
        })
    }
}

impl fmt::Display for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", set(vs)),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", set(vs)),
                Requirement::Exists(k) => k.clone(),
                Requirement::Absent(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// A node selector that Kubernetes' rules refuse: where, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadSelector(pub String);

/// A label key's prefix refused by the name rules, in their words.
impl From<String> for BadSelector {
    fn from(why: String) -> BadSelector {
        BadSelector(why)
    }
}

/// The requirements of `text`: split at the commas outside parentheses.
fn split_top(text: &str) -> Result<Vec<&str>, BadSelector> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => {
                return Err(BadSelector(format!(
                    "node selector {text:?}: nested parentheses"
                )))
            }
            ')' if depth == 1 => depth = 0,
            ')' => {
                return Err(BadSelector(format!(
                    "node selector {text:?}: a ')' without its '('"
                )))
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(BadSelector(format!(
            "node selector {text:?}: a '(' without its ')'"
        )));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, BadSelector> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::Absent(key_of(key)?));
    }
    for (op, ne) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = part.split_once(op) {
            let (k, v) = (key_of(k)?, value_of(v)?);
            return Ok(match ne {
                true => Requirement::NotEquals(k, v),
                false => Requirement::Equals(k, v),
            });
        }
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words[..] {
        let rest = rest.trim_start();
        for (op, not) in [("notin", true), ("in", false)] {
            if let Some(list) = rest.strip_prefix(op) {
                let list = list.trim();
                let inner = list
                    .strip_prefix('(')
                    .and_then(|l| l.strip_suffix(')'))
                    .ok_or_else(|| {
                        BadSelector(format!(
                            "{part:?}: {op} takes a list in parentheses: {key} {op} (a,b)"
                        ))
                    })?;
                let values = inner
                    .split(',')
                    .map(value_of)
                    .collect::<Result<BTreeSet<_>, _>>()?;
                if values.is_empty() || inner.trim().is_empty() {
                    return Err(BadSelector(format!(
                        "{part:?}: {op} needs at least one value"
                    )));
                }
                let key = key_of(key)?;
                return Ok(match not {
                    true => Requirement::NotIn(key, values),
                    false => Requirement::In(key, values),
                });
            }
        }
        return Err(BadSelector(format!(
            "{part:?} is not a requirement (key=value, key!=value, key in (a,b), key notin (a,b), key, !key)"
        )));
    }
    Ok(Requirement::Exists(key_of(part)?))
}

/// A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63
/// characters (alphanumerics, '-', '_', '.', beginning and ending alphanumeric).
fn key_of(key: &str) -> Result<String, BadSelector> {
    let key = key.trim();
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        ipool_proto::names::check_kube_name("label key prefix", p, 253)?;
    }
    if name.is_empty() || !label_text(name) {
        return Err(BadSelector(format!(
            "label key {key:?}: its name must be 1 to 63 characters of [A-Za-z0-9-_.], beginning and ending alphanumeric"
        )));
    }
    Ok(key.to_string())
}

/// A label value: empty, or at most 63 characters of [A-Za-z0-9-_.], beginning and ending
/// alphanumeric.
fn value_of(value: &str) -> Result<String, BadSelector> {
    let value = value.trim();
    if !value.is_empty() && !label_text(value) {
        return Err(BadSelector(format!(
            "label value {value:?}: at most 63 characters of [A-Za-z0-9-_.], beginning and ending alphanumeric"
        )));
    }
    Ok(value.to_string())
}

fn label_text(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.len() <= 63
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}

#[cfg(test)]
mod tests;
