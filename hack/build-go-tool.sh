#!/usr/bin/env bash
# Builds a Go tool pinned in hack/tools/<name>/go.mod (a "tool" directive)
# into the cache outside the clone, and links it as bin/<name>.
#   hack/build-go-tool.sh staticcheck honnef.co/go/tools/cmd/staticcheck
set -euo pipefail

name=${1:?usage: hack/build-go-tool.sh NAME PACKAGE}
pkg=${2:?usage: hack/build-go-tool.sh NAME PACKAGE}
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/hack/tools/$name
cache_root=${ETCD_MANAGER_TOOLS_CACHE:-$HOME/.cache/etcd-manager/tools}
key=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-16)
out=$cache_root/$name-$key

if [ ! -x "$out/$name" ]; then
  echo "build-go-tool: building $name"
  mkdir -p "$cache_root"
  tmp=$(mktemp -d "$cache_root/.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$mod" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath -o "$tmp/$name" "$pkg")
  chmod 755 "$tmp"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
fi
mkdir -p "$root/bin"
ln -sfn "$out/$name" "$root/bin/$name"
