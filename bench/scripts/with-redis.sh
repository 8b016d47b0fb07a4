#!/usr/bin/env bash
# Runs a command with REDIS_URL and REDIS_CLUSTER_URLS pointing at throwaway
# Redis servers (a standalone server and a Cluster of three primaries with one
# replica each, as scripts/test starts them), then stops them.
#
#   bench/scripts/with-redis.sh cargo bench -p tower-idempotency-bench --ignore-rust-version --bench load
set -euo pipefail
cd "$(dirname "$0")/../.."
cleanups=()
run_cleanups() {
  local i
  for (( i=${#cleanups[@]}-1; i>=0; i-- )); do eval "${cleanups[$i]}" || true; done
}
trap run_cleanups EXIT
. scripts/redis-servers.sh
if [ -z "${REDIS_URL:-}" ] || [ -z "${REDIS_CLUSTER_URLS:-}" ]; then
  start_redis_servers
fi
"$@"
