//! Who may do what on the apiserver, as a real one decides it: RBAC (Roles, ClusterRoles and
//! their bindings) and the ValidatingAdmissionPolicies with their bindings ([`admission`]),
//! read from a manifest (deploy/'s rendered files). A request is authorized before anything
//! else (403 Forbidden), admitted after its object is checked and before it is stored (422
//! Invalid). A caller in the group `system:masters` (the tests' own, with no token) passes RBAC,
//! as a cluster admin does; the policies still see it, and match it or not by their own
//! conditions.
//!
//! [`admission`]: crate::admission

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::admission::Policies;
use crate::answer::{status, Answer};
pub use crate::caller::{Attributes, UserInfo};

/// One rule of a Role or ClusterRole.
#[derive(Clone, Debug)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

impl Rule {
    fn of(v: &Value) -> Rule {
        let list = |k: &str| -> Vec<String> {
            v[k].as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        };
        Rule {
            groups: list("apiGroups"),
            resources: list("resources"),
            verbs: list("verbs"),
            names: list("resourceNames"),
        }
    }

    fn allows(&self, a: &Attributes) -> bool {
        let any = |l: &[String], x: &str| l.iter().any(|y| y == "*" || y == x);
        let resource = match a.subresource.as_str() {
            "" => a.resource.clone(),
            s => format!("{}/{s}", a.resource),
        };
        any(&self.verbs, &a.verb)
            && any(&self.groups, &a.group)
            && any(&self.resources, &resource)
            // resourceNames never cover a create or a collection.
            && (self.names.is_empty() || (!a.name.is_empty() && self.names.contains(&a.name)))
    }
}

/// A RoleBinding or ClusterRoleBinding.
#[derive(Clone, Debug)]
struct Binding {
    /// "" for a ClusterRoleBinding.
    namespace: String,
    role_kind: String,
    role: String,
    subjects: Vec<Value>,
}

impl Binding {
    fn binds(&self, user: &UserInfo) -> bool {
        self.subjects.iter().any(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str().unwrap_or_default() {
                "User" => user.username == name,
                "Group" => user.groups.iter().any(|g| g == name),
                "ServiceAccount" => {
                    let ns = s["namespace"].as_str().unwrap_or(&self.namespace);
                    user.username == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            }
        })
    }
}

/// The RBAC objects and admission policies of a manifest.
pub struct Access {
    /// Rules by (namespace, name); namespace "" for ClusterRoles.
    roles: BTreeMap<(String, String), Vec<Rule>>,
    bindings: Vec<Binding>,
    policies: Policies,
}

impl Access {
    /// The RBAC and admission objects of `docs` (a manifest's documents, as JSON); an error
    /// names a policy whose CEL does not compile.
    pub fn from_documents(docs: &[Value]) -> Result<Access, String> {
        let mut roles = BTreeMap::new();
        let mut bindings = Vec::new();
        for d in docs {
            let ns = d["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = d["metadata"]["name"].as_str().unwrap_or("").to_string();
            match d["kind"].as_str().unwrap_or_default() {
                "Role" | "ClusterRole" => {
                    let rules = d["rules"].as_array().into_iter().flatten();
                    let key = match d["kind"] == "Role" {
                        true => (ns, name),
                        false => (String::new(), name),
                    };
                    roles.insert(key, rules.map(Rule::of).collect());
                }
                k @ ("RoleBinding" | "ClusterRoleBinding") => bindings.push(Binding {
                    namespace: match k {
                        "RoleBinding" => ns,
                        _ => String::new(),
                    },
                    role_kind: d["roleRef"]["kind"].as_str().unwrap_or_default().into(),
                    role: d["roleRef"]["name"].as_str().unwrap_or_default().into(),
                    subjects: d["subjects"].as_array().cloned().unwrap_or_default(),
                }),
                _ => {}
            }
        }
        Ok(Access {
            roles,
            bindings,
            policies: Policies::from_documents(docs)?,
        })
    }

    /// The access of a multi-document YAML manifest.
    pub fn from_manifest(path: &Path) -> Result<Access, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let docs =
            crate::manifest::documents(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Access::from_documents(&docs)
    }

    /// The access deploy/cluster-kubernetes ships (its rendered `ipool.yaml`).
    pub fn cluster_kubernetes() -> Access {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/cluster-kubernetes/ipool.yaml");
        Access::from_manifest(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Whether `user` may do what `a` asks (RBAC); a 403 as the apiserver words it if not.
    pub fn authorize(&self, user: &UserInfo, a: &Attributes) -> Result<(), Answer> {
        if user.is_admin() {
            return Ok(());
        }
        let allowed = self.bindings.iter().filter(|b| b.binds(user)).any(|b| {
            // A RoleBinding grants in its namespace only; a ClusterRoleBinding everywhere.
            if !b.namespace.is_empty() && b.namespace != a.namespace {
                return false;
            }
            let key = match b.role_kind.as_str() {
                "Role" => (b.namespace.clone(), b.role.clone()),
                _ => (String::new(), b.role.clone()),
            };
            self.roles
                .get(&key)
                .is_some_and(|rules| rules.iter().any(|r| r.allows(a)))
        });
        if allowed {
            return Ok(());
        }
        let named = match a.name.is_empty() {
            true => String::new(),
            false => format!(" \"{}\"", a.name),
        };
        let scope = match a.namespace.is_empty() {
            true => "at the cluster scope".to_string(),
            false => format!("in the namespace \"{}\"", a.namespace),
        };
        let mut answer = status(
            403,
            "Forbidden",
            &format!(
                "{}{named} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
                a.qualified(),
                user.username,
                a.verb,
                a.resource,
                a.group
            ),
        );
        answer.body["details"] = json!({"name": a.name, "group": a.group, "kind": a.resource});
        Err(answer)
    }

    /// Whether the policies admit `operation` (CREATE, UPDATE, DELETE) of `object` (None for
    /// a DELETE) over `old` (None for a CREATE) by `user`; a 422 naming the policy if not.
    pub fn admit(
        &self,
        user: &UserInfo,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<(), Answer> {
        self.policies.admit(user, a, object, old)
    }
}

#[cfg(test)]
mod tests;
