//! The fake apiserver's `/apis/<group>/<version>` paths: ipool's custom resources (ippools,
//! ipblocks, cluster-scoped) and coordination.k8s.io Leases (namespaced), read and written as
//! a real apiserver does: get, list by label selector in pages (`limit`, `continue`), create
//! (409 AlreadyExists), update on a resourceVersion (409 Conflict; a write that changes
//! nothing keeps it), delete with preconditions (uid, resourceVersion: 409 Conflict), every
//! write stamped with the server's clock in `metadata.managedFields` (per field manager).

use std::collections::BTreeMap;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};

use super::{full, status, Body, Key, World};

/// (kind, list kind, namespaced)
fn kind_of(group_version: &str, resource: &str) -> Option<(&'static str, &'static str, bool)> {
    match (group_version, resource) {
        ("ipool.io/v1", "ippools") => Some(("IPPool", "IPPoolList", false)),
        ("ipool.io/v1", "ipblocks") => Some(("IPBlock", "IPBlockList", false)),
        ("coordination.k8s.io/v1", "leases") => Some(("Lease", "LeaseList", true)),
        _ => None,
    }
}

/// `a=b,c!=d,e`: every term holds for the object's labels.
fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k].as_str() == Some(v.trim_start_matches('='))
        } else {
            !labels[term].is_null()
        }
    })
}

/// The server's clock: RFC 3339, whole seconds (metav1.Time), moved on by `skew` seconds.
fn now(skew: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::now().as_second() + skew;
    k8s_openapi::jiff::Timestamp::from_second(t)
        .expect("a time")
        .to_string()
}

/// `obj` as a write by `manager` leaves it: its entry in managedFields stamped now.
fn stamp(obj: &mut Value, manager: &str, skew: i64, api_version: &str) {
    let mut fields: Vec<Value> = obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    fields.retain(|m| m["manager"].as_str() != Some(manager));
    fields.push(
        json!({"manager": manager, "operation": "Update", "apiVersion": api_version,
                       "time": now(skew), "fieldsType": "FieldsV1", "fieldsV1": {}}),
    );
    obj["metadata"]["managedFields"] = json!(fields);
}

/// What a write may change: the object without the fields the server keeps.
fn content(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o["metadata"].as_object_mut() {
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
        ] {
            m.remove(k);
        }
    }
    o
}

fn conflict(message: String) -> hyper::Response<Body> {
    status(409, "Conflict", &message)
}

/// The answer to a request under `/apis/`; None: not such a path.
pub(super) fn respond(
    w: &mut World,
    method: &Method,
    path: &str,
    q: &BTreeMap<String, String>,
    body: &[u8],
) -> Option<hyper::Response<Body>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (gv, resource, ns, name) = match parts.as_slice() {
        ["apis", g, v, r] => (format!("{g}/{v}"), *r, "", None),
        ["apis", g, v, r, n] if *r != "namespaces" => (format!("{g}/{v}"), *r, "", Some(*n)),
        ["apis", g, v, "namespaces", ns, r] => (format!("{g}/{v}"), *r, *ns, None),
        ["apis", g, v, "namespaces", ns, r, n] => (format!("{g}/{v}"), *r, *ns, Some(*n)),
        _ => return None,
    };
    let Some((kind, list_kind, namespaced)) = kind_of(&gv, resource) else {
        return Some(status(
            404,
            "NotFound",
            &format!("the server could not find the requested resource ({gv} {resource})"),
        ));
    };
    if w.no_crds && gv == "ipool.io/v1" {
        return Some(status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    if namespaced == ns.is_empty() {
        return Some(status(404, "NotFound", &format!("no route {path}")));
    }
    let manager = q
        .get("fieldManager")
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let key = |n: &str| -> Key { (resource.to_string(), ns.to_string(), n.to_string()) };
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let skew = w.clock_skew;
    Some(match (method, name) {
        (&Method::GET, Some(n)) => match w.objects.get(&key(n)) {
            Some(o) => full(StatusCode::OK, o.clone()),
            None => status(404, "NotFound", &format!("{resource} \"{n}\" not found")),
        },
        (&Method::GET, None) => {
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            let after = q.get("continue").cloned().unwrap_or_default();
            let limit: usize = q
                .get("limit")
                .and_then(|l| l.parse().ok())
                .filter(|l| *l > 0)
                .unwrap_or(usize::MAX);
            let mut items: Vec<Value> = w
                .objects
                .iter()
                .filter(|(k, o)| {
                    k.0 == resource
                        && (ns.is_empty() || k.1 == ns)
                        && k.2 > after
                        && labels_match(o, &selector)
                })
                .map(|(_, o)| o.clone())
                .collect();
            let more = items.len() > limit;
            items.truncate(limit);
            let next = match (more, items.last()) {
                (true, Some(last)) => last["metadata"]["name"].as_str().unwrap_or("").to_string(),
                _ => String::new(),
            };
            w.listed_pages += 1;
            full(
                StatusCode::OK,
                json!({"kind": list_kind, "apiVersion": gv,
                       "metadata": {"resourceVersion": w.rv.to_string(), "continue": next},
                       "items": items}),
            )
        }
        (&Method::POST, None) => {
            let Some(mut obj) = parsed else {
                return Some(status(400, "BadRequest", "the body is not JSON"));
            };
            let Some(n) = obj["metadata"]["name"].as_str().map(str::to_string) else {
                return Some(status(422, "Invalid", "metadata.name: Required value"));
            };
            if w.objects.contains_key(&key(&n)) {
                return Some(status(
                    409,
                    "AlreadyExists",
                    &format!("{resource} \"{n}\" already exists"),
                ));
            }
            w.rv += 1;
            w.uids += 1;
            obj["apiVersion"] = json!(gv);
            obj["kind"] = json!(kind);
            obj["metadata"]["uid"] = json!(format!("uid-{:08}", w.uids));
            obj["metadata"]["resourceVersion"] = json!(w.rv.to_string());
            obj["metadata"]["creationTimestamp"] = json!(now(skew));
            if namespaced {
                obj["metadata"]["namespace"] = json!(ns);
            }
            stamp(&mut obj, &manager, skew, &gv);
            w.objects.insert(key(&n), obj.clone());
            let rv = w.rv;
            w.events
                .push((rv, resource.to_string(), "ADDED", obj.clone()));
            full(StatusCode::CREATED, obj)
        }
        (&Method::PUT, Some(n)) => {
            let Some(mut obj) = parsed else {
                return Some(status(400, "BadRequest", "the body is not JSON"));
            };
            let Some(stored) = w.objects.get(&key(n)).cloned() else {
                return Some(status(
                    404,
                    "NotFound",
                    &format!("{resource} \"{n}\" not found"),
                ));
            };
            let given = obj["metadata"]["resourceVersion"].as_str().unwrap_or("");
            let have = stored["metadata"]["resourceVersion"].as_str().unwrap_or("");
            if given.is_empty() || given != have {
                return Some(conflict(
                    format!("Operation cannot be fulfilled on {resource} \"{n}\": the object has been modified; please apply your changes to the latest version and try again"),
                ));
            }
            obj["apiVersion"] = json!(gv);
            obj["kind"] = json!(kind);
            if content(&obj) == content(&stored) {
                return Some(full(StatusCode::OK, stored));
            }
            w.rv += 1;
            for k in ["uid", "creationTimestamp", "managedFields"] {
                obj["metadata"][k] = stored["metadata"][k].clone();
            }
            obj["metadata"]["resourceVersion"] = json!(w.rv.to_string());
            stamp(&mut obj, &manager, skew, &gv);
            w.objects.insert(key(n), obj.clone());
            let rv = w.rv;
            w.events
                .push((rv, resource.to_string(), "MODIFIED", obj.clone()));
            full(StatusCode::OK, obj)
        }
        (&Method::DELETE, Some(n)) => {
            let Some(stored) = w.objects.get(&key(n)).cloned() else {
                return Some(status(
                    404,
                    "NotFound",
                    &format!("{resource} \"{n}\" not found"),
                ));
            };
            let pre = parsed
                .as_ref()
                .map(|b| b["preconditions"].clone())
                .unwrap_or(Value::Null);
            for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
                if let Some(want) = pre[field].as_str() {
                    let have = stored["metadata"][field].as_str().unwrap_or("");
                    if want != have {
                        return Some(conflict(
                            format!("Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"),
                        ));
                    }
                }
            }
            w.objects.remove(&key(n));
            w.rv += 1;
            let rv = w.rv;
            w.events
                .push((rv, resource.to_string(), "DELETED", stored.clone()));
            full(StatusCode::OK, stored)
        }
        (m, _) => status(
            405,
            "MethodNotAllowed",
            &format!("{m} is not served on {path}"),
        ),
    })
}
