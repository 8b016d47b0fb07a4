#!/usr/bin/env bash
# Loopback HTTP with a real client: the load bench's server (one axum server
# thread; the trivial handler on /plain without a layer, /memory behind our
# layer over MemoryStore, /idempotent behind the peer's layer over its memory
# store) and wrk (one thread, 64 keep-alive connections) on this machine.
# Fresh: a new Idempotency-Key on every request; replay: one key, completed
# before the run. Rounds alternate the order of the cells; each ratio is taken
# within a round, and the medians over rounds are printed.
#
#   bench/scripts/loopback.sh          (knobs: SECS=3 ROUNDS=3 CONNS=64 THREADS=1)
#
# Writes bench/results/loopback.csv (round,route,scenario,rps,p50_ms,server_cpu_us)
# for bench/scripts/picture.sh. Needs wrk (Debian: apt-get install wrk).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${SECS:-3}
rounds=${ROUNDS:-3}
conns=${CONNS:-64}
threads=${THREADS:-1}
port=${PORT:-18181}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
if ! build=$(cargo bench -p tower-idempotency-bench --ignore-rust-version --bench load --no-run 2>&1); then
  echo "$build" >&2
  exit 1
fi
target=${CARGO_TARGET_DIR:-target}
bin=$(ls -t "$target"/release/deps/load-* | grep -v '\.d$' | head -n 1)
work=$(mktemp -d)
LOAD_SERVE=127.0.0.1:$port LOAD_SERVE_BODY="$work/body.json" LOAD_ROUTES=plain,memory,idempotent \
  SERVER_THREADS=1 "$bin" >"$work/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  grep -q serving "$work/server.log" 2>/dev/null && break
  sleep 0.1
done
grep -q serving "$work/server.log" || { cat "$work/server.log" >&2; exit 1; }
base=http://127.0.0.1:$port
run_id=$(date +%s)

# The server process's CPU time (user + system), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
tick_us=$(( 1000000 / $(getconf CLK_TCK) ))

# cell ROUND ROUTE SCENARIO: one wrk run; appends a CSV line.
cell() {
  local round=$1 route=$2 scenario=$3 key_mode=fresh
  [ "$scenario" = replay ] && key_mode=replay
  local fixed="replay-$run_id-$round-$route"
  if [ "$key_mode" = replay ]; then
    # The key is completed before the run: every request then replays it.
    curl -sf -o /dev/null -X POST -H 'content-type: application/json' \
      -H "idempotency-key: $fixed" --data-binary @"$work/body.json" "$base/$route/v1/orders"
  fi
  local before after out
  before=$(cpu_ticks)
  out=$(BODY_FILE="$work/body.json" KEY_MODE=$key_mode FIXED_KEY=$fixed RUN_ID="$run_id-$round-$route" \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --latency -s bench/scripts/loopback.lua "$base/$route/v1/orders")
  after=$(cpu_ticks)
  local requests rps p50 bad
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {v = $2; if (v ~ /us$/) {sub("us", "", v); v /= 1000} else if (v ~ /ms$/) {sub("ms", "", v)} else if (v ~ /s$/) {sub("s", "", v); v *= 1000}; print v}' <<<"$out")
  bad=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  local cpu_us
  cpu_us=$(awk -v t="$(( (after - before) * tick_us ))" -v n="$requests" 'BEGIN {printf "%.1f", t / n}')
  echo "$round,$route,$scenario,$rps,$p50,$cpu_us" >>"$csv"
  printf '%-6s %-11s %-7s %10s req/s  p50 %6s ms  server CPU %5s us/request%s\n' \
    "$round" "$route" "$scenario" "$rps" "$p50" "$cpu_us" "${bad:+  NON-2xx: $bad}"
}

mkdir -p bench/results
csv=bench/results/loopback.csv
echo "round,route,scenario,rps,p50_ms,server_cpu_us" >"$csv"
echo "# loopback: wrk $threads thread(s), $conns connections, ${secs}s per cell, $rounds rounds, $(nproc) cpus, loadavg $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD)"
cells=("plain fresh" "memory fresh" "idempotent fresh" "memory replay" "idempotent replay")
# Warm-up: connections, allocator, the stores' first tables.
for c in "${cells[@]}"; do
  read -r route scenario <<<"$c"
  BODY_FILE="$work/body.json" KEY_MODE=fresh RUN_ID="warm-$run_id" \
    wrk -t1 -c"$conns" -d1s -s bench/scripts/loopback.lua "$base/$route/v1/orders" >/dev/null
done
for round in $(seq "$rounds"); do
  if (( round % 2 )); then order=("${cells[@]}"); else order=(); for ((i=${#cells[@]}-1; i>=0; i--)); do order+=("${cells[i]}"); done; fi
  for c in "${order[@]}"; do
    read -r route scenario <<<"$c"
    cell "$round" "$route" "$scenario"
  done
done
# Medians over rounds of each cell's share of the bare route's requests/s in
# the same round, and of ours over the peer's.
awk -F, 'NR > 1 { rps[$1, $2, $3] = $4; cpu[$1, $2, $3] = $6; rounds[$1] = 1 }
  function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }; return a[int((n + 1) / 2)] }
  END {
    n = 0; for (r in rounds) n++
    split("memory fresh,memory replay,idempotent fresh,idempotent replay", cells, ",")
    for (c = 1; c <= 4; c++) {
      split(cells[c], rs, " ")
      for (r = 1; r <= n; r++) v[r] = rps[r, rs[1], rs[2]] / rps[r, "plain", "fresh"]
      share = median(v, n)
      for (r = 1; r <= n; r++) v[r] = cpu[r, rs[1], rs[2]] / cpu[r, "plain", "fresh"]
      printf "%-18s %5.1f%% of the bare route'"'"'s requests/s, %.2fx its server CPU per request (medians of %d rounds)\n", cells[c], 100 * share, median(v, n), n
    }
    split("fresh,replay", sc, ",")
    for (s = 1; s <= 2; s++) {
      for (r = 1; r <= n; r++) v[r] = rps[r, "memory", sc[s]] / rps[r, "idempotent", sc[s]]
      printf "ours / idempotent, %-6s %.2fx\n", sc[s], median(v, n)
    }
  }' "$csv"
