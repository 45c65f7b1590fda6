#!/usr/bin/env bash
# Runs a real local etcd-manager cluster: three agents on 127.0.0.1, .2 and
# .3, each with its own etcd, and a file:// backup store under .demo/. It
# stays up until Ctrl-C, then stops cleanly.
# DEMO_ONESHOT=1 stops it right after the check (CI uses this).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${DEMO_ETCD_VERSION:-3.6.16}
members=${DEMO_MEMBERS:-3}
demo=$root/.demo
store="file://$demo/backups/demo"
etcdctl="$root/bin/etcd-v$version/etcdctl"
endpoints=
for i in $(seq 1 "$members"); do endpoints="$endpoints${endpoints:+,}https://127.0.0.$i:4001"; done
# TLS, as shipped: the agents generate the cluster's CA into the store, and
# etcdctl gets a client certificate from it (see docs/security.md).
certs=$demo/certs
tls="--cacert=$certs/ca.crt --cert=$certs/client.crt --key=$certs/client.key"

for f in "$demo"/agent-*.pid; do
  if [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; then
    echo "demo: a demo agent is already running (pid $(cat "$f")); stop it first" >&2
    exit 1
  fi
done
rm -rf "$demo"
mkdir -p "$demo/logs"

pids=()
stop() {
  if [ ${#pids[@]} -gt 0 ]; then
    echo
    echo "demo: stopping the agents (pids ${pids[*]}); each stops its etcd first"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -f "$demo"/agent-*.pid
}
trap stop EXIT
trap 'exit 130' INT TERM

for i in $(seq 1 "$members"); do
  bin/etcd-manager \
    --address 127.0.0.$i --etcd-address 127.0.0.$i \
    --cluster-name=demo --backup-store="$store" \
    --data-dir="$demo/data/$i" \
    --client-urls=https://127.0.0.$i:4001 --quarantine-client-urls=https://127.0.0.$i:8001 \
    --peer-urls=https://127.0.0.$i:2380 \
    --etcd-bin-dir="$root/bin" --loop-interval=1s \
    >"$demo/logs/agent-$i.log" 2>&1 &
  pids+=($!)
  echo "$!" >"$demo/agent-$i.pid"
  echo "demo: agent $i started on 127.0.0.$i (pid $!), log in .demo/logs/agent-$i.log"
done

bin/etcd-manager-ctl -member-count="$members" --backup-store="$store" -etcd-version="$version" configure-cluster

echo -n "demo: waiting for $members healthy members "
for i in $(seq 1 90); do
  if [ ! -e "$certs/client.key" ]; then
    # The CA appears in the store when the first agent starts.
    bin/etcd-manager-ctl --backup-store="$store" --store-attempts=1 issue-client-cert --out "$certs" >/dev/null 2>&1 || true
  fi
  # shellcheck disable=SC2086
  healthy=$("$etcdctl" --endpoints="$endpoints" $tls --command-timeout=2s endpoint health 2>/dev/null | grep -c 'is healthy' || true)
  if [ "$healthy" = "$members" ]; then
    break
  fi
  for p in "${pids[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then
      echo; echo "demo: agent pid $p exited; the logs:" >&2; tail -n 20 "$demo"/logs/*.log >&2; exit 1
    fi
  done
  if [ "$i" = 90 ]; then
    echo; echo "demo: the cluster did not come up in 90s; the logs:" >&2; tail -n 20 "$demo"/logs/*.log >&2; exit 1
  fi
  echo -n .; sleep 1
done
echo " up"

# shellcheck disable=SC2086
"$etcdctl" --endpoints="$endpoints" $tls put /demo/hello world >/dev/null
# shellcheck disable=SC2086
got=$("$etcdctl" --endpoints="$endpoints" $tls get --print-value-only /demo/hello)
if [ "$got" != world ]; then
  echo "demo: wrote /demo/hello=world but read back '$got'" >&2
  exit 1
fi
echo "demo: wrote and read /demo/hello = $got"
backup=$(bin/etcd-manager-ctl --backup-store="$store" backup-now --timeout=2m)
echo "demo: backup-now took backup $backup"
bin/etcd-manager-ctl --backup-store="$store" list-backups | grep -qx "$backup" || {
  echo "demo: backup $backup is not in list-backups" >&2
  exit 1
}
echo
bin/etcd-manager-ctl --backup-store="$store" status

cat <<TXT

A $members-member etcd $version cluster is running, managed by etcd-manager.
  client endpoints: $endpoints (TLS; client certificate in .demo/certs/)
  backup store:     $store (its pki/ holds the cluster's CA)
  agent logs:       .demo/logs/

Try:
  $etcdctl --endpoints=$endpoints $tls get --prefix /demo
  $etcdctl --endpoints=$endpoints $tls member list -w table
  bin/etcd-manager-ctl --backup-store=$store status
  bin/etcd-manager-ctl --backup-store=$store get
  bin/etcd-manager-ctl --backup-store=$store backup-now
  bin/etcd-manager-ctl --backup-store=$store list-backups -o json
  kill -9 \$(cat .demo/data/2/etcd.pid)    # the agent restarts etcd within seconds

TXT
if [ "${DEMO_ONESHOT:-}" = 1 ]; then
  echo "demo: DEMO_ONESHOT=1, stopping"
  exit 0
fi
echo "Press Ctrl-C to stop."
wait "${pids[@]}"
