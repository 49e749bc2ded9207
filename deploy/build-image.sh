#!/usr/bin/env bash
# Builds ipool's image from static binaries, with nothing pulled from a registry.
#   deploy/build-image.sh [TAG]      default tag: localhost/ipool:<workspace version>
# Uses podman if present, else docker (ENGINE=docker to choose).
#
# Reproducible: two builds of one commit give the same image ID and digest, wherever the
# checkout is. The dependencies are those of Cargo.lock (--locked); build paths are remapped
# in the binaries (the checkout to /ipool, cargo's home to /cargo; the standard library's are
# /rustc/<commit> already); every timestamp (the image's, its history's, the files') is the
# commit's time (SOURCE_DATE_EPOCH, when not set already). The binaries are built in
# target/image-build/, apart from other builds (their flags differ).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag=${1:-localhost/ipool:$version}
engine=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
export CARGO_TARGET_DIR=$PWD/target/image-build
export RUSTFLAGS="--remap-path-prefix=$PWD=/ipool --remap-path-prefix=$cargo_home=/cargo"

# Static binaries (glibc, static-pie): the image has no libc, no loader and no NSS.
cargo --locked build-plugin
cargo --locked build-image-ipoold
cargo --locked build-image-ipoolctl
rm -rf target/image
mkdir -p target/image
cp "$CARGO_TARGET_DIR"/plugin/ipool "$CARGO_TARGET_DIR"/image-bins/ipoold \
   "$CARGO_TARGET_DIR"/image-bins/ipoolctl target/image/
for b in ipool ipoold ipoolctl; do
  headers=$(readelf -l "target/image/$b")
  if [[ $headers == *INTERP* ]]; then
    echo "target/image/$b is not statically linked" >&2; exit 1
  fi
  if grep -q --fixed-strings "$PWD" "target/image/$b"; then
    echo "target/image/$b names the build path $PWD" >&2; exit 1
  fi
done
if [ "$(basename "$engine")" = podman ]; then
  "$engine" build --timestamp "$SOURCE_DATE_EPOCH" -f deploy/Containerfile -t "$tag" target/image
else
  # BuildKit: the files' and the image's times from SOURCE_DATE_EPOCH.
  "$engine" buildx build --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
    --output type=docker,rewrite-timestamp=true -f deploy/Containerfile -t "$tag" target/image
fi
echo "built $tag"
