//! Who a request comes from (the authenticator's user) and what it asks for (the authorizer's
//! attributes): what RBAC ([`access`](crate::access)) and the admission policies
//! ([`admission`](crate::admission)) both judge.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// Who a request comes from, as the authenticator says (a token's user).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A cluster admin (the tests' own calls).
    pub fn admin() -> UserInfo {
        UserInfo {
            username: "kubernetes-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            extra: BTreeMap::new(),
        }
    }

    /// ServiceAccount `namespace/name`, with a token of its own (not bound to a pod).
    pub fn service_account(namespace: &str, name: &str) -> UserInfo {
        UserInfo {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra: BTreeMap::new(),
        }
    }

    /// ServiceAccount `namespace/name` with a token bound to a pod on `node` (what a
    /// DaemonSet's pod gets, Kubernetes 1.30+: the node's name in the user's extra).
    pub fn pod_on_node(namespace: &str, name: &str, pod: &str, node: &str) -> UserInfo {
        let mut u = UserInfo::service_account(namespace, name);
        u.extra.insert(
            "authentication.kubernetes.io/node-name".into(),
            vec![node.to_string()],
        );
        u.extra.insert(
            "authentication.kubernetes.io/pod-name".into(),
            vec![pod.to_string()],
        );
        u
    }

    /// `request.userInfo` as admission sees it.
    pub fn json(&self) -> Value {
        json!({"username": self.username, "groups": self.groups, "extra": self.extra})
    }

    pub(crate) fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// What a request asks for, as the authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// get, list, watch, create, update, patch, delete.
    pub verb: String,
    /// "" for the core group.
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    /// "" for a cluster-scoped resource.
    pub namespace: String,
    /// "" for a collection.
    pub name: String,
}

impl Attributes {
    /// The attributes of `method path?query`; None for a path that names no resource
    /// (discovery, `/version`: every authenticated caller may read those).
    pub fn of(method: &str, path: &str, query: &BTreeMap<String, String>) -> Option<Attributes> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (group, version, rest) = match parts.as_slice() {
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
            _ => ("", rest),
        };
        let (resource, name, subresource) = match rest {
            [r] => (*r, "", ""),
            [r, n] => (*r, *n, ""),
            [r, n, s] => (*r, *n, *s),
            // `namespaces/<ns>` itself.
            [] if !namespace.is_empty() => ("namespaces", namespace, ""),
            _ => return None,
        };
        let namespace = match resource == "namespaces" {
            true => "",
            false => namespace,
        };
        let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        let verb = match (method, name.is_empty()) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "list",
            ("GET", false) => "get",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "deletecollection",
            ("DELETE", false) => "delete",
            _ => return None,
        };
        Some(Attributes {
            verb: verb.into(),
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    /// `leases.coordination.k8s.io`, as messages name a resource.
    pub(crate) fn qualified(&self) -> String {
        match self.group.as_str() {
            "" => self.resource.clone(),
            g => format!("{}.{g}", self.resource),
        }
    }
}
