# Sourced by scripts/test and bench/scripts/with-redis.sh: throwaway Redis
# servers on free loopback ports, without persistence. `start_redis_servers`
# starts a standalone server and two Clusters of three primaries with one
# replica each (the second for tests that break it), and exports REDIS_URL,
# REDIS_CLUSTER_URLS, REDIS_FAILOVER_CLUSTER_URLS and TEST_REDIS_DIR
# (<dir>/<port>/{pid,cmd,log} of every server).

# A free port whose Cluster bus port (port + 10000) is free too, both below
# the kernel's ephemeral range (32768 and up), where an outgoing connection
# could take the bus port first.
free_redis_port() {
  local port
  while :; do
    port=$(( 10000 + RANDOM % 12000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&
      ! (exec 3<>"/dev/tcp/127.0.0.1/$(( port + 10000 ))") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
}

# Starts redis-server on a free port with its files in $redis_dir/<port>;
# prints the port once it answers (a few tries, each on a new port). Extra
# arguments go to the server.
start_redis() {
  local port dir attempt
  for attempt in 1 2 3; do
    port=$(free_redis_port)
    dir="$redis_dir/$port"
    mkdir -p "$dir"
    # The command line is kept so that tests can restart the server as it was.
    printf '%q ' redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --dir "$dir" --pidfile "$dir/pid" --logfile "$dir/log" "$@" >"$dir/cmd"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
      --dir "$dir" --pidfile "$dir/pid" --logfile "$dir/log" "$@"
    for _ in $(seq 100); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then
        echo "$port"
        return
      fi
      sleep 0.05
    done
    echo "$(basename "$0"): redis-server did not start on port $port (attempt $attempt); its log:" >&2
    tail -n 20 "$dir/log" >&2 || true
    [ -f "$dir/pid" ] && kill -9 "$(cat "$dir/pid")" 2>/dev/null
  done
  exit 1
}

# Starts three primaries and three replicas as one Cluster; prints their URLs.
start_cluster() {
  local ports=() urls=() port
  for _ in 1 2 3 4 5 6; do
    ports+=("$(start_redis --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000)")
  done
  local log="$redis_dir/create-${ports[0]}.log"
  if ! redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") \
    --cluster-replicas 1 --cluster-yes >"$log" 2>&1; then
    echo "$(basename "$0"): redis-cli --cluster create failed:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  local ok=0
  for _ in $(seq 200); do
    ok=1
    for port in "${ports[@]}"; do
      redis-cli -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  if [ "$ok" != 1 ]; then
    echo "$(basename "$0"): the Cluster on ports ${ports[*]} did not become ready" >&2
    exit 1
  fi
  for port in "${ports[@]}"; do urls+=("redis://127.0.0.1:$port"); done
  (IFS=,; echo "${urls[*]}")
}

# Installs Redis when missing (as root), starts the servers, exports their
# URLs, and registers their removal in the caller's `cleanups` array.
start_redis_servers() {
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
      echo "$(basename "$0"): Redis is not installed; run as root or set REDIS_URL and REDIS_CLUSTER_URLS" >&2
      exit 1
    fi
    echo "$(basename "$0"): installing Redis with apt-get"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server redis-tools
  fi
  redis_dir=$(mktemp -d /tmp/tower-idempotency-redis.XXXXXX)
  cleanups+=("for f in '$redis_dir'/*/pid; do kill -9 \$(cat \"\$f\") 2>/dev/null; done; rm -rf '$redis_dir'")
  redis_port=$(start_redis)
  export REDIS_URL="redis://127.0.0.1:$redis_port"
  # Assigned before export, so that a failed start stops the script (set -e).
  local cluster failover_cluster
  cluster=$(start_cluster)
  failover_cluster=$(start_cluster)
  export REDIS_CLUSTER_URLS="$cluster" REDIS_FAILOVER_CLUSTER_URLS="$failover_cluster"
  # Tests that restart servers use these: <dir>/<port>/{pid,cmd}.
  export TEST_REDIS_DIR="$redis_dir"
  echo "$(basename "$0"): Redis $(redis-server --version | awk '{print $3}' | cut -d= -f2) on port $redis_port, Clusters $REDIS_CLUSTER_URLS and $REDIS_FAILOVER_CLUSTER_URLS"
}
