#!/usr/bin/env bash
# Checks that the image is reproducible (CI, with podman): the image built from this checkout
# and the one built from a clone of its HEAD at another path, with a target dir of its own,
# have the same ID and digest. The first image is removed before the second is built, so no
# layer of it is reused.
#   deploy/check-reproducible.sh [TAG]   TAG: this checkout's image, built already
#                                        (default: build it now as localhost/ipool:repro-a)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -z "$(git status --porcelain --untracked-files=no)" ] \
  || { echo "check-reproducible: the checkout has changes; a clone of HEAD would differ" >&2; exit 1; }
first=${1:-}
if [ -z "$first" ]; then
  first=localhost/ipool:repro-a
  ENGINE=podman deploy/build-image.sh "$first"
fi
a=$(podman image inspect --format '{{.Id}} {{.Digest}}' "$first")
podman rmi -f "$first" >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; podman rmi -f localhost/ipool:repro-b >/dev/null 2>&1 || true' EXIT
git clone -q . "$tmp/elsewhere/ipool-second-build"
(cd "$tmp/elsewhere/ipool-second-build" && ENGINE=podman deploy/build-image.sh localhost/ipool:repro-b)
b=$(podman image inspect --format '{{.Id}} {{.Digest}}' localhost/ipool:repro-b)
echo "first build:  $a"
echo "second build: $b"
[ "$a" = "$b" ] || { echo "check-reproducible: the two builds differ" >&2; exit 1; }
echo "check-reproducible: ok"
