#!/usr/bin/env bash
# Builds ipool's image from static binaries, with nothing pulled from a registry.
#   deploy/build-image.sh [TAG]      default tag: localhost/ipool:<workspace version>
# Uses podman if present, else docker (ENGINE=docker to choose).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag=${1:-localhost/ipool:$version}
engine=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}

# Static binaries (glibc, static-pie): the image has no libc, no loader and no NSS.
cargo build-plugin
cargo build-image-ipoold
cargo build-image-ipoolctl
mkdir -p target/image
cp target/plugin/ipool target/image-bins/ipoold target/image-bins/ipoolctl target/image/
for b in ipool ipoold ipoolctl; do
  headers=$(readelf -l "target/image/$b")
  if [[ $headers == *INTERP* ]]; then
    echo "target/image/$b is not statically linked" >&2; exit 1
  fi
done
"$engine" build -f deploy/Containerfile -t "$tag" target/image
echo "built $tag"
