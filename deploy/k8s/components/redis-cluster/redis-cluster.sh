#!/bin/sh
# A Redis Cluster node and the cluster's one-time creation, for Kubernetes
# (this component: ConfigMap redis-cluster-scripts) and Compose
# (deploy/compose/docker-compose.redis-cluster.yml mounts this file).
#
#   redis-cluster.sh start    run this node (execs redis-server)
#   redis-cluster.sh ready    exit 0 once this node serves a healthy cluster
#   redis-cluster.sh create   create the cluster from NODES, once: does
#                             nothing when it exists already
#
# Environment:
#   NODES            every node, `HOST[:PORT]`, space-separated, in order:
#                    with REPLICAS 1 the first half become the primaries
#   SELF             (start) the name this node is reached by: announced to
#                    clients (CLUSTER SLOTS, MOVED) instead of its IP
#   REDIS_PORT       this node's port (start, ready), NODES' default; 6379
#   NODE_TIMEOUT_MS  cluster-node-timeout (start); 5000
#   REPLICAS         replicas per primary (create); 1
#   DATA_DIR         (start) nodes.conf and the append-only file; /data
set -eu

port="${REDIS_PORT:-6379}"

# The IP a name has now (empty when it has none yet).
resolve() {
  getent hosts "$1" | awk 'NR == 1 { print $1 }' || true
}

host_of() { printf '%s\n' "${1%:*}"; }
port_of() {
  case "$1" in
    *:*) printf '%s\n' "${1##*:}" ;;
    *) printf '%s\n' "$port" ;;
  esac
}

# One field of `CLUSTER INFO` from the node $1.
cluster_field() {
  redis-cli -h "$(host_of "$1")" -p "$(port_of "$1")" cluster info 2>/dev/null |
    tr -d '\r' | sed -n "s/^$2://p"
}

# The cluster bus speaks IPs only, and nodes.conf keeps the IPs the nodes had
# when they last ran. A pod or container that is recreated comes back with a
# new IP; when every node does (a full restart), none would find the others.
# So before a node starts, every line of its nodes.conf whose node announced a
# hostname that resolves now gets that hostname's current IP; the node itself
# included. Lines look like `<id> <ip>:<port>@<cport>,<hostname>[,aux] ...`.
refresh_ips() {
  conf="$1"
  map=""
  for node in ${NODES:-}; do
    name="$(host_of "$node")"
    ip="$(resolve "$name")"
    [ -n "$ip" ] && map="$map $name=$ip"
  done
  [ -n "$map" ] || return 0
  awk -v map="$map" '
    BEGIN {
      count = split(map, pairs, " ")
      for (i = 1; i <= count; i++) {
        split(pairs[i], pair, "=")
        ip[pair[1]] = pair[2]
      }
    }
    $1 != "vars" {
      split($2, parts, ",")
      if ((parts[2] in ip) && match(parts[1], /:[0-9]+@[0-9]+$/)) {
        $2 = ip[parts[2]] substr($2, RSTART)
      }
    }
    { print }
  ' "$conf" >"$conf.new"
  mv "$conf.new" "$conf"
}

start() {
  : "${SELF:?SELF names this node}"
  dir="${DATA_DIR:-/data}"
  if [ -s "$dir/nodes.conf" ]; then
    refresh_ips "$dir/nodes.conf"
    echo "redis-cluster: $SELF rejoins (nodes.conf kept, addresses refreshed)"
  else
    echo "redis-cluster: $SELF is a new node (redis-cluster.sh create makes the cluster)"
  fi
  # Tasks and contexts are acknowledged once Redis has them: append-only
  # file, fsync every second. A shard whose primary is lost stops only its
  # own slots (full coverage not required) until its replica is promoted,
  # NODE_TIMEOUT_MS plus an election later.
  exec redis-server --port "$port" --dir "$dir" --protected-mode no \
    --appendonly yes --appendfsync everysec \
    --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout "${NODE_TIMEOUT_MS:-5000}" \
    --cluster-require-full-coverage no \
    --cluster-announce-hostname "$SELF" \
    --cluster-preferred-endpoint-type hostname
}

# Ready: the cluster is whole (every slot served) as node $1 sees it, and a
# replica is in sync with its primary.
node_ready() {
  [ "$(cluster_field "$1" cluster_state)" = ok ] || return 1
  set -- "$(host_of "$1")" "$(port_of "$1")"
  role="$(redis-cli -h "$1" -p "$2" role 2>/dev/null | head -n 1 | tr -d '\r')"
  if [ "$role" = slave ]; then
    redis-cli -h "$1" -p "$2" info replication 2>/dev/null | tr -d '\r' | grep -q '^master_link_status:up$'
  fi
}

# The probe: a rolling restart waits for it before it takes the next node.
ready() {
  node_ready "127.0.0.1:$port"
}

# How many replicas node $1 knows of.
replicas_of() {
  redis-cli -h "$(host_of "$1")" -p "$(port_of "$1")" cluster nodes 2>/dev/null |
    awk '$3 ~ /slave/ { count++ } END { print count + 0 }'
}

# Waits until $1 answers PING (up to 5 minutes: pods being scheduled).
wait_for() {
  tries=0
  until [ "$(redis-cli -h "$(host_of "$1")" -p "$(port_of "$1")" ping 2>/dev/null | tr -d '\r')" = PONG ]; do
    tries=$((tries + 1))
    if [ "$tries" -ge 150 ]; then
      echo "redis-cluster: $1 does not answer" >&2
      exit 1
    fi
    sleep 2
  done
}

# Idempotent: the cluster is created only when every node is empty (knows no
# other node and serves no slot). When any node is part of a cluster already,
# nothing is changed: the job only waits for that cluster to be healthy. A
# creation cut short (some nodes formed, the cluster not ok) is not redone:
# the job fails and says what to run.
create() {
  : "${NODES:?NODES lists every node}"
  for node in $NODES; do
    wait_for "$node"
  done
  formed=""
  empty=""
  created=""
  for node in $NODES; do
    known="$(cluster_field "$node" cluster_known_nodes)"
    assigned="$(cluster_field "$node" cluster_slots_assigned)"
    if [ -z "$known" ] || [ -z "$assigned" ]; then
      echo "redis-cluster: $node answers no CLUSTER INFO (is it cluster-enabled?)" >&2
      exit 1
    fi
    if [ "$known" -gt 1 ] || [ "$assigned" -gt 0 ]; then
      formed="$formed $node"
    else
      empty="$empty $node"
    fi
  done
  if [ -z "$formed" ]; then
    echo "redis-cluster: creating the cluster of$empty"
    # shellcheck disable=SC2086 # one argument per node
    redis-cli --cluster create $NODES --cluster-replicas "${REPLICAS:-1}" --cluster-yes
    formed="$empty"
    empty=""
    created=yes
  else
    echo "redis-cluster: the cluster exists (on$formed): not creating it again"
  fi
  # After a creation, every replica attached first.
  tries=0
  for member in $formed; do break; done
  if [ -n "$created" ]; then
    # shellcheck disable=SC2086 # one word per node
    set -- $NODES
    expected=$(($# - $# / (${REPLICAS:-1} + 1)))
    until [ "$(replicas_of "$member")" -ge "$expected" ]; do
      tries=$((tries + 1))
      if [ "$tries" -ge 60 ]; then
        echo "redis-cluster: fewer than $expected replicas attached" >&2
        exit 1
      fi
      sleep 2
    done
  fi
  # Then every node in the cluster, a replica in sync: up to 2 minutes in all.
  for node in $formed; do
    until node_ready "$node"; do
      tries=$((tries + 1))
      if [ "$tries" -ge 60 ]; then
        echo "redis-cluster: $node is not in a healthy cluster; see" \
          "\`redis-cli --cluster check $node\` (and \`--cluster fix\`)" >&2
        exit 1
      fi
      sleep 2
    done
  done
  for node in $empty; do
    echo "redis-cluster: $node is in no cluster (a lost volume?); add it as a replica:" \
      "\`redis-cli --cluster add-node $node $member --cluster-slave\`" >&2
  done
  echo "redis-cluster: cluster_state:ok"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  create) create ;;
  *)
    echo "usage: redis-cluster.sh start|ready|create" >&2
    exit 2
    ;;
esac
