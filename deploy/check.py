#!/usr/bin/env python3
"""Offline checks of deploy/ (run by .ci/run; needs PyYAML and the built binaries).

    deploy/check.py [TARGET_DIR]      TARGET_DIR holds ipoold and ipoolctl (default target/debug)

1. deploy/ipool.yaml is deploy/kustomization.yaml rendered: the same objects.
2. The DaemonSet agrees with the binaries and the image: every flag and env it passes exists
   (`ipoold --help`, `ipoolctl health --help`, ...), the ConfigMap's ipoold.toml is a config
   ipoold accepts, the conflist template's network and socket are the daemon's, the probes'
   binary is in the image, every path the daemon writes is a writable hostPath, maxSurge is 0.

Each failure is printed; the exit code is the number of failures (0: all good).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

DEPLOY = os.path.dirname(os.path.abspath(__file__))
failures = []


def fail(msg):
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


def check_rendered():
    with open(os.path.join(DEPLOY, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    extra = set(k) - {"apiVersion", "kind", "resources"}
    if extra:
        fail(f"kustomization.yaml uses {sorted(extra)}: check_rendered compares plain resources only")
    docs = []
    for r in k["resources"]:
        docs += load_all(os.path.join(DEPLOY, r))
    rendered = load_all(os.path.join(DEPLOY, "ipool.yaml"))
    if canonical(docs) != canonical(rendered):
        fail("deploy/ipool.yaml is not deploy/kustomization.yaml rendered: run "
             "`kubectl kustomize deploy/ > deploy/ipool.yaml` (and keep its header comment)")
    return docs


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


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
    if ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {}).get("maxSurge") != 0:
        fail("the DaemonSet's rollingUpdate.maxSurge must be 0: two ipoolds must never share a node")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    with open(os.path.join(DEPLOY, "Containerfile")) as f:
        image_files = set()
        for line in f:
            if line.startswith("COPY "):
                parts = line.split()[1:]
                image_files |= {os.path.join(parts[-1], p) for p in parts[:-1]}

    def hostpath_mount(container, path, writable=True, same_path=False):
        for m in container.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if under(path, m["mountPath"]) and "hostPath" in v:
                if writable and m.get("readOnly"):
                    fail(f"{container['name']}: {path} is on read-only mount {m['mountPath']}")
                host = os.path.normpath(os.path.join(
                    v["hostPath"]["path"], os.path.relpath(path, m["mountPath"])))
                if same_path and host != os.path.normpath(path):
                    fail(f"{container['name']}: {path} is {host} on the host; the plugin, "
                         "which runs on the host, looks for it at the same path")
                return m
        fail(f"{container['name']}: {path}, which it writes, is not on a hostPath mount")

    def configmap_file(container, path):
        for m in container.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if "configMap" in v and under(path, m["mountPath"]):
                key = os.path.relpath(path, m["mountPath"])
                data = cms.get(v["configMap"]["name"], {}).get("data", {})
                if key not in data:
                    fail(f"{container['name']}: {path}: ConfigMap {v['configMap']['name']} has no key {key}")
                    return None
                return data[key]
        fail(f"{container['name']}: {path} is not on a ConfigMap mount")
        return None

    daemon_help = help_of(ipoold)
    daemon_flags, daemon_envs = flags_in(daemon_help), envs_in(daemon_help)
    containers = spec.get("initContainers", []) + spec["containers"]
    main = None
    for c in containers:
        argv = list(c.get("command", [])) + list(c.get("args", []))
        if not argv:
            fail(f"{c['name']}: no command")
            continue
        binary = argv[0]
        if binary not in image_files:
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
                hostpath_mount(c, flag_value(rest, "--cni-bin-dir") or "/host/opt/cni/bin")
            continue
        main = c
        for f in flag_names(rest) - daemon_flags:
            fail(f"{c['name']}: ipoold has no flag {f}")
        for e in c.get("env", []):
            if e["name"] not in daemon_envs:
                fail(f"{c['name']}: ipoold reads no env {e['name']}")
    if main is None:
        fail("no container runs the daemon")
        return
    argv = main.get("args", [])
    socket = flag_value(argv, "--socket") or "/run/ipool/ipool.sock"
    hostpath_mount(main, os.path.dirname(socket), same_path=True)
    state = flag_value(argv, "--state-dir") or "/var/lib/ipool"
    m = hostpath_mount(main, state)
    if m and os.path.normpath(m["mountPath"]) == os.path.normpath(state):
        fail(f"--state-dir {state} is a mount point: --rebuild-from-pods could not move a "
             "damaged store aside (put it one level below the hostPath mount)")
    if flag_value(argv, "--cni-conf-dir"):
        hostpath_mount(main, flag_value(argv, "--cni-conf-dir"))
    with open(os.path.join(DEPLOY, "..", "Cargo.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    for c in containers:
        if not c.get("image", "").endswith(":" + version):
            fail(f"{c['name']}: image {c.get('image')} is not this version ({version})")
    config = configmap_file(main, flag_value(argv, "--config") or "")
    networks = []
    if config is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as t:
            t.write(config)
            t.flush()
            out = subprocess.run([ipoold, "--config", t.name, "--check-config"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                fail(f"the ConfigMap's ipoold.toml is refused: {out.stderr.strip()}")
        networks = [n["name"] for n in tomllib.loads(config).get("network", [])]
    template = configmap_file(main, flag_value(argv, "--cni-conflist-template") or "")
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
        if not cmd or cmd[0] not in image_files:
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


def main():
    bindir = sys.argv[1] if len(sys.argv) > 1 else "target/debug"
    docs = check_rendered()
    check_daemonset(docs, bindir)
    print(f"deploy/check.py: {len(failures)} failure(s)")
    sys.exit(min(len(failures), 100))


if __name__ == "__main__":
    main()
