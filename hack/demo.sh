#!/usr/bin/env bash
# Runs a real local etcd-manager cluster on loopback, with a file:// backup
# store under .demo/. It stays up until Ctrl-C, then stops cleanly.
# DEMO_ONESHOT=1 stops it right after the check (CI uses this).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${DEMO_ETCD_VERSION:-3.6.16}
demo=$root/.demo
store="file://$demo/backups/demo"
client=http://127.0.0.1:4001
etcdctl="$root/bin/etcd-v$version/etcdctl"

if [ -e "$demo/agent.pid" ] && kill -0 "$(cat "$demo/agent.pid")" 2>/dev/null; then
  echo "demo: a demo agent is already running (pid $(cat "$demo/agent.pid")); stop it first" >&2
  exit 1
fi
rm -rf "$demo"
mkdir -p "$demo/logs"

agent_pid=
stop() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    echo
    echo "demo: stopping the agent (pid $agent_pid); it stops etcd first"
    kill -TERM "$agent_pid"
    wait "$agent_pid" || true
  fi
  rm -f "$demo/agent.pid"
}
trap stop EXIT
trap 'exit 130' INT TERM

bin/etcd-manager --insecure --etcd-insecure \
  --address 127.0.0.1 --etcd-address 127.0.0.1 \
  --cluster-name=demo --backup-store="$store" \
  --data-dir="$demo/data/1" \
  --client-urls=$client --quarantine-client-urls=http://127.0.0.1:8001 \
  --peer-urls=http://127.0.0.1:2380 \
  --etcd-bin-dir="$root/bin" --loop-interval=1s \
  >"$demo/logs/agent-1.log" 2>&1 &
agent_pid=$!
echo "$agent_pid" >"$demo/agent.pid"
echo "demo: agent started (pid $agent_pid), log in .demo/logs/agent-1.log"

bin/etcd-manager-ctl -member-count=1 --backup-store="$store" -etcd-version="$version" \
  --etcd-bin-dir="$root/bin" configure-cluster

echo -n "demo: waiting for etcd to serve on $client "
for i in $(seq 1 60); do
  if "$etcdctl" --endpoints=$client --command-timeout=2s endpoint health >/dev/null 2>&1; then
    break
  fi
  if ! kill -0 "$agent_pid" 2>/dev/null; then
    echo; echo "demo: the agent exited; its log:" >&2; tail -30 "$demo/logs/agent-1.log" >&2; exit 1
  fi
  if [ "$i" = 60 ]; then
    echo; echo "demo: etcd did not come up in 60s; the agent's log:" >&2; tail -30 "$demo/logs/agent-1.log" >&2; exit 1
  fi
  echo -n .; sleep 1
done
echo " up"

"$etcdctl" --endpoints=$client put /demo/hello world >/dev/null
got=$("$etcdctl" --endpoints=$client get --print-value-only /demo/hello)
if [ "$got" != world ]; then
  echo "demo: wrote /demo/hello=world but read back '$got'" >&2
  exit 1
fi
echo "demo: wrote and read /demo/hello = $got"

cat <<TXT

A 1-member etcd $version cluster is running, managed by etcd-manager.
  client endpoint:  $client
  backup store:     $store
  agent log:        .demo/logs/agent-1.log

Try:
  $etcdctl --endpoints=$client get --prefix /demo
  $etcdctl --endpoints=$client member list -w table
  bin/etcd-manager-ctl --backup-store=$store get
  kill -9 \$(cat .demo/data/1/etcd.pid)    # the agent restarts etcd within seconds

TXT
if [ "${DEMO_ONESHOT:-}" = 1 ]; then
  echo "demo: DEMO_ONESHOT=1, stopping"
  exit 0
fi
echo "Press Ctrl-C to stop."
wait "$agent_pid"
