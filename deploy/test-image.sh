#!/usr/bin/env bash
# The image as a node runs it (CI, as root, with podman): build it, run install-cni from it
# into a temp "host", run the daemon container with the DaemonSet's args and the host dirs
# bind-mounted, and exec the installed plugin from the host against it: ADD, CHECK, DEL.
#   deploy/test-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tag=localhost/ipool:image-test
name=ipool-image-test-$$
host=$(mktemp -d)
conf=$(mktemp -d)
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  [ -n "${sleeper:-}" ] && kill "$sleeper" 2>/dev/null || true
  rm -rf "$host" "$conf"
}
trap cleanup EXIT
fail() { echo "test-image: $*" >&2; [ -f "$host/daemon.log" ] && cat "$host/daemon.log" >&2; exit 1; }
# runc on these machines cannot set its default rlimits: give them. crun (Debian's default)
# refuses their hybrid cgroup layout: runc where it is installed.
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1000:1000)
podman() { if command -v runc >/dev/null; then command podman --runtime runc "$@"; else command podman "$@"; fi; }

if [ -z "${SKIP_BUILD:-}" ]; then ENGINE=podman deploy/build-image.sh "$tag"; fi

mkdir -p "$host"/opt/cni/bin "$host"/etc/cni/net.d "$host"/run/ipool "$host"/var/lib/ipool "$host"/var/run/netns
install_cni() {
  podman run --rm --network none "${limits[@]}" --read-only --read-only-tmpfs=false --cap-drop ALL \
    -v "$host/opt/cni/bin:/host/opt/cni/bin" "$tag" install-cni --cni-bin-dir /host/opt/cni/bin 2>&1
}

echo "== install-cni over an old plugin that is executing"
cp /bin/sleep "$host/opt/cni/bin/ipool"
"$host/opt/cni/bin/ipool" 60 & sleeper=$!
out=$(install_cni) || fail "install-cni: $out"
echo "$out" | grep -q installed || fail "install-cni said: $out"
cmp -s "$host/opt/cni/bin/ipool" target/image/ipool || fail "the installed plugin is not the image's"
[ "$(stat -c %a "$host/opt/cni/bin/ipool")" = 755 ] || fail "the plugin is not 0755"
[ "$(ls -A "$host/opt/cni/bin")" = ipool ] || fail "files left: $(ls -A "$host/opt/cni/bin")"
inode=$(stat -c %i "$host/opt/cni/bin/ipool")
out=$(install_cni) || fail "second install-cni: $out"
echo "$out" | grep -q "already up to date" || fail "a second install-cni changed something: $out"
[ "$(stat -c %i "$host/opt/cni/bin/ipool")" = "$inode" ] || fail "a second install-cni rewrote the plugin"

echo "== the daemon container, with the DaemonSet's args"
# The DaemonSet's config watches the apiserver; here there is none: a fixed range instead.
python3 - "$conf" <<'PY'
import sys, yaml
docs = list(yaml.safe_load_all(open("deploy/base/configmap.yaml")))
data = docs[0]["data"]
open(f"{sys.argv[1]}/10-ipool.conflist", "w").write(data["10-ipool.conflist"])
open(f"{sys.argv[1]}/ipoold.toml", "w").write(
    '[[network]]\nname = "k8s-pod-network"\nranges = [[{ subnet = "10.251.0.0/24" }]]\n')
PY
# The conflist names bridge and portmap: Debian's, which (dynamically linked) cannot run in
# the image, so the daemon takes them at the template's cniVersion.
cp /usr/lib/cni/bridge /usr/lib/cni/portmap "$host/opt/cni/bin/"
# kubelet expands $(NODE_IP) (status.hostIP) in the args; here the host is loopback.
mapfile -t args < <(python3 -c '
import yaml
ds = yaml.safe_load(open("deploy/base/daemonset.yaml"))
c = ds["spec"]["template"]["spec"]["containers"][0]
for a in c["args"]:
    print(a.replace("$(NODE_IP)", "127.0.0.1"))
')
metrics=$(printf '%s\n' "${args[@]}" | sed -n 's/^--metrics-listen=//p')
[ -n "$metrics" ] || fail "the DaemonSet passes no --metrics-listen"
podman run -d --name "$name" --network host "${limits[@]}" --read-only --read-only-tmpfs=false --cap-drop ALL \
  -e NODE_NAME=test-node \
  -v "$conf:/etc/ipool:ro" \
  -v "$host/opt/cni/bin:/host/opt/cni/bin:ro" \
  -v "$host/run/ipool:/run/ipool" \
  -v "$host/var/lib/ipool:/var/lib/ipool" \
  -v "$host/etc/cni/net.d:/host/etc/cni/net.d" \
  -v "$host/var/run/netns:/var/run/netns:ro" \
  "$tag" "${args[@]}" >/dev/null
for _ in $(seq 100); do [ -s "$host/etc/cni/net.d/10-ipool.conflist" ] && break; sleep 0.1; done
podman logs "$name" > "$host/daemon.log" 2>&1 || true
[ -S "$host/run/ipool/ipool.sock" ] || fail "no socket"
[ -s "$host/etc/cni/net.d/10-ipool.conflist" ] || fail "no conflist written"
version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cniVersion"])' "$host/etc/cni/net.d/10-ipool.conflist")
[ "$version" = 1.0.0 ] || fail "the conflist's cniVersion is $version, not the template's 1.0.0"
grep -q "could not be asked its CNI versions" "$host/daemon.log" \
  || fail "no warning that Debian's plugins could not be asked their versions"
python3 - "$metrics" <<'PY' || fail "metrics on $metrics"
import sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
assert "ipool_host_problems 0" in body, body
PY
# The DaemonSet's probes, as kubelet runs them.
mapfile -t probes < <(python3 -c '
import json, yaml
ds = yaml.safe_load(open("deploy/base/daemonset.yaml"))
c = ds["spec"]["template"]["spec"]["containers"][0]
for k in ["startupProbe", "readinessProbe", "livenessProbe"]:
    print(json.dumps(c[k]["exec"]["command"]))
')
for p in "${probes[@]}"; do
  mapfile -t cmd < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$p")
  podman exec "$name" "${cmd[@]}" >/dev/null || fail "probe ${cmd[*]} fails"
done

echo "== the installed plugin, exec'd from the host"
netconf=$(python3 - "$host" <<'PY'
import json, sys
c = json.load(open(f"{sys.argv[1]}/etc/cni/net.d/10-ipool.conflist"))
p = c["plugins"][0]
p["cniVersion"], p["name"] = c["cniVersion"], c["name"]
# The host sees the socket under the temp host dir.
p["ipam"]["socket"] = f"{sys.argv[1]}/run/ipool/ipool.sock"
print(json.dumps(p))
PY
)
plugin() {
  CNI_COMMAND=$1 CNI_CONTAINERID=image-test CNI_NETNS=/var/run/netns/image-test CNI_IFNAME=eth0 \
    CNI_PATH="$host/opt/cni/bin" "$host/opt/cni/bin/ipool" <<<"$2"
}
add=$(plugin ADD "$netconf") || fail "ADD: $add"
echo "$add" | grep -q '"10.251.0.2/24"' || fail "ADD gave: $add"
check_conf=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); c["prevResult"]=json.loads(sys.argv[2]); print(json.dumps(c))' "$netconf" "$add")
plugin CHECK "$check_conf" >/dev/null || fail "CHECK"
plugin DEL "$netconf" >/dev/null || fail "DEL"
listed=$(podman exec "$name" /usr/local/bin/ipoolctl --socket /run/ipool/ipool.sock list) \
  || fail "ipoolctl list in the container"
[[ $listed == *image-test* ]] && fail "the attachment is still listed after DEL"
echo "test-image: ok"
