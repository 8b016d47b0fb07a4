#!/usr/bin/env bash
# Instructions per operation under callgrind (stable on a shared machine):
# runs the micro bench's loop mode with N and with 100 iterations and divides
# the difference. Valgrind hides SHA-NI, so SHA-256 runs in software here: the
# fingerprint's share is larger than on the real CPU.
#
#   bench/scripts/instructions.sh [what...]   (default: the layer variants)
#
# `what`: canon_1k, fingerprint_1k, store_fresh, or a variant of the side-by-side
# table (no_layer, ours/fresh, ours/replay, ours/key_reuse_409, idempotent/fresh,
# idempotent/replay, axum-idempotent/fresh, axum-idempotent/replay).
# MICRO_BIN=path counts with that micro binary instead of building this tree's
# (to set two builds side by side).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${MICRO_BIN:-}" ]; then
  bin=$MICRO_BIN
else
  cargo bench -p tower-idempotency-bench --ignore-rust-version --bench micro --no-run >/dev/null 2>&1
  target=${CARGO_TARGET_DIR:-target}
  bin=$(ls -t "$target"/release/deps/micro-* | grep -v '\.d$' | head -n 1)
fi
n=${N:-2100}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
whats=("$@")
[ ${#whats[@]} -eq 0 ] && whats=(canon_1k fingerprint_1k no_layer ours/fresh ours/replay ours/key_reuse_409 idempotent/fresh idempotent/replay axum-idempotent/fresh axum-idempotent/replay)
total() {
  MICRO_ONLY=loop LOOP="$1" N="$2" valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" >/dev/null 2>&1
  callgrind_annotate "$out/cg" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
for what in "${whats[@]}"; do
  a=$(total "$what" "$n")
  b=$(total "$what" 100)
  echo "$what: $(( (a - b) / (n - 100) )) instructions per operation"
done
