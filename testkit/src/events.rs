//! The apiserver's rules for events.k8s.io/v1 Events (Kubernetes'
//! `pkg/apis/core/validation/events.go`, strict for this API version), and JSON merge patch
//! (RFC 7386), as `PATCH` with `application/merge-patch+json` applies it.
//!
//! Create: `eventTime`, `reportingController` (a qualified name), `reportingInstance`
//! (at most 128 characters), `action` and `reason` (at most 128) are required; `type` is
//! Normal or Warning; `note` at most 1 kB; `regarding.namespace`, when set, is the Event's; a
//! `series` has `count` at least 2 and a `lastObservedTime`; the deprecated fields of
//! core/v1 are unset. Update: all of that but the series is immutable.

use serde_json::Value;

/// Why the apiserver would refuse to create `event` in namespace `ns` (422), if it would.
pub fn invalid(event: &Value, ns: &str) -> Option<String> {
    let s = |k: &str| event[k].as_str().unwrap_or_default();
    let required = [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ];
    if let Some(k) = required.iter().find(|k| s(k).is_empty()) {
        return Some(format!("{k}: Required value"));
    }
    if !qualified_name(s("reportingController")) {
        return Some(format!(
            "reportingController: Invalid value: {:?}: must be a qualified name",
            s("reportingController")
        ));
    }
    for (k, max) in [
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
        ("note", 1024),
    ] {
        if s(k).len() > max {
            return Some(format!(
                "{k}: Invalid value: can have at most {max} characters"
            ));
        }
    }
    if !matches!(s("type"), "Normal" | "Warning") {
        return Some(format!("type: Invalid value: {:?}", s("type")));
    }
    let regarding_ns = event["regarding"]["namespace"].as_str().unwrap_or_default();
    if regarding_ns.is_empty() && !matches!(ns, "default" | "kube-system") {
        return Some(format!(
            "regarding.namespace: Invalid value: \"\": does not match event.namespace ({ns:?}; an Event about a cluster-scoped object lives in default or kube-system)"
        ));
    }
    if !regarding_ns.is_empty() && regarding_ns != ns {
        return Some(format!(
            "regarding.namespace: Invalid value: {regarding_ns:?}: does not match event.namespace"
        ));
    }
    for k in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
        "deprecatedSource",
    ] {
        if !event[k].is_null() {
            return Some(format!("{k}: Invalid value: needs to be unset"));
        }
    }
    invalid_series(event)
}

/// Why the apiserver would refuse `new` as an update of `old` (422), if it would.
pub fn invalid_update(new: &Value, old: &Value) -> Option<String> {
    for k in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
        "note",
        "type",
        "regarding",
        "related",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
        "deprecatedSource",
    ] {
        if new[k] != old[k] {
            return Some(format!("{k}: Invalid value: field is immutable"));
        }
    }
    match new["series"] == old["series"] {
        true => None,
        false => invalid_series(new),
    }
}

fn invalid_series(event: &Value) -> Option<String> {
    let series = &event["series"];
    if series.is_null() {
        return None;
    }
    if series["count"].as_i64().unwrap_or(0) < 2 {
        return Some("series.count: Invalid value: should be at least 2".into());
    }
    if series["lastObservedTime"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        return Some("series.lastObservedTime: Required value".into());
    }
    None
}

/// A qualified name: an optional DNS subdomain prefix and `/`, then at most 63 characters of
/// alphanumerics, `-`, `_` and `.`, alphanumeric at both ends.
fn qualified_name(v: &str) -> bool {
    let (prefix, name) = match v.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, v),
    };
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    prefix.is_none_or(crate::meta_rules::valid_name)
        && !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && alnum(name.chars().next())
        && alnum(name.chars().last())
}

/// `patch` merged into `target` as RFC 7386 says: objects merged key by key, `null` removes,
/// anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        match v {
            Value::Null => {
                t.remove(k);
            }
            _ => merge_patch(t.entry(k.clone()).or_insert(Value::Null), v),
        }
    }
}

#[cfg(test)]
mod tests;
