#!/usr/bin/env bash
# Run the loom models on the production crates compiled with --cfg ibal_loom.
#
#   bash loom-tests/run.sh                          # every model, preemption bound 3
#   LOOM_MAX_PREEMPTIONS=2 bash loom-tests/run.sh   # a smaller bound (CI)
#   bash loom-tests/run.sh destroy_vs               # models whose name matches
#   bash loom-tests/run.sh --mutants                # every mutant must be caught
#   bash loom-tests/run.sh --mutants NAME...        # only these mutants (CI's bounded run)
#
# Mutants (loom-tests/mutants.txt) put back, behind --cfg ibal_mutant="NAME",
# a mistake of the old access layer; the models named for it must fail.
# Exits non-zero if a model fails or a mutant survives. Uses its own target
# dirs so the normal build is not invalidated by the cfg change.
set -euo pipefail
cd "$(dirname "$0")/.."
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
base_flags="--cfg ibal_loom ${RUSTFLAGS:-}"

run_models() { # filter target_dir extra_flags -> prints cargo output, returns its status
    RUSTFLAGS="$base_flags $3" CARGO_TARGET_DIR="$2" \
        cargo test --release -p loom-tests -- --test-threads=1 --nocapture $1 2>&1
}

start=$(date +%s)
if [ "${1:-}" = "--mutants" ]; then
    shift
    only=" $* "
    caught=0; survived=0
    while read -r name filter _; do
        case "$name" in ''|'#'*) continue ;; esac
        if [ -n "${only// /}" ] && [[ "$only" != *" $name "* ]]; then continue; fi
        log=$(mktemp)
        set +e
        timeout 900 bash -c "$(declare -f run_models); base_flags='$base_flags'; run_models '$filter' target/loom-mutant '--cfg ibal_mutant=\"$name\"'" >"$log" 2>&1
        status=$?
        set -e
        if grep -q "^error\(\[E[0-9]*\]\)\?:" "$log" && ! grep -q "Running" "$log"; then
            echo "mutant $name: BUILD FAILED"; cat "$log"; rm -f "$log"; exit 2
        fi
        if [ "$status" -ne 0 ]; then
            why=$(grep -m1 -E "panicked at|deadlock|leak" -A1 "$log" | tail -1 | cut -c1-100)
            echo "mutant $name: caught by $filter (${why:-exit $status})"
            caught=$((caught + 1))
        else
            echo "mutant $name: SURVIVED $filter"
            survived=$((survived + 1))
        fi
        rm -f "$log"
    done < <(grep -v "^#" loom-tests/mutants.txt | sort -s -k1,1)  # one build per mutant name
    echo "loom mutants: ${caught} caught, ${survived} survived at preemption bound ${LOOM_MAX_PREEMPTIONS} in $(( $(date +%s) - start ))s"
    [ "$survived" -eq 0 ]
    exit
fi

log=$(mktemp)
set +e
run_models "${1:-}" "${CARGO_TARGET_DIR:-target/loom}" "" | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
executions=$(grep -Eo 'loom model [a-z_0-9]+: [0-9]+ executions' "$log" | awk '{s+=$4} END {print s+0}')
rm -f "$log"
echo "loom: ${passed} models passed, ${failed} failed, ${executions} executions explored at preemption bound ${LOOM_MAX_PREEMPTIONS} in $(( $(date +%s) - start ))s"
exit "$status"
