#!/usr/bin/env bash
# The end-to-end runs behind benchmarks/results/<gpu>-<date>-e2e*.json, as made on the device
# machine: one `factdb bench` per problem and policy, each with its own wall-clock limit, so a
# slow compile in one cannot cost the others their rows. Usage: bash benchmarks/e2e_device.sh OUTDIR RUN...
# where RUN is problem:policy:max_candidates:peers:limit_s, e.g. mingpt_block:fp32:6:compile:200
set -u
out=$1; shift
for run in "$@"; do
  IFS=: read -r prob pol cand peers limit <<<"$run"
  echo "=== $prob $pol (max-candidates $cand, peers $peers, limit ${limit}s) $(date +%T)"
  timeout -k 10 "$limit" python3 -m fact_db.cli bench "benchmarks/problems/$prob.py" --policy "$pol" \
    --max-candidates "$cand" --peers "$peers" --results "$out/e2e-$prob-$pol.json" 2>&1 | grep -v '^\s*$' | tail -25
  echo "rc ${PIPESTATUS[0]}"
done
