//! A manifest's documents (multi-document YAML, as deploy/ renders them) as JSON.

use serde::Deserialize;
use serde_json::Value;

/// Every non-empty document of `yaml`, in order.
pub fn documents(yaml: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let v = Value::deserialize(doc).map_err(|e| e.to_string())?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}
