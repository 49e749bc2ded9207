"""deploy/check.py's checks of cluster mode on the Kubernetes API (server/src/cluster/kube):
ipool's CustomResourceDefinitions as the code reads and writes them, each account's grants
(what the daemon or the operator's commands do, no wildcard), the admission policy that
keeps the daemon's account to its own node's blocks and Lease, and API Priority and Fairness
(the daemon's Lease renewals at the kubelets' level, its reads at a workload level, both
matched ahead of the built-in schema that catches every ServiceAccount)."""

import os
import tomllib

import check

# Cluster mode on the Kubernetes API (server/src/cluster/kube): ipool's custom resources, and
# the fields of each that ipool writes (a field the schema lacks would be pruned, silently).
GROUP = "ipool.io"
CRDS = {
    "ippools": ("IPPool", {"spec": ["cidrs", "blockSizeV4", "blockSizeV6", "exclude"],
                           "status": ["phase"]}),
    "ipblocks": ("IPBlock", {"spec": ["cidr", "pool", "poolRevision", "node", "claimedAtMs",
                                  "settledAtMs"]}),
    "ippins": ("IPPin", {"spec": ["pool", "address", "owner", "block", "blockId", "setAside",
                                "holders"]}),
}
# What each side does on the apiserver: (apiGroup, resource, verbs, in the Lease namespace).
DAEMON_NEEDS = [
    (GROUP, "ipblocks", ["get", "list", "watch", "create", "update", "delete"], False),
    (GROUP, "ippools", ["get", "list", "watch"], False),
    (GROUP, "ippins", ["get", "list", "watch", "create", "update", "delete"], False),
    ("coordination.k8s.io", "leases", ["get", "create", "update"], True),
    # The owners of fixed addresses, read to end the pins of those gone.
    ("apps", "statefulsets", ["get"], False),
    ("kubevirt.io", "virtualmachines", ["get"], False),
    ("kubevirt.io", "virtualmachineinstances", ["get"], False),
]
OPERATOR_NEEDS = [
    (GROUP, "ippools", ["get", "list", "create", "update", "delete"], False),
    (GROUP, "ipblocks", ["get", "list", "delete"], False),
    (GROUP, "ippins", ["get", "list", "update", "delete"], False),
    ("coordination.k8s.io", "leases", ["get", "create", "update", "delete"], True),
    # release-departed and check: the Nodes; check: the pods.
    ("", "nodes", ["get", "list"], False),
    ("", "pods", ["list"], False),
]
# The daemon reads pools, never writes one.
DAEMON_MUST_NOT = [(GROUP, "ippools", ["create", "update", "patch", "delete", "deletecollection"])]
NODE_CLAIM = "authentication.kubernetes.io/node-name"
# API Priority and Fairness (flowcontrol.apiserver.k8s.io/v1): the built-in FlowSchema
# `service-accounts` catches every ServiceAccount's requests at this precedence (workload-low);
# the kubelets' node Leases are at level `node-high` (FlowSchema system-node-high).
SERVICE_ACCOUNTS_PRECEDENCE = 9000
LEASE_LEVEL = "node-high"
BUILT_IN_LEVELS = {"exempt", "system", "node-high", "leader-election", "workload-high",
                   "workload-low", "global-default", "catch-all"}
# What the daemon reads that must queue at a workload level, not a high one: (apiGroup,
# resource, verb, namespace or None for a request over every namespace).
DAEMON_READS = [(GROUP, "ipblocks", "list", None), (GROUP, "ipblocks", "watch", None),
                (GROUP, "ippools", "get", None), (GROUP, "ippools", "watch", None),
                ("", "pods", "list", None),
                ("", "pods", "watch", None)]


def config_of(pod, container):
    """The ipoold.toml `container` reads (its --config, on a ConfigMap mount), parsed; None
    when there is none (the other checks say why)."""
    argv = list(container.get("command", [])) + list(container.get("args", []))
    path = check.flag_value(argv, "--config")
    found = pod.mount_of(container, path, "configMap") if path else None
    if not found:
        return None
    m, v = found
    data = pod.cms.get(v["configMap"]["name"], {}).get("data", {})
    text = data.get(os.path.relpath(path, m["mountPath"]))
    try:
        return tomllib.loads(text) if text else None
    except tomllib.TOMLDecodeError:
        return None


def rbac_rules(docs, namespace, name):
    """The rules granted to ServiceAccount namespace/name: (rule, the namespace it holds in,
    None for every namespace and the cluster-scoped resources)."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    out = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                   and s.get("namespace", b["metadata"].get("namespace")) == namespace
                   for s in b.get("subjects", [])):
            continue
        ref = b["roleRef"]
        where = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        role_ns = where if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            check.fail(f"{b['kind']} {b['metadata']['name']} binds {ref['kind']} {ref['name']}, "
                 "which is not here")
            continue
        out += [(r, where) for r in role.get("rules", [])]
    return out


def allows(rules, group, resource, verb, namespace, any_name=True):
    """Whether `rules` grant `verb` on `resource` (in `namespace`; None: cluster-scoped); with
    any_name, only a rule that names no resourceNames counts (the names are not known ahead:
    blocks are named after their CIDRs, Leases after their nodes)."""
    for r, where in rules:
        if where is not None and where != namespace:
            continue
        if any_name and r.get("resourceNames"):
            continue
        if (group in r.get("apiGroups", []) or "*" in r.get("apiGroups", [])) \
                and (resource in r.get("resources", []) or "*" in r.get("resources", [])) \
                and (verb in r.get("verbs", []) or "*" in r.get("verbs", [])):
            return True
    return False


def check_crds(docs):
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    for plural, (kind, fields) in CRDS.items():
        name = f"{plural}.{GROUP}"
        crd = crds.get(name)
        if crd is None:
            check.fail(f"no CustomResourceDefinition {name} (deploy/crds): [cluster] datastore = "
                 "\"kubernetes\" refuses a cluster without it")
            continue
        spec = crd["spec"]
        names = spec.get("names", {})
        if (spec.get("group"), names.get("plural"), names.get("kind"), spec.get("scope")) != \
                (GROUP, plural, kind, "Cluster"):
            check.fail(f"CustomResourceDefinition {name}: ipool reads and writes {GROUP} {kind} "
                 f"({plural}), cluster-scoped")
        v1 = next((v for v in spec.get("versions", []) if v.get("name") == "v1"), None)
        if not v1 or not v1.get("served") or not v1.get("storage"):
            check.fail(f"CustomResourceDefinition {name}: no served storage version v1 (what ipool asks for)")
            continue
        if "status" in v1.get("subresources", {}):
            check.fail(f"CustomResourceDefinition {name}: a status subresource; ipool writes each "
                 "object whole (status.phase with it), and the apiserver would ignore the "
                 "status of such writes")
        props = v1.get("schema", {}).get("openAPIV3Schema", {}).get("properties", {})
        for part, keys in fields.items():
            have = props.get(part, {}).get("properties", {})
            for k in keys:
                if k not in have:
                    check.fail(f"CustomResourceDefinition {name}: no {part}.{k} in its schema: the "
                         "apiserver would drop what ipool writes there")


def check_admission(docs, username):
    """A ValidatingAdmissionPolicy, bound with Deny, for `username`'s writes to ipblocks and
    to leases that looks at the node its token names."""
    bound = {b["spec"].get("policyName") for b in docs
             if b["kind"] == "ValidatingAdmissionPolicyBinding"
             and "Deny" in b["spec"].get("validationActions", [])}
    for group, resource in [(GROUP, "ipblocks"), (GROUP, "ippins"),
                            ("coordination.k8s.io", "leases")]:
        covered = set()
        for p in docs:
            if p["kind"] != "ValidatingAdmissionPolicy" or p["metadata"]["name"] not in bound:
                continue
            spec = p["spec"]
            if not any(username in m.get("expression", "") for m in spec.get("matchConditions", [])):
                continue
            if not any(NODE_CLAIM in v.get("expression", "")
                       for v in spec.get("variables", []) + spec.get("validations", [])):
                continue
            for r in spec.get("matchConstraints", {}).get("resourceRules", []):
                if group in r.get("apiGroups", []) and resource in r.get("resources", []):
                    ops = r.get("operations", [])
                    covered |= {"CREATE", "UPDATE", "DELETE"} if "*" in ops else set(ops)
        missing = {"CREATE", "UPDATE", "DELETE"} - covered
        if missing:
            check.fail(f"nothing keeps {username} to its own node's {resource} on "
                 f"{', '.join(sorted(missing))}: no ValidatingAdmissionPolicy bound with Deny "
                 f"that matches its requests and checks the node its token names ({NODE_CLAIM})")


def check_kubernetes_store(docs):
    """Where a config says [cluster] datastore = "kubernetes": the CRDs, each pod's account
    and its grants, and the admission policy that keeps the daemon to its node."""
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    users = []
    for d in docs:
        if d["kind"] not in ("DaemonSet", "Job", "CronJob"):
            continue
        spec = check.job_pod_spec(d)
        pod = check.Pod(spec, cms)
        for c in spec["containers"]:
            argv = list(c.get("command", [])) + list(c.get("args", []))
            cluster = (config_of(pod, c) or {}).get("cluster", {})
            if cluster.get("datastore") == "kubernetes" or check.flag_value(argv, "--datastore") == "kubernetes":
                users.append((d, pod, c, cluster))
    if not users:
        return
    check_crds(docs)
    for d, pod, c, cluster in users:
        what = f"{d['kind']} {d['metadata']['name']}"
        kubeconfig = cluster.get("kubeconfig")
        if kubeconfig:
            if not any(pod.mount_of(c, kubeconfig, kind)
                       for kind in ("secret", "configMap", "hostPath", "projected")):
                check.fail(f"{what}: [cluster] kubeconfig {kubeconfig} is not mounted")
            continue  # its own credentials: not the pod's account
        if pod.spec.get("automountServiceAccountToken") is False:
            check.fail(f"{what}: automountServiceAccountToken is false, and no [cluster] kubeconfig: "
                 "it has no credentials for the apiserver")
        namespace = d["metadata"].get("namespace", "default")
        account = pod.spec.get("serviceAccountName", "default")
        if not any(a["kind"] == "ServiceAccount" and a["metadata"]["name"] == account
                   and a["metadata"].get("namespace") == namespace for a in docs):
            check.fail(f"{what}: its ServiceAccount {namespace}/{account} is not here")
        rules = rbac_rules(docs, namespace, account)
        for r, _ in rules:
            for key in ("apiGroups", "resources", "verbs"):
                if "*" in r.get(key, []):
                    check.fail(f"{what}: ServiceAccount {namespace}/{account} is granted {key} "
                         f"\"*\" (a wildcard): name what it needs")
        leases = cluster.get("lease_namespace", "ipool-system")
        daemon = d["kind"] == "DaemonSet"
        for group, resource, verbs, in_leases in DAEMON_NEEDS if daemon else OPERATOR_NEEDS:
            missing = [v for v in verbs
                       if not allows(rules, group, resource, v, leases if in_leases else None)]
            if missing:
                where = f" in namespace {leases}" if in_leases else ""
                check.fail(f"{what}: ServiceAccount {namespace}/{account} may not {', '.join(missing)} "
                     f"{group} {resource}{where}, which "
                     f"{'ipoold' if daemon else 'ipoolctl cluster'} does")
        if daemon:
            for group, resource, verbs in DAEMON_MUST_NOT:
                extra = [v for v in verbs
                         if allows(rules, group, resource, v, None, any_name=False)]
                if extra:
                    check.fail(f"{what}: ServiceAccount {namespace}/{account} may {', '.join(extra)} "
                         f"{group} {resource}: the daemon only reads pools")
            check_admission(docs, f"system:serviceaccount:{namespace}:{account}")
            check_priority(docs, what, namespace, account, leases)


def first_flowschema(docs, namespace, account, group, resource, verb, ns):
    """The FlowSchema that a request of ServiceAccount namespace/account matches first (lowest
    matchingPrecedence), as the apiserver picks it; None when none here matches."""
    def covers(r):
        def has(key, v):
            return v in r.get(key, []) or "*" in r.get(key, [])
        where = r.get("clusterScope", False) if ns is None else has("namespaces", ns)
        return has("apiGroups", group) and has("resources", resource) and has("verbs", verb) \
            and where
    found = []
    for d in docs:
        if d["kind"] != "FlowSchema":
            continue
        for rule in d["spec"].get("rules", []):
            mine = any(s.get("kind") == "ServiceAccount"
                       and s.get("serviceAccount", {}).get("name") in (account, "*")
                       and s.get("serviceAccount", {}).get("namespace") == namespace
                       for s in rule.get("subjects", []))
            if mine and any(covers(r) for r in rule.get("resourceRules", [])):
                found.append(d)
    return min(found, key=lambda d: d["spec"].get("matchingPrecedence", 1000), default=None)


def check_priority(docs, what, namespace, account, leases):
    """The daemon's Lease requests at the kubelets' level, its reads at a workload level, each
    matched ahead of the built-in `service-accounts`, every level referred to defined."""
    levels = {d["metadata"]["name"] for d in docs if d["kind"] == "PriorityLevelConfiguration"}
    checks = [("coordination.k8s.io", "leases", v, leases, True) for v in ("get", "create", "update")]
    checks += [(g, r, v, ns, False) for g, r, v, ns in DAEMON_READS]
    for group, resource, verb, ns, high in checks:
        request = f"{verb} {group or 'core'} {resource}" + (f" in {ns}" if ns else "")
        fs = first_flowschema(docs, namespace, account, group, resource, verb, ns)
        if fs is None or fs["spec"].get("matchingPrecedence", 1000) >= SERVICE_ACCOUNTS_PRECEDENCE:
            check.fail(f"{what}: no FlowSchema ahead of the built-in service-accounts "
                       f"(precedence {SERVICE_ACCOUNTS_PRECEDENCE}) matches the daemon's {request}")
            continue
        level = fs["spec"]["priorityLevelConfiguration"]["name"]
        name = fs["metadata"]["name"]
        if level not in levels | BUILT_IN_LEVELS:
            check.fail(f"{what}: FlowSchema {name} names level {level}, defined nowhere")
        elif high and level != LEASE_LEVEL:
            check.fail(f"{what}: the daemon's {request} is at level {level} (FlowSchema {name}), "
                       f"not {LEASE_LEVEL} as the kubelets' node Leases")
        elif not high and level in ("exempt", "system", LEASE_LEVEL):
            check.fail(f"{what}: the daemon's {request} is at the high level {level} "
                       f"(FlowSchema {name}): reads queue at a workload level")
