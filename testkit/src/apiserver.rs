//! The Kubernetes apiserver's objects in memory, read and written by its rules:
//!
//! - every write moves the resourceVersion (one counter for all objects, as etcd's revision
//!   is); a write that changes nothing keeps it;
//! - get; list by label selector in pages (`limit`, `continue`), the list's resourceVersion
//!   the counter's;
//! - create: 409 AlreadyExists; a new uid; update on a resourceVersion: 409 Conflict when it
//!   is not the stored one; delete with preconditions (uid, resourceVersion): 409 Conflict;
//! - names DNS-1123 subdomains and label values at most 63 characters of `[A-Za-z0-9._-]`,
//!   alphanumeric at both ends: 422 Invalid on objects, 400 BadRequest in label selectors;
//! - every write stamped, per field manager, with the server's clock in
//!   `metadata.managedFields` (whole seconds);
//! - every change kept as an event while `keep_events` is set (watches read them).
//!
//! - patch: JSON merge patch only (`application/merge-patch+json`; 415 for any other type), a
//!   `metadata.resourceVersion` in it a precondition (409);
//!
//! The resources are those ipool reads and writes: core/v1 `nodes` and `pods` (put and deleted
//! by the tests, [`Objects::put`], [`Objects::delete`]), `ipool.io/v1` `ippools`,
//! `ipblocks` and `ippins` (cluster-scoped), `coordination.k8s.io/v1` `leases` and
//! `events.k8s.io/v1` `events` (namespaced, held to [`crate::events`]' rules), the last five
//! served to clients by [`Objects::respond`].

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::access::Access;
pub use crate::answer::{status, Answer};
use crate::caller::{Attributes, UserInfo};
use crate::meta_rules::{invalid, labels_match, selector_terms};

/// An object's place: (resource, namespace, name); namespace "" when cluster-scoped.
pub type Key = (String, String, String);

/// A change: (resourceVersion, resource, ADDED | MODIFIED | DELETED, the object, the object
/// before: a label-selector watch needs both, see [`watch_event`]).
pub type Event = (u64, String, &'static str, Value, Option<Value>);

/// The objects of one apiserver.
#[derive(Default)]
pub struct Objects {
    /// The last resourceVersion written.
    pub rv: u64,
    pub objects: BTreeMap<Key, Value>,
    /// Every change, while `keep_events` is set.
    pub events: Vec<Event>,
    pub keep_events: bool,
    /// uids handed out.
    uids: u64,
    /// Pages of lists answered by [`Objects::respond`].
    pub listed_pages: u64,
}

fn ok(status: u16, body: Value) -> Answer {
    Answer { status, body }
}

/// `secs` (Unix) as the apiserver writes a metav1.Time: RFC 3339, whole seconds.
pub fn rfc3339(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// A query string's pairs, unescaped.
pub fn url_pairs(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (unescape(k), unescape(v)))
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query key [`Objects::respond`] finds a request's `Content-Type` under (no client sends
/// it: the fake apiserver puts it there).
pub const CONTENT_TYPE: &str = " content-type";

/// (kind, list kind, namespaced) of a resource served under `/apis`.
fn kind_of(group_version: &str, resource: &str) -> Option<(&'static str, &'static str, bool)> {
    match (group_version, resource) {
        ("ipool.io/v1", "ippools") => Some(("IPPool", "IPPoolList", false)),
        ("ipool.io/v1", "ipblocks") => Some(("IPBlock", "IPBlockList", false)),
        ("ipool.io/v1", "ippins") => Some(("IPPin", "IPPinList", false)),
        ("coordination.k8s.io/v1", "leases") => Some(("Lease", "LeaseList", true)),
        ("events.k8s.io/v1", "events") => Some(("Event", "EventList", true)),
        _ => None,
    }
}

/// `obj` as a write by `manager` leaves it: its entry in managedFields stamped `now`.
fn stamp(obj: &mut Value, manager: &str, now: &str, api_version: &str) {
    let mut fields: Vec<Value> = obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    fields.retain(|m| m["manager"].as_str() != Some(manager));
    fields.push(
        json!({"manager": manager, "operation": "Update", "apiVersion": api_version,
               "time": now, "fieldsType": "FieldsV1", "fieldsV1": {}}),
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

/// What a watch under `/apis/` asks for: (resource, namespace or "" for all).
pub fn watch_target(path: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["apis", _, _, r] => Some((r.to_string(), String::new())),
        ["apis", _, _, "namespaces", ns, r] => Some((r.to_string(), ns.to_string())),
        _ => None,
    }
}

/// Checks a watch's label selector: the 400 its watch would get, if any.
pub fn check_selector(selector: &str) -> Option<Answer> {
    selector_terms(selector)
        .err()
        .map(|why| status(400, "BadRequest", &why))
}

/// What a watch of `resource` (in namespace `ns`, "" for all) with label selector `selector`
/// hears of event `ev`, as the apiserver's watch cache decides (k8s.io/apiserver
/// `cacheWatcher.convertToWatchEvent`): the object before and after are each matched; after
/// only: ADDED; both: MODIFIED; before only: DELETED, with the object as it was (and the
/// event's resourceVersion); neither: nothing.
pub fn watch_event(ev: &Event, resource: &str, ns: &str, selector: &str) -> Option<Value> {
    let (rv, r, kind, obj, prev) = ev;
    let in_ns = |o: &Value| ns.is_empty() || o["metadata"]["namespace"].as_str() == Some(ns);
    if r != resource || !in_ns(obj) {
        return None;
    }
    let terms = selector_terms(selector).ok()?;
    let now = *kind != "DELETED" && labels_match(obj, &terms);
    let before = prev.as_ref().is_some_and(|p| labels_match(p, &terms));
    let (t, mut o) = match (now, before) {
        (true, false) => ("ADDED", obj.clone()),
        (true, true) => ("MODIFIED", obj.clone()),
        (false, true) => ("DELETED", prev.clone().unwrap_or(Value::Null)),
        (false, false) => return None,
    };
    o["metadata"]["resourceVersion"] = json!(rv.to_string());
    Some(json!({"type": t, "object": o}))
}

fn conflict(message: String) -> Answer {
    status(409, "Conflict", &message)
}

impl Objects {
    /// Objects whose changes are kept as events (`keep_events`) or not.
    pub fn new(keep_events: bool) -> Objects {
        Objects {
            keep_events,
            ..Objects::default()
        }
    }

    fn record(&mut self, resource: &str, kind: &'static str, obj: &Value, prev: Option<&Value>) {
        if self.keep_events {
            self.events.push((
                self.rv,
                resource.to_string(),
                kind,
                obj.clone(),
                prev.cloned(),
            ));
        }
    }

    /// Creates or replaces an object as a controller would (`resource`: "nodes" or "pods";
    /// its apiVersion and kind are set here).
    pub fn put(&mut self, resource: &str, kind: &str, mut obj: Value) {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        if obj["apiVersion"].is_null() {
            obj["apiVersion"] = json!("v1");
        }
        obj["kind"] = json!(kind);
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = (resource.to_string(), ns, name);
        let prev = self.objects.insert(key, obj.clone());
        let change = match prev {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        self.record(resource, change, &obj, prev.as_ref());
    }

    /// Replaces an object of the `/apis` paths as an update would (its uid kept, a new
    /// resourceVersion), whatever resourceVersion it says.
    pub fn put_custom(&mut self, resource: &str, mut obj: Value) {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let prev = self
            .objects
            .insert((resource.to_string(), ns, name), obj.clone());
        let change = if prev.is_some() { "MODIFIED" } else { "ADDED" };
        self.record(resource, change, &obj, prev.as_ref());
    }

    /// Deletes an object; false when there was none.
    pub fn delete(&mut self, resource: &str, namespace: &str, name: &str) -> bool {
        let key = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        match self.objects.remove(&key) {
            Some(mut obj) => {
                let prev = obj.clone();
                self.rv += 1;
                obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.record(resource, "DELETED", &obj, Some(&prev));
                true
            }
            None => false,
        }
    }

    /// The answer to a request under `/apis/` (`query` unescaped, `now` the server's clock in
    /// Unix seconds); None: not such a path. With `crds` false, ipool.io's resources are not
    /// served (its CustomResourceDefinitions not applied).
    pub fn respond(
        &mut self,
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
        body: &[u8],
        now: i64,
        crds: bool,
    ) -> Option<Answer> {
        self.respond_as(None, method, path, query, body, now, crds)
    }

    /// [`Objects::respond`], each write admitted by `caller`'s access for its user (the
    /// admission policies; RBAC is the caller's to ask first, [`Access::authorize`]).
    #[allow(clippy::too_many_arguments)]
    pub fn respond_as(
        &mut self,
        caller: Option<(&Access, &UserInfo)>,
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
        body: &[u8],
        now: i64,
        crds: bool,
    ) -> Option<Answer> {
        let admit = |object: Option<&Value>, old: Option<&Value>| -> Result<(), Answer> {
            let Some((access, user)) = caller else {
                return Ok(());
            };
            match Attributes::of(method, path, query) {
                Some(a) => access.admit(user, &a, object, old),
                None => Ok(()),
            }
        };
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (gv, resource, ns, name) = match parts.as_slice() {
            ["apis", g, v, r] => (format!("{g}/{v}"), *r, "", None),
            ["apis", g, v, r, n] if *r != "namespaces" => (format!("{g}/{v}"), *r, "", Some(*n)),
            ["apis", g, v, "namespaces", ns, r] => (format!("{g}/{v}"), *r, *ns, None),
            ["apis", g, v, "namespaces", ns, r, n] => (format!("{g}/{v}"), *r, *ns, Some(*n)),
            _ => return None,
        };
        // The pins' owners, which the fake apiserver serves by name (see `fake_api`).
        if matches!(gv.as_str(), "apps/v1" | "kubevirt.io/v1") {
            return None;
        }
        let Some((kind, list_kind, namespaced)) = kind_of(&gv, resource) else {
            return Some(status(
                404,
                "NotFound",
                &format!("the server could not find the requested resource ({gv} {resource})"),
            ));
        };
        if !crds && gv == "ipool.io/v1" {
            return Some(status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        if namespaced == ns.is_empty() {
            return Some(status(404, "NotFound", &format!("no route {path}")));
        }
        let manager = query
            .get("fieldManager")
            .cloned()
            .unwrap_or_else(|| "unknown".into());
        let key = |n: &str| -> Key { (resource.to_string(), ns.to_string(), n.to_string()) };
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let now = rfc3339(now);
        Some(match (method, name) {
            ("GET", Some(n)) => match self.objects.get(&key(n)) {
                Some(o) => ok(200, o.clone()),
                None => status(404, "NotFound", &format!("{resource} \"{n}\" not found")),
            },
            ("GET", None) => {
                let selector = query.get("labelSelector").cloned().unwrap_or_default();
                let terms = match selector_terms(&selector) {
                    Ok(t) => t,
                    Err(why) => return Some(status(400, "BadRequest", &why)),
                };
                let after = query.get("continue").cloned().unwrap_or_default();
                let limit: usize = query
                    .get("limit")
                    .and_then(|l| l.parse().ok())
                    .filter(|l| *l > 0)
                    .unwrap_or(usize::MAX);
                let mut items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(k, o)| {
                        k.0 == resource
                            && (ns.is_empty() || k.1 == ns)
                            && k.2 > after
                            && labels_match(o, &terms)
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                let more = items.len() > limit;
                items.truncate(limit);
                let next = match (more, items.last()) {
                    (true, Some(last)) => {
                        last["metadata"]["name"].as_str().unwrap_or("").to_string()
                    }
                    _ => String::new(),
                };
                self.listed_pages += 1;
                ok(
                    200,
                    json!({"kind": list_kind, "apiVersion": gv,
                           "metadata": {"resourceVersion": self.rv.to_string(), "continue": next},
                           "items": items}),
                )
            }
            ("POST", None) => {
                let Some(mut obj) = parsed else {
                    return Some(status(400, "BadRequest", "the body is not JSON"));
                };
                let Some(n) = obj["metadata"]["name"].as_str().map(str::to_string) else {
                    return Some(status(422, "Invalid", "metadata.name: Required value"));
                };
                if let Some(why) = invalid(&obj) {
                    return Some(status(422, "Invalid", &why));
                }
                if let Some(why) = (resource == "events")
                    .then(|| crate::events::invalid(&obj, ns))
                    .flatten()
                {
                    return Some(status(422, "Invalid", &why));
                }
                if self.objects.contains_key(&key(&n)) {
                    return Some(status(
                        409,
                        "AlreadyExists",
                        &format!("{resource} \"{n}\" already exists"),
                    ));
                }
                self.rv += 1;
                self.uids += 1;
                obj["apiVersion"] = json!(gv);
                obj["kind"] = json!(kind);
                obj["metadata"]["uid"] = json!(format!("uid-{:08}", self.uids));
                obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                obj["metadata"]["creationTimestamp"] = json!(now);
                if namespaced {
                    obj["metadata"]["namespace"] = json!(ns);
                }
                stamp(&mut obj, &manager, &now, &gv);
                if let Err(denied) = admit(Some(&obj), None) {
                    self.rv -= 1;
                    self.uids -= 1;
                    return Some(denied);
                }
                self.objects.insert(key(&n), obj.clone());
                self.record(resource, "ADDED", &obj, None);
                ok(201, obj)
            }
            ("PUT", Some(n)) => {
                let Some(mut obj) = parsed else {
                    return Some(status(400, "BadRequest", "the body is not JSON"));
                };
                let Some(stored) = self.objects.get(&key(n)).cloned() else {
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
                if let Some(why) = invalid(&obj) {
                    return Some(status(422, "Invalid", &why));
                }
                obj["apiVersion"] = json!(gv);
                obj["kind"] = json!(kind);
                if let Err(denied) = admit(Some(&obj), Some(&stored)) {
                    return Some(denied);
                }
                if content(&obj) == content(&stored) {
                    return Some(ok(200, stored));
                }
                self.rv += 1;
                for k in ["uid", "creationTimestamp", "managedFields"] {
                    obj["metadata"][k] = stored["metadata"][k].clone();
                }
                obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                stamp(&mut obj, &manager, &now, &gv);
                self.objects.insert(key(n), obj.clone());
                self.record(resource, "MODIFIED", &obj, Some(&stored));
                ok(200, obj)
            }
            ("PATCH", Some(n)) => {
                let merge = "application/merge-patch+json";
                let given = query.get(CONTENT_TYPE).map(String::as_str).unwrap_or("");
                if given.split(';').next() != Some(merge) {
                    return Some(status(
                        415,
                        "UnsupportedMediaType",
                        &format!("the body of the request was in an unknown format - accepted media types include: {merge} (this apiserver's; got {given:?})"),
                    ));
                }
                let Some(patch) = parsed.filter(|p| {
                    p.is_object() && (p["metadata"].is_null() || p["metadata"].is_object())
                }) else {
                    return Some(status(
                        400,
                        "BadRequest",
                        "the body is not a JSON object (a merge patch), or its metadata is not one",
                    ));
                };
                let Some(stored) = self.objects.get(&key(n)).cloned() else {
                    return Some(status(
                        404,
                        "NotFound",
                        &format!("{resource} \"{n}\" not found"),
                    ));
                };
                if let Some(want) = patch["metadata"]["resourceVersion"].as_str() {
                    let have = stored["metadata"]["resourceVersion"].as_str().unwrap_or("");
                    if want != have {
                        return Some(conflict(
                            format!("Operation cannot be fulfilled on {resource} \"{n}\": the object has been modified; please apply your changes to the latest version and try again"),
                        ));
                    }
                }
                let mut obj = stored.clone();
                crate::events::merge_patch(&mut obj, &patch);
                for k in [
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "managedFields",
                ] {
                    obj["metadata"][k] = stored["metadata"][k].clone();
                }
                obj["apiVersion"] = json!(gv);
                obj["kind"] = json!(kind);
                let why = invalid(&obj).or_else(|| {
                    (resource == "events")
                        .then(|| crate::events::invalid_update(&obj, &stored))
                        .flatten()
                });
                if let Some(why) = why {
                    return Some(status(422, "Invalid", &why));
                }
                if let Err(denied) = admit(Some(&obj), Some(&stored)) {
                    return Some(denied);
                }
                if content(&obj) == content(&stored) {
                    return Some(ok(200, stored));
                }
                self.rv += 1;
                obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                stamp(&mut obj, &manager, &now, &gv);
                self.objects.insert(key(n), obj.clone());
                self.record(resource, "MODIFIED", &obj, Some(&stored));
                ok(200, obj)
            }
            ("DELETE", Some(n)) => {
                let Some(stored) = self.objects.get(&key(n)).cloned() else {
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
                if let Err(denied) = admit(None, Some(&stored)) {
                    return Some(denied);
                }
                self.objects.remove(&key(n));
                self.rv += 1;
                let mut gone = stored.clone();
                gone["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.record(resource, "DELETED", &gone, Some(&stored));
                ok(200, stored)
            }
            (m, _) => status(
                405,
                "MethodNotAllowed",
                &format!("{m} is not served on {path}"),
            ),
        })
    }
}

#[cfg(test)]
mod tests;
