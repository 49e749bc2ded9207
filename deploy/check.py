#!/usr/bin/env python3
"""Offline checks of deploy/ (run by .ci/run; needs PyYAML, kubectl and the built binaries).

    deploy/check.py [TARGET_DIR]      TARGET_DIR holds ipoold and ipoolctl (default target/debug)

For each variant (deploy/: node podCIDRs; deploy/flannel/; deploy/cluster/: cluster mode on
etcd; deploy/cluster-kubernetes/: cluster mode on the Kubernetes API):
1. Its ipool.yaml is its kustomization rendered by kustomize (`kubectl kustomize`; KUBECTL
   names the binary): the same objects. A kubectl older than 1.21 (kustomize v2, Debian's
   kubernetes-client) is given the same kustomizations in v2's spelling (`bases`,
   `patchesStrategicMerge`).
2. The DaemonSet agrees with the binaries and the image: every flag and env it passes exists
   (`ipoold --help`, `ipoolctl health --help`, ...; an env that only an arg's $(VAR) uses is
   fine), the ConfigMap's ipoold.toml is a config ipoold accepts, the conflist template's
   network and socket are the daemon's, the probes' binary is in the image, every path the
   daemon writes is a writable hostPath, maxSurge is 0; Linux nodes only, seccomp
   RuntimeDefault, metrics not on every address; the CNI plugin dir it checks is the one
   install-cni writes; the files the config reads (flannel's subnet file, [cluster]'s TLS
   files) are mounted.
3. Every Job runs an ipoolctl command that exists, with flags that exist, and the files it
   reads are mounted.
4. Where a config says [cluster] datastore = "kubernetes": ipool's CustomResourceDefinitions
   are there (deploy/crds), as the code reads and writes them (group, kinds, plurals, scope,
   every field it writes in the schema, no status subresource); the DaemonSet's and each
   Job's ServiceAccount is granted what the daemon or the operator's commands do on the
   apiserver, by no wildcard, the daemon no write to a pool; and a ValidatingAdmissionPolicy,
   bound with Deny, keeps the daemon's account to its own node's blocks and Lease.
And deploy/monitoring/ renders; its PrometheusRule holds rules.yaml's groups, its PodMonitor
scrapes the DaemonSet's pods on their metrics port, and its dashboard ConfigMap holds
dashboard.json. (promtool and a real Prometheus check the rules themselves:
server/tests/node/monitoring.rs.)

Each failure is printed; the exit code is the number of failures (0: all good).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import yaml

# check_kube (the Kubernetes-API store's CRDs, grants and admission policy) uses this module's
# fail, Pod and flag_value: it imports it as `check`, which must be this very module, run as
# a script or not.
sys.modules.setdefault("check", sys.modules[__name__])
import check_kube  # noqa: E402

DEPLOY = os.path.dirname(os.path.abspath(__file__))
# Variant name -> its directory under deploy/.
VARIANTS = {"deploy": ".", "flannel": "flannel", "cluster": "cluster",
            "cluster-kubernetes": "cluster-kubernetes"}
failures = []
# The variant being checked, named in each failure.
checking = [None]


def fail(msg):
    if checking[0]:
        msg = f"[{checking[0]}] {msg}"
    failures.append(msg)
    print(f"FAIL: {msg}")


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def help_of(binary, *args):
    """The --help text of `binary args...`."""
    out = subprocess.run([binary, *args, "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{binary} {' '.join(args)} --help exited {out.returncode}: {out.stderr}")
    return out.stdout


def flags_in(help_text):
    """The flags the help defines (its option lines), not those its prose mentions."""
    flags = set()
    for line in help_text.splitlines():
        m = re.match(r"^\s+(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)", line)
        if m:
            flags.add(m.group(1))
    return flags


def envs_in(help_text):
    return set(re.findall(r"\[env: ([A-Z0-9_]+)=", help_text))


def subcommands_in(help_text):
    """The names listed under "Commands:"."""
    names, listing = set(), False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            listing = True
        elif listing and line.startswith("  ") and line.strip():
            names.add(line.split()[0])
        elif listing and line and not line.startswith(" "):
            listing = False
    return names


def flag_names(argv):
    """`--x=1`, `--x 1`, `--x` -> {"--x"}."""
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def flag_value(argv, flag):
    for i, a in enumerate(argv):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


def canonical(docs):
    return sorted(json.dumps(d, sort_keys=True) for d in docs)


def kubectl():
    k = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not k:
        fail("no kubectl to render the kustomizations with (apt-get install kubernetes-client)")
    return k


def modern_kustomize(k):
    """Whether `k kustomize` reads today's spelling (kubectl 1.21+: kustomize v4 and later)."""
    out = subprocess.run([k, "version", "--client", "-o", "json"], capture_output=True, text=True)
    try:
        v = json.loads(out.stdout)["clientVersion"]
        return (int(v["major"]), int(re.match(r"\d+", v["minor"]).group())) >= (1, 21)
    except (ValueError, KeyError, AttributeError):
        return True


def legacy_tree(tmp):
    """deploy/'s kustomizations in kustomize v2's spelling, in a copy under `tmp`."""
    root = os.path.join(tmp, "deploy")
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("__pycache__"))
    for d, _, files in os.walk(root):
        if "kustomization.yaml" not in files:
            continue
        path = os.path.join(d, "kustomization.yaml")
        with open(path) as f:
            k = yaml.safe_load(f)
        res = k.pop("resources", [])
        k["resources"] = [r for r in res if not os.path.isdir(os.path.join(d, r))]
        bases = [r for r in res if os.path.isdir(os.path.join(d, r))]
        if bases:
            k["bases"] = bases
        patches = k.pop("patches", [])
        if patches:
            k["patchesStrategicMerge"] = [p["path"] for p in patches]
        with open(path, "w") as f:
            yaml.safe_dump(k, f)
    return root


def render(k, root, variant):
    out = subprocess.run([k, "kustomize", os.path.join(root, VARIANTS.get(variant, variant))],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{variant}: kubectl kustomize failed: {out.stderr.strip()}")
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def check_rendered():
    """Each variant rendered, compared with its ipool.yaml; the rendered objects, and
    deploy/monitoring's."""
    k = kubectl()
    if not k:
        return {}, []
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = DEPLOY if modern_kustomize(k) else legacy_tree(tmp)
        monitoring = render(k, root, "monitoring")
        for variant, d in VARIANTS.items():
            docs = render(k, root, variant)
            rendered_file = os.path.normpath(os.path.join(DEPLOY, d, "ipool.yaml"))
            shown = os.path.relpath(rendered_file, os.path.dirname(DEPLOY))
            rendered = load_all(rendered_file) if os.path.exists(rendered_file) else []
            if canonical(docs) != canonical(rendered):
                fail(f"{shown} is not its kustomization rendered: run `kubectl kustomize "
                     f"{os.path.dirname(shown)}/ > {shown}` (and keep its header comment)")
            out[variant] = docs
    return out, monitoring


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


class Pod:
    """A pod template's volumes, with the ConfigMaps of the variant."""

    def __init__(self, spec, cms):
        self.spec = spec
        self.volumes = {v["name"]: v for v in spec.get("volumes", [])}
        self.cms = cms

    def mount_of(self, container, path, kind):
        """The mount of `container` under which `path` is, on a volume of `kind`, and the
        volume; None if there is none."""
        best = None
        for m in container.get("volumeMounts", []):
            v = self.volumes.get(m["name"], {})
            if kind in v and under(path, m["mountPath"]):
                if best is None or len(m["mountPath"]) > len(best[0]["mountPath"]):
                    best = (m, v)
        return best

    def hostpath_mount(self, container, path, writable=True, same_path=False):
        """The hostPath mount `path` is on (and the host's path for it), checked."""
        found = self.mount_of(container, path, "hostPath")
        if not found:
            fail(f"{container['name']}: {path}, which it uses, is not on a hostPath mount")
            return None, None
        m, v = found
        if writable and m.get("readOnly"):
            fail(f"{container['name']}: {path} is on read-only mount {m['mountPath']}")
        host = os.path.normpath(os.path.join(
            v["hostPath"]["path"], os.path.relpath(path, m["mountPath"])))
        if same_path and host != os.path.normpath(path):
            fail(f"{container['name']}: {path} is {host} on the host; what runs on the host "
                 "looks for it at the same path")
        return m, host

    def configmap_file(self, container, path):
        found = self.mount_of(container, path, "configMap")
        if not found:
            fail(f"{container['name']}: {path} is not on a ConfigMap mount")
            return None
        m, v = found
        key = os.path.relpath(path, m["mountPath"])
        data = self.cms.get(v["configMap"]["name"], {}).get("data", {})
        if key not in data:
            fail(f"{container['name']}: {path}: ConfigMap {v['configMap']['name']} has no key {key}")
            return None
        return data[key]

    def secret_file(self, container, path, what):
        found = self.mount_of(container, path, "secret")
        if not found:
            fail(f"{container['name']}: {what} {path} is not on a Secret mount")
            return
        m, v = found
        items = v["secret"].get("items")
        key = os.path.relpath(path, m["mountPath"])
        if items is not None and key not in [i["path"] for i in items]:
            fail(f"{container['name']}: {what} {path}: the Secret volume's items have no {key}")

    def check_linux_and_seccomp(self, what):
        if self.spec.get("nodeSelector", {}).get("kubernetes.io/os") != "linux":
            fail(f"{what}: no nodeSelector kubernetes.io/os: linux (it would land on Windows nodes)")
        prof = self.spec.get("securityContext", {}).get("seccompProfile", {}).get("type")
        if prof != "RuntimeDefault":
            fail(f"{what}: the pod's seccompProfile is {prof!r}, not RuntimeDefault")


def image_files():
    files = set()
    with open(os.path.join(DEPLOY, "Containerfile")) as f:
        for line in f:
            if line.startswith("COPY "):
                parts = line.split()[1:]
                files |= {os.path.join(parts[-1], p) for p in parts[:-1]}
    return files


def check_config_files(pod, container, config):
    """The files ipoold.toml makes the daemon (or ipoolctl) read are mounted."""
    if config is None:
        return
    try:
        doc = tomllib.loads(config)
    except tomllib.TOMLDecodeError as e:
        fail(f"{container['name']}: ipoold.toml is not TOML: {e}")
        return
    for key in ["ca_file", "cert_file", "key_file"]:
        path = doc.get("cluster", {}).get(key)
        if path:
            pod.secret_file(container, path, f"[cluster] {key}")
    return doc


def check_daemonset(docs, bindir):
    ipoold = os.path.join(bindir, "ipoold")
    ipoolctl = os.path.join(bindir, "ipoolctl")
    ds = [d for d in docs if d["kind"] == "DaemonSet"]
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    if len(ds) != 1:
        fail(f"want one DaemonSet, found {len(ds)}")
        return
    ds = ds[0]
    spec = ds["spec"]["template"]["spec"]
    pod = Pod(spec, cms)
    pod.check_linux_and_seccomp("the DaemonSet")
    if ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {}).get("maxSurge") != 0:
        fail("the DaemonSet's rollingUpdate.maxSurge must be 0: two ipoolds must never share a node")
    in_image = image_files()

    daemon_help = help_of(ipoold)
    daemon_flags, daemon_envs = flags_in(daemon_help), envs_in(daemon_help)
    containers = spec.get("initContainers", []) + spec["containers"]
    main = None
    cni_bin_host = None
    for c in containers:
        argv = list(c.get("command", [])) + list(c.get("args", []))
        if not argv:
            fail(f"{c['name']}: no command")
            continue
        binary = argv[0]
        if binary not in in_image:
            fail(f"{c['name']}: {binary} is not in the image (deploy/Containerfile)")
        if os.path.basename(binary) != "ipoold":
            fail(f"{c['name']}: runs {binary}, not ipoold")
            continue
        rest = argv[1:]
        if rest and not rest[0].startswith("-"):
            sub = rest[0]
            if sub not in subcommands_in(daemon_help):
                fail(f"{c['name']}: ipoold has no subcommand {sub}")
                continue
            known = flags_in(help_of(ipoold, sub))
            for f in flag_names(rest[1:]) - known:
                fail(f"{c['name']}: ipoold {sub} has no flag {f}")
            if sub == "install-cni":
                _, cni_bin_host = pod.hostpath_mount(
                    c, flag_value(rest, "--cni-bin-dir") or "/host/opt/cni/bin")
            continue
        main = c
        for f in flag_names(rest) - daemon_flags:
            fail(f"{c['name']}: ipoold has no flag {f}")
        for e in c.get("env", []):
            used = any(f"$({e['name']})" in a for a in argv)
            if e["name"] not in daemon_envs and not used:
                fail(f"{c['name']}: ipoold reads no env {e['name']}, and no arg uses it")
        for a in argv:
            for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                if ref not in [e["name"] for e in c.get("env", [])]:
                    fail(f"{c['name']}: {a} uses $({ref}), which the container does not define")
    if main is None:
        fail("no container runs the daemon")
        return
    argv = main.get("args", [])
    socket = flag_value(argv, "--socket") or "/run/ipool/ipool.sock"
    pod.hostpath_mount(main, os.path.dirname(socket), same_path=True)
    state = flag_value(argv, "--state-dir") or "/var/lib/ipool"
    m, _ = pod.hostpath_mount(main, state)
    if m and os.path.normpath(m["mountPath"]) == os.path.normpath(state):
        fail(f"--state-dir {state} is a mount point: --rebuild-from-pods could not move a "
             "damaged store aside (put it one level below the hostPath mount)")
    if flag_value(argv, "--cni-conf-dir"):
        pod.hostpath_mount(main, flag_value(argv, "--cni-conf-dir"))
        plugin_dir = flag_value(argv, "--cni-plugin-dir") or "/opt/cni/bin"
        _, host = pod.hostpath_mount(main, plugin_dir, writable=False)
        if host and cni_bin_host and host != cni_bin_host:
            fail(f"--cni-plugin-dir {plugin_dir} is the host's {host}, but install-cni puts "
                 f"the plugin in {cni_bin_host}")
    listen = flag_value(argv, "--metrics-listen")
    if listen and re.match(r"^(0\.0\.0\.0|\[::\]|::):", listen):
        fail(f"--metrics-listen {listen}: every address of the node (hostNetwork); use "
             "$(NODE_IP) from status.hostIP, or loopback")
    with open(os.path.join(DEPLOY, "..", "Cargo.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    for c in containers:
        if not c.get("image", "").endswith(":" + version):
            fail(f"{c['name']}: image {c.get('image')} is not this version ({version})")
    config = pod.configmap_file(main, flag_value(argv, "--config") or "")
    networks = []
    if config is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as t:
            t.write(config)
            t.flush()
            out = subprocess.run([ipoold, "--config", t.name, "--check-config"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                fail(f"the ConfigMap's ipoold.toml is refused: {out.stderr.strip()}")
        doc = check_config_files(pod, main, config) or {}
        networks = [n["name"] for n in doc.get("network", [])]
        for n in doc.get("network", []):
            if n.get("ranges_from") == "flannel":
                subnet = n.get("subnet_file", "/run/flannel/subnet.env")
                pod.hostpath_mount(main, subnet, writable=False, same_path=True)
    template = pod.configmap_file(main, flag_value(argv, "--cni-conflist-template") or "")
    if template is not None:
        conflist = json.loads(template)
        if networks and conflist.get("name") not in networks:
            fail(f"the conflist's name {conflist.get('name')!r} is no network of ipoold.toml {networks}")
        sockets = [p["ipam"].get("socket") for p in conflist.get("plugins", [])
                   if p.get("ipam", {}).get("type") == "ipool"]
        if not sockets:
            fail("the conflist template has no ipool IPAM")
        for s in sockets:
            if s != socket:
                fail(f"the conflist template's ipool socket {s} is not ipoold's --socket {socket}")
    ctl_help = help_of(ipoolctl)
    for kind in ["startupProbe", "readinessProbe", "livenessProbe"]:
        probe = main.get(kind)
        if not probe:
            fail(f"{main['name']}: no {kind}")
            continue
        cmd = probe.get("exec", {}).get("command", [])
        if not cmd or cmd[0] not in in_image:
            fail(f"{kind}: {cmd[:1]} is not in the image")
            continue
        args = cmd[1:]
        subs = [a for a in args if not a.startswith("-")]
        if not subs or subs[0] not in subcommands_in(ctl_help):
            fail(f"{kind}: ipoolctl has no subcommand {subs[:1]}")
            continue
        known = flags_in(help_of(ipoolctl, subs[0]))
        for f in flag_names(args) - known:
            fail(f"{kind}: ipoolctl {subs[0]} has no flag {f}")
        if (flag_value(args, "--socket") or "/run/ipool/ipool.sock") != socket:
            fail(f"{kind}: asks another socket than ipoold's {socket}")
        if kind != "readinessProbe" and "--live" not in args:
            fail(f"{kind}: without --live it fails while ipoold is NOT_SERVING (drained, "
                 "reopening its store), and kubelet restarts a daemon that is fine")


def job_pod_spec(d):
    """The pod spec of a Job, a CronJob's jobs, or a DaemonSet."""
    if d["kind"] == "CronJob":
        return d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return d["spec"]["template"]["spec"]


def check_jobs(docs, bindir):
    """Each Job's containers run an ipoolctl command that exists, and can read its files."""
    ipoolctl = os.path.join(bindir, "ipoolctl")
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    in_image = image_files()
    for job in [d for d in docs if d["kind"] in ("Job", "CronJob")]:
        spec = job_pod_spec(job)
        pod = Pod(spec, cms)
        pod.check_linux_and_seccomp(f"Job {job['metadata']['name']}")
        for c in spec["containers"]:
            argv = list(c.get("command", [])) + list(c.get("args", []))
            if not argv or argv[0] not in in_image:
                fail(f"{c['name']}: {argv[:1]} is not in the image")
                continue
            if os.path.basename(argv[0]) != "ipoolctl":
                fail(f"{c['name']}: runs {argv[0]}, not ipoolctl")
                continue
            path = []
            for a in argv[1:]:
                if a.startswith("-"):
                    continue
                if a in subcommands_in(help_of(ipoolctl, *path)):
                    path.append(a)
                else:
                    break
            if not path:
                fail(f"{c['name']}: no ipoolctl subcommand in {argv[1:]}")
                continue
            known = flags_in(help_of(ipoolctl, *path))
            for f in flag_names(argv[1:]) - known:
                fail(f"{c['name']}: ipoolctl {' '.join(path)} has no flag {f}")
            config = flag_value(argv, "--config")
            if config:
                check_config_files(pod, c, pod.configmap_file(c, config))


def check_monitoring(docs, base):
    """deploy/monitoring against rules.yaml, dashboard.json and the DaemonSet."""
    checking[0] = "monitoring"
    mon = os.path.join(DEPLOY, "monitoring")
    kinds = {d["kind"]: d for d in docs}
    with open(os.path.join(mon, "rules.yaml")) as f:
        rules = yaml.safe_load(f)
    rule = kinds.get("PrometheusRule")
    if not rule or rule["spec"] != rules:
        fail("prometheusrule.yaml's spec is not rules.yaml's groups: copy them over")
    with open(os.path.join(mon, "dashboard.json")) as f:
        dashboard = json.load(f)
    cm = kinds.get("ConfigMap", {})
    shipped = next(iter(cm.get("data", {}).values()), "{}")
    if json.loads(shipped) != dashboard:
        fail("the dashboard ConfigMap does not hold dashboard.json")
    ds = next((d for d in base if d["kind"] == "DaemonSet"), None)
    pm = kinds.get("PodMonitor")
    if ds and pm:
        labels = ds["spec"]["template"]["metadata"].get("labels", {})
        want = pm["spec"]["selector"].get("matchLabels", {})
        if any(labels.get(k) != v for k, v in want.items()):
            fail(f"the PodMonitor selects {want}, not the DaemonSet's pods ({labels})")
        ports = {p.get("name") for c in ds["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for e in pm["spec"]["podMetricsEndpoints"]:
            if e.get("port") not in ports:
                fail(f"the PodMonitor scrapes port {e.get('port')!r}; the DaemonSet has {sorted(ports)}")
    elif not pm:
        fail("deploy/monitoring has no PodMonitor")
    checking[0] = None


def main():
    bindir = sys.argv[1] if len(sys.argv) > 1 else "target/debug"
    variants, monitoring = check_rendered()
    for variant, docs in variants.items():
        checking[0] = variant
        check_daemonset(docs, bindir)
        check_jobs(docs, bindir)
        check_kube.check_kubernetes_store(docs)
    checking[0] = None
    check_monitoring(monitoring, variants.get("deploy", []))
    print(f"deploy/check.py: {len(failures)} failure(s)")
    sys.exit(min(len(failures), 100))


if __name__ == "__main__":
    main()
