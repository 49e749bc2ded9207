//! The apiserver's rules for object metadata, as the fake apiserver and its Events enforce
//! them: names (DNS-1123 subdomains), label values, label selectors, and what a write's
//! metadata must satisfy (a 422 otherwise).

use serde_json::Value;

/// A label value Kubernetes accepts: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric
/// at both ends (or empty).
pub fn valid_label_value(v: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && alnum(v.chars().next())
            && alnum(v.chars().last()))
}

/// A DNS-1123 subdomain: at most 253 characters, lowercase alphanumerics, `-` and `.`, each
/// part between dots alphanumeric at both ends.
pub fn valid_name(n: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|p| {
            p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && alnum(p.chars().next())
                && alnum(p.chars().last())
        })
}

/// A label selector's term: the key, and (equal?, value), or None for "exists".
pub(crate) type Term = (String, Option<(bool, String)>);

/// The terms of a label selector (`a=b,c!=d,e`), or why it is invalid.
pub(crate) fn selector_terms(selector: &str) -> Result<Vec<Term>, String> {
    selector
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|term| {
            let (key, test) = if let Some((k, v)) = term.split_once("!=") {
                (k, Some((false, v)))
            } else if let Some((k, v)) = term.split_once('=') {
                (k, Some((true, v.trim_start_matches('='))))
            } else {
                (term, None)
            };
            if let Some((_, v)) = test {
                if !valid_label_value(v) {
                    return Err(format!("unable to parse requirement: values[0][{key}]: Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
                }
            }
            Ok((key.to_string(), test.map(|(eq, v)| (eq, v.to_string()))))
        })
        .collect()
}

/// Every term holds for the object's labels.
pub(crate) fn labels_match(obj: &Value, terms: &[Term]) -> bool {
    let labels = &obj["metadata"]["labels"];
    terms.iter().all(|(k, test)| match test {
        Some((true, v)) => labels[k].as_str() == Some(v),
        Some((false, v)) => labels[k].as_str() != Some(v),
        None => !labels[k].is_null(),
    })
}

/// Why an object's metadata would be refused (422), if it would.
pub(crate) fn invalid(obj: &Value) -> Option<String> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if !valid_name(name) {
        return Some(format!("metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
    }
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or_default();
            if !valid_label_value(v) {
                return Some(format!("metadata.labels: Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (label {k})"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
