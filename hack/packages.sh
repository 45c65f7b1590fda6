#!/usr/bin/env bash
# Installs the Debian packages the tests need, when they are missing, and
# nothing else: no service is started or stopped (the tests run a
# containerd of their own).
#   containerd, runc, containernetworking-plugins: the image test imports and
#     runs the image, and make e2e-kube runs a single-node Kubernetes on them;
#   openssl, curl: the Kubernetes test's certificates and probes;
#   systemd: its systemd-analyze checks the unit in deploy/systemd;
#   chromium: the status page is rendered in a real headless browser;
#   npm: the Azure blob emulator (Azurite) is an npm package.
set -euo pipefail

need=()
for p in containerd runc containernetworking-plugins openssl curl systemd chromium; do
  [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || need+=("$p")
done
command -v npm >/dev/null || need+=(npm)
if ((${#need[@]} == 0)); then
  echo "packages: every package the tests need is installed"
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "packages: the tests need ${need[*]}; install them (apt-get install ${need[*]}) or run this as root" >&2
  exit 1
fi
echo "packages: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# Debian's maintainer scripts start the services they install unless
# policy-rc.d says no (exit 101); one already there is left as it was.
policy=/usr/sbin/policy-rc.d
own_policy=
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  own_policy=1
fi
trap 'if [[ -n $own_policy ]]; then rm -f "$policy"; fi' EXIT
apt-get install -y -q "${need[@]}" || { apt-get update -q && apt-get install -y -q "${need[@]}"; }
