#!/usr/bin/env bash
# Builds the real etcd, etcdctl and etcdutl for one version from the Go module
# proxy, using the small module under hack/tools/etcd-v<version>/.
#
# Outputs are cached outside the clone, in
#   ${ETCD_MANAGER_TOOLS_CACHE:-~/.cache/etcd-manager/tools}/etcd-v<version>/
# keyed by a hash of the module's files, so a fresh clone (as in CI) reuses
# them and only a changed pin is rebuilt. bin/etcd-v<version> links there.
set -euo pipefail

ver=${1:?usage: hack/build-etcd.sh VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/hack/tools/etcd-v$ver
[ -f "$mod/go.mod" ] || { echo "build-etcd: no tools module at $mod" >&2; exit 1; }

cache_root=${ETCD_MANAGER_TOOLS_CACHE:-$HOME/.cache/etcd-manager/tools}
out=$cache_root/etcd-v$ver
key=$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" | sha256sum | cut -c1-16)

have() {
  [ -f "$out/.key" ] && [ "$(cat "$out/.key")" = "$key" ] &&
    [ -x "$out/etcd" ] && [ -x "$out/etcdctl" ] && [ -x "$out/etcdutl" ]
}

if have; then
  echo "build-etcd: etcd v$ver is cached in $out"
else
  echo "build-etcd: building etcd v$ver (a cold build takes a few minutes)"
  tmp=$(mktemp -d "$cache_root.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$cache_root"; mktemp -d "$cache_root.tmp.XXXXXX"; })
  trap 'rm -rf "$tmp"' EXIT
  (
    cd "$mod"
    export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
    go build -trimpath -o "$tmp/etcd" .
    go build -trimpath -o "$tmp/" go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3
  )
  # The package builds are named after their import path's last element (v3).
  [ -x "$tmp/etcdctl" ] || { echo "build-etcd: etcdctl was not built" >&2; exit 1; }
  echo "$key" > "$tmp/.key"
  chmod 755 "$tmp"
  mkdir -p "$cache_root"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
fi

mkdir -p "$root/bin"
ln -sfn "$out" "$root/bin/etcd-v$ver"
# Capture first: with pipefail, head closing the pipe early would fail the build.
version_out=$("$root/bin/etcd-v$ver/etcd" --version)
echo "${version_out%%$'\n'*}"
