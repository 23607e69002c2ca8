#!/usr/bin/env bash
# One part of the KernelBench GPU scoreboard in one device call: goes on from the scoreboard
# JSON and registry a previous part left in CARRY (copied back from the device's OUTDIR), for
# at most LIMIT seconds; the JSON is written after every problem, so a part cut short keeps
# every problem it finished. Results, registry and log go to OUTDIR.
# Usage: bash benchmarks/scoreboard_device.sh KERNELBENCH_DIR CARRY OUTDIR LIMIT_S POLICY [bench options...]
# Needs the project installed (pip install --no-deps --no-build-isolation -e .).
set -u
kb=$1 carry=$2 out=$3 limit=$4 policy=$5; shift 5
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
json="$out/kernelbench-$policy.json"
[ -f "$carry/registry.duckdb" ] && cp "$carry/registry.duckdb" "$out/registry.duckdb"
resume=()
if [ -f "$carry/kernelbench-$policy.json" ]; then
  cp "$carry/kernelbench-$policy.json" "$json"; resume=(--resume "$json")
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
timeout -k 15 "$limit" "${PYTHON:-python3}" -m fact_db.cli bench --kernelbench "$kb" --problems benchmarks/kernelbench_gpu_set.txt \
  --policy "$policy" --db "$out/registry.duckdb" --out "$json" "${resume[@]}" "$@" 2>&1 | tee "$out/scoreboard-$policy.log" | grep -v '^\[realize\]'
echo "rc ${PIPESTATUS[0]}"
