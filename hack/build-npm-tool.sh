#!/usr/bin/env bash
# Installs an npm tool pinned by hack/tools/<name>/package-lock.json into the
# cache outside the clone, and links its binary as bin/<bin>.
#   hack/build-npm-tool.sh azurite azurite-blob
set -euo pipefail

name=${1:?usage: hack/build-npm-tool.sh NAME BIN}
bin=${2:?usage: hack/build-npm-tool.sh NAME BIN}
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/hack/tools/$name
cache_root=${ETCD_MANAGER_TOOLS_CACHE:-$HOME/.cache/etcd-manager/tools}
key=$(cat "$mod/package.json" "$mod/package-lock.json" | sha256sum | cut -c1-16)
out=$cache_root/$name-$key

command -v npm >/dev/null || { echo "build-npm-tool: npm is required to install $name" >&2; exit 1; }
if [ ! -x "$out/node_modules/.bin/$bin" ]; then
  echo "build-npm-tool: installing $name"
  mkdir -p "$cache_root"
  tmp=$(mktemp -d "$cache_root/.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$mod/package.json" "$mod/package-lock.json" "$tmp/"
  (cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error)
  chmod 755 "$tmp"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
fi
mkdir -p "$root/bin"
ln -sfn "$out/node_modules/.bin/$bin" "$root/bin/$bin"
