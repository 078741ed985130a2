#!/usr/bin/env bash
# Run every loom model on the production crates compiled with --cfg ibal_loom.
#
#   bash loom-tests/run.sh                 # all models, preemption bound 3
#   LOOM_MAX_PREEMPTIONS=2 bash loom-tests/run.sh   # a smaller bound (CI)
#   bash loom-tests/run.sh resolve_vs      # only models whose name matches
#
# Exits non-zero if any model fails. Uses its own target dir so the normal
# build is not invalidated by the cfg change.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg ibal_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
filter="${1:-}"
start=$(date +%s)
log=$(mktemp)
set +e
cargo test --release -p loom-tests -- --test-threads=1 --nocapture $filter 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
rm -f "$log"
echo "loom: ${passed} models passed, ${failed} failed at preemption bound ${LOOM_MAX_PREEMPTIONS} in $(( $(date +%s) - start ))s"
exit "$status"
