#!/usr/bin/env bash
# Redraws docs/benchmarks.svg from the figures the benches wrote into
# bench/results (or RESULTS=dir):
#
#   BENCH_RESULTS=$PWD/bench/results cargo bench -p tower-idempotency-bench --ignore-rust-version --bench mounted
#   bench/scripts/loopback.sh
#   PG_DURABLE=1 TXN_PLAIN=0 BENCH_RESULTS=$PWD/bench/results bench/scripts/with-pg.sh \
#     cargo bench -p tower-idempotency-bench --ignore-rust-version --bench txn
#   bench/scripts/picture.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo run -q --release -p tower-idempotency-bench --ignore-rust-version --bin picture -- \
  "${RESULTS:-bench/results}" docs/benchmarks.svg
