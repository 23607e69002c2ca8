#!/usr/bin/env bash
# Every benchmark problem through `factdb bench` on one GPU machine, within a short device
# slot: the candidates of all problems are built first, four problems at a time
# (`realize --compile-only`, four nvcc each), then one `bench` process verifies and times
# them one problem after another (the compiles it asks for are cache hits), so no timing
# shares the GPU or the CPU with a build.
# Usage: bash benchmarks/e2e_sweep.sh OUTDIR POLICY MAX_CANDIDATES PEERS LIMIT_S [PROBLEM...]
set -u
out=$1 pol=$2 cand=$3 peers=$4 limit=$5; shift 5
probs=("$@")
[ ${#probs[@]} -gt 0 ] || probs=(benchmarks/problems/*.py)
echo "=== prebuild ${#probs[@]} problems ($pol, max-candidates $cand) $(date +%T)"
printf '%s\n' "${probs[@]}" | xargs -P 4 -I{} sh -c \
  "python3 -m fact_db.cli realize {} --policy $pol --max-candidates $cand --compile-only --jobs 4 >/dev/null 2>&1 || echo 'prebuild failed: {}'"
echo "=== bench $(date +%T)"
timeout -k 10 "$limit" python3 -m fact_db.cli bench "${probs[@]}" --policy "$pol" --max-candidates "$cand" \
  --peers "$peers" --results "$out/e2e-all-$pol.json" 2>&1 | grep -E '^(==|   )' | tail -60
echo "rc ${PIPESTATUS[0]} $(date +%T)"
