#!/usr/bin/env bash
# Builds a release into ${RELEASE_DIR:-bin/release}: static binaries for
# linux/amd64 and linux/arm64 as tarballs, the container image tarball
# (linux/amd64, as its etcd builds are), and SHA256SUMS. The build is
# reproducible: the same commit gives the same files, byte for byte
# (make release-check builds it twice and compares).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
out=${RELEASE_DIR:-bin/release}
# Every file's time is the commit's, so that archives do not carry the
# build's clock.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
rm -rf "$out"
mkdir -p "$out"
ldflags="-s -w -buildid= -X github.com/etcd-manager/etcd-manager/internal/version.release=$version"

for arch in amd64 arm64; do
  name=etcd-manager-$version-linux-$arch
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  mkdir -p "$dir/$name"
  echo "release: building $name"
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=auto -ldflags "$ldflags" \
    -o "$dir/$name/" ./cmd/etcd-manager ./cmd/etcd-manager-ctl ./cmd/etcd-manager-operator
  cp LICENSE README.md "$dir/$name/"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode=go-w \
    -C "$dir" -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
  rm -rf "$dir"
  trap - EXIT
done

echo "release: building the image"
make -s image IMAGE_TAG="etcd-manager:$version" >/dev/null
cp bin/etcd-manager-image.tar "$out/etcd-manager-$version-image-linux-amd64.tar"

(cd "$out" && sha256sum -- * >SHA256SUMS)
echo "release: $out"
cat "$out/SHA256SUMS"
