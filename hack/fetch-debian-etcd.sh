#!/usr/bin/env bash
# Extracts Debian's etcd (server and client) of a pinned package version
# into the cache outside the clone, without installing anything, and links
# it as bin/etcd-v<upstream version>/ (etcd and etcdctl; 3.4 has no etcdutl).
#   hack/fetch-debian-etcd.sh 3.4.23 3.4.23-4+b4
set -euo pipefail

ver=${1:?usage: hack/fetch-debian-etcd.sh UPSTREAM_VERSION DEBIAN_VERSION}
debver=${2:?usage: hack/fetch-debian-etcd.sh UPSTREAM_VERSION DEBIAN_VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${ETCD_MANAGER_TOOLS_CACHE:-$HOME/.cache/etcd-manager/tools}
out=$cache_root/etcd-v$ver

if [ -f "$out/.key" ] && [ "$(cat "$out/.key")" = "$debver" ] && [ -x "$out/etcd" ]; then
  echo "fetch-debian-etcd: etcd v$ver is cached in $out"
else
  echo "fetch-debian-etcd: downloading Debian's etcd $debver"
  mkdir -p "$cache_root"
  tmp=$(mktemp -d "$cache_root/.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if ! apt-cache show "etcd-server=$debver" >/dev/null 2>&1; then
    echo "fetch-debian-etcd: refreshing the package lists"
    apt-get update -q >/dev/null
  fi
  (cd "$tmp" && apt-get download -q "etcd-server=$debver" "etcd-client=$debver" 2>&1 | grep -v "unsandboxed as root" || true)
  ls "$tmp"/etcd-server_*.deb "$tmp"/etcd-client_*.deb >/dev/null
  mkdir "$tmp/x" "$tmp/out"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
  cp "$tmp/x/usr/bin/etcd" "$tmp/x/usr/bin/etcdctl" "$tmp/out/"
  echo "$debver" > "$tmp/out/.key"
  chmod 755 "$tmp/out"
  rm -rf "$out"
  mv "$tmp/out" "$out"
fi
mkdir -p "$root/bin"
ln -sfn "$out" "$root/bin/etcd-v$ver"
version_out=$("$root/bin/etcd-v$ver/etcd" --version)
echo "${version_out%%$'\n'*}"
