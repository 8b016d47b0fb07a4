#!/usr/bin/env bash
# Runs a command with DATABASE_URL pointing at a throwaway PostgreSQL cluster
# (pg_stat_statements loaded), then stops and deletes the cluster.
#
#   bench/scripts/with-pg.sh cargo bench -p tower-idempotency-bench --ignore-rust-version --bench pg
#
# Same server settings as scripts/test (fsync=off, synchronous_commit=off: the
# numbers are CPU and round-trip bound, not disk bound), unless PG_DURABLE=1
# keeps the server's durable defaults (for benchmarks that count commits).
# With DATABASE_URL already set, the command runs against that database instead.
set -euo pipefail

if [ -n "${DATABASE_URL:-}" ]; then
  exec "$@"
fi

pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
  echo "with-pg.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2
  exit 1
fi
as_db_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
free_port() {
  local port
  while :; do
    port=$(( 20000 + RANDOM % 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
}

durability="-c fsync=off -c synchronous_commit=off"
[ "${PG_DURABLE:-0}" = 1 ] && durability=""

pg_dir=$(mktemp -d /tmp/tower-idempotency-bench-pg.XXXXXX)
chmod 755 "$pg_dir"
[ "$(id -u)" = 0 ] && chown postgres: "$pg_dir"
port=$(free_port)
as_db_owner "$pg_bin/initdb" -D "$pg_dir/data" -U postgres --auth=trust -E UTF8 >"$pg_dir/initdb.log"
cleanup() {
  as_db_owner "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$pg_dir"
}
trap cleanup EXIT
# A port found free can be taken before the server binds it: a few tries,
# each on a new port, with the server's log shown when one fails.
for attempt in 1 2 3; do
  if as_db_owner "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
    -o "-p $port -k $pg_dir -c listen_addresses=127.0.0.1 -c max_connections=400 $durability -c shared_preload_libraries=pg_stat_statements" \
    start >/dev/null; then
    break
  fi
  echo "$(basename "$0"): PostgreSQL did not start on port $port (attempt $attempt); its log:" >&2
  tail -n 20 "$pg_dir/server.log" >&2 || true
  [ "$attempt" = 3 ] && exit 1
  # A server that is still starting would hold the data directory.
  as_db_owner "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
  port=$(free_port)
done
export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
export PG_BIN="$pg_bin"
echo "with-pg.sh: PostgreSQL $("$pg_bin/postgres" --version | awk '{print $3}') on port $port (${durability:-durable defaults})"
"$@"
