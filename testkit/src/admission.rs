//! ValidatingAdmissionPolicies and their bindings, evaluated as the apiserver does: a policy
//! bound with `validationActions: [Deny]` whose `matchConstraints` match the request's
//! resource and operation, and whose `matchConditions` all hold, evaluates its `variables` (in
//! order, each seeing those before it) and its `validations`; the first that is false denies
//! (its `messageExpression`, else its `message`), as does one that fails to evaluate (with
//! `failurePolicy: Fail`, the default). The CEL is the `cel` crate's; the expressions are
//! compiled once, when the manifest is read.

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Program, Value as Cel};
use serde_json::Value;

use crate::answer::{status, Answer};
use crate::caller::{Attributes, UserInfo};

struct Validation {
    source: String,
    program: Program,
    message: Option<String>,
    message_expression: Option<Program>,
}

struct Policy {
    name: String,
    /// The bindings that deny with it.
    bindings: Vec<String>,
    /// (apiGroups, apiVersions, operations, resources) of each resource rule.
    rules: Vec<[Vec<String>; 4]>,
    fail_closed: bool,
    match_conditions: Vec<(String, Program)>,
    variables: Vec<(String, Program)>,
    validations: Vec<Validation>,
}

/// The policies of a manifest.
pub struct Policies {
    env: Arc<Env>,
    policies: Vec<Policy>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// JSON as CEL sees it (every JSON integer an `int`, as Kubernetes' CEL has them).
fn cel_of(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(a) => Cel::List(Arc::new(a.iter().map(cel_of).collect())),
        Value::Object(o) => Cel::Map(CelMap {
            map: Arc::new(
                o.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), cel_of(v)))
                    .collect(),
            ),
        }),
    }
}

impl Policies {
    /// The policies of `docs` bound to deny; an error names an expression that does not
    /// compile.
    pub fn from_documents(docs: &[Value]) -> Result<Policies, String> {
        let env = Arc::new(Env::stdlib());
        let compile = |what: &str, src: &str| {
            env.compile(src)
                .map_err(|e| format!("{what}: CEL {src:?} does not compile: {e}"))
        };
        let mut policies = Vec::new();
        for d in docs
            .iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        {
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let spec = &d["spec"];
            let named = |field: &str| -> Result<Vec<(String, Program)>, String> {
                spec[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let n = c["name"].as_str().unwrap_or_default().to_string();
                        let p = compile(&name, c["expression"].as_str().unwrap_or_default())?;
                        Ok((n, p))
                    })
                    .collect()
            };
            let mut validations = Vec::new();
            for v in spec["validations"].as_array().into_iter().flatten() {
                let source = v["expression"].as_str().unwrap_or_default().to_string();
                validations.push(Validation {
                    program: compile(&name, &source)?,
                    source,
                    message: v["message"].as_str().map(str::to_string),
                    message_expression: match v["messageExpression"].as_str() {
                        Some(m) => Some(compile(&name, m)?),
                        None => None,
                    },
                });
            }
            let rules = spec["matchConstraints"]["resourceRules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    [
                        strings(&r["apiGroups"]),
                        strings(&r["apiVersions"]),
                        strings(&r["operations"]),
                        strings(&r["resources"]),
                    ]
                })
                .collect();
            let bindings = docs
                .iter()
                .filter(|b| b["kind"] == "ValidatingAdmissionPolicyBinding")
                .filter(|b| b["spec"]["policyName"] == name.as_str())
                .filter(|b| {
                    strings(&b["spec"]["validationActions"])
                        .iter()
                        .any(|a| a == "Deny")
                })
                .filter_map(|b| b["metadata"]["name"].as_str().map(str::to_string))
                .collect();
            policies.push(Policy {
                fail_closed: spec["failurePolicy"].as_str() != Some("Ignore"),
                match_conditions: named("matchConditions")?,
                variables: named("variables")?,
                validations,
                rules,
                bindings,
                name,
            });
        }
        Ok(Policies { env, policies })
    }

    /// See [`crate::access::Access::admit`].
    pub fn admit(
        &self,
        user: &UserInfo,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<(), Answer> {
        let operation = match a.verb.as_str() {
            "create" => "CREATE",
            "update" | "patch" => "UPDATE",
            "delete" => "DELETE",
            _ => return Ok(()),
        };
        let any = |l: &[String], x: &str| l.iter().any(|y| y == "*" || y == x);
        for p in &self.policies {
            let matched = p.rules.iter().any(|[g, v, o, r]| {
                any(g, &a.group) && any(v, &a.version) && any(o, operation) && any(r, &a.resource)
            });
            if !matched || p.bindings.is_empty() {
                continue;
            }
            if let Err(why) = self.evaluate(p, user, a, operation, object, old) {
                let binding = &p.bindings[0];
                return Err(status(
                    422,
                    "Invalid",
                    &format!(
                        "{} \"{}\" is invalid: : ValidatingAdmissionPolicy '{}' with binding '{binding}' denied request: {why}",
                        a.resource, a.name, p.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Ok, or why `p` denies the request.
    fn evaluate(
        &self,
        p: &Policy,
        user: &UserInfo,
        a: &Attributes,
        operation: &str,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<(), String> {
        let mut ctx = Context::with_env(self.env.clone());
        let request = serde_json::json!({
            "operation": operation, "userInfo": user.json(), "name": a.name,
            "namespace": a.namespace,
            "resource": {"group": a.group, "version": a.version, "resource": a.resource},
        });
        ctx.add_variable_from_value("request", cel_of(&request));
        ctx.add_variable_from_value("object", object.map_or(Cel::Null, cel_of));
        ctx.add_variable_from_value("oldObject", old.map_or(Cel::Null, cel_of));
        for (name, program) in &p.match_conditions {
            match program.execute(&ctx) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => return Ok(()),
                _ if !p.fail_closed => return Ok(()),
                other => return Err(format!("matchCondition {name:?} failed: {other:?}")),
            }
        }
        // Variables in order; one that fails is left out, so that only what uses it fails.
        let mut vars: HashMap<Key, Cel> = HashMap::new();
        for (name, program) in &p.variables {
            let now = Cel::Map(CelMap {
                map: Arc::new(vars.clone()),
            });
            ctx.add_variable_from_value("variables", now);
            if let Ok(v) = program.execute(&ctx) {
                vars.insert(Key::String(Arc::new(name.clone())), v);
            }
        }
        ctx.add_variable_from_value(
            "variables",
            Cel::Map(CelMap {
                map: Arc::new(vars),
            }),
        );
        for v in &p.validations {
            match v.program.execute(&ctx) {
                Ok(Cel::Bool(true)) => continue,
                Ok(Cel::Bool(false)) => {}
                _ if !p.fail_closed => continue,
                other => {
                    return Err(format!(
                        "expression '{}' resulted in error: {other:?}",
                        v.source
                    ))
                }
            }
            let said = v
                .message_expression
                .as_ref()
                .and_then(|m| match m.execute(&ctx) {
                    Ok(Cel::String(s)) if !s.trim().is_empty() && !s.contains('\n') => {
                        Some(s.to_string())
                    }
                    _ => None,
                });
            return Err(said
                .or_else(|| v.message.as_ref().map(|m| m.trim().to_string()))
                .unwrap_or_else(|| format!("failed expression: {}", v.source)));
        }
        Ok(())
    }
}
