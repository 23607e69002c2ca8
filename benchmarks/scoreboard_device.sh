#!/usr/bin/env bash
# One part of the KernelBench GPU scoreboard in one device call, on every GPU of the host: the
# GPU set (benchmarks/kernelbench_gpu_set.txt) dealt round-robin into one shard per GPU, each
# shard a `factdb bench --kernelbench` of its own on its own GPU and its own share of the CPU
# cores (so one shard's compiles do not slow another's timings), with its own registry. Each
# shard goes on from the JSON a previous part left in CARRY (copied back from OUTDIR; or from a
# merged scoreboard, CARRY/kernelbench-POLICY.json, whose rows every shard skips), for at most
# LIMIT seconds; the JSON is written after every problem, so a part cut short keeps every
# problem it finished. Merge the shards with benchmarks/kernelbench_merge.py.
# Usage: bash benchmarks/scoreboard_device.sh KERNELBENCH_DIR CARRY OUTDIR LIMIT_S POLICY [bench options...]
# Environment: GPUS="2 3" runs shards on those GPUs alone (default: every GPU), leaving the others
# to other work; each shard keeps the cores of its GPU's share and is named by its GPU index.
# PROBLEMS="L1-24,L3-28,..." deals that list instead of the whole GPU set.
# Needs the project installed (pip install --no-deps --no-build-isolation -e .).
set -u
kb=$1 carry=$2 out=$3 limit=$4 policy=$5; shift 5
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
py=${PYTHON:-python3}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$gpus" -ge 1 ] || gpus=1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
use=(${GPUS:-$(seq 0 $(( gpus - 1 )))})
# Each GPU's shard gets whole physical cores (a core's hyperthreads together, where the host
# has them), so one shard's timing never shares a core with another shard's nvcc. (The device
# hosts so far have one thread per core, where this is the same as dealing logical CPUs.)
mapfile -t phys < <(for c in /sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list; do cat "$c"; done \
  | sort -u -t, -k1,1n)
[ "${#phys[@]}" -ge 1 ] || mapfile -t phys < <(seq 0 $(( $(nproc) - 1 )))
per=$(( ${#phys[@]} / gpus )); [ "$per" -ge 1 ] || per=1
cpus_of() {  # the logical CPUs of GPU $1's share of physical cores, as taskset -c takes them
  printf '%s\n' "${phys[@]:$(( $1 * per )):$per}" | paste -sd, -
}
echo "${#use[@]} shard(s) on GPU(s) ${use[*]}, $per physical core(s) each (of ${#phys[@]}; $(nproc) logical CPUs)"
if [ -n "${PROBLEMS:-}" ]; then ids=$(echo "$PROBLEMS" | tr ', ' '\n\n' | awk 'NF')
else ids=$(grep -v '^#' benchmarks/kernelbench_gpu_set.txt | awk 'NF {print $1}'); fi
for i in "${!use[@]}"; do
  s=${use[$i]}
  mine=$(echo "$ids" | awk -v s="$i" -v n="${#use[@]}" '(NR - 1) % n == s' | paste -sd, -)
  [ -n "$mine" ] || continue
  json="$out/kernelbench-$policy-shard$s.json"
  resume=()
  if [ -f "$carry/kernelbench-$policy-shard$s.json" ]; then    # this shard's part, from the last call
    cp "$carry/kernelbench-$policy-shard$s.json" "$json"; resume=(--resume "$json")
  elif [ -f "$carry/kernelbench-$policy.json" ]; then          # a merged scoreboard: each shard skips its rows
    cp "$carry/kernelbench-$policy.json" "$json"; resume=(--resume "$json")
  fi
  CUDA_VISIBLE_DEVICES=$s FACTDB_HOME="/tmp/factdb-home$s" timeout -k 15 "$limit" \
    taskset -c "$(cpus_of "$s")" "$py" -m fact_db.cli bench --kernelbench "$kb" \
    --problems "$mine" --policy "$policy" --db "/tmp/registry-shard$s.duckdb" --out "$json" "${resume[@]}" "$@" \
    > "$out/scoreboard-$policy-shard$s.log" 2>&1 &
done
wait
for s in "${use[@]}"; do
  [ -f "$out/scoreboard-$policy-shard$s.log" ] || continue
  echo "=== shard $s"; grep -v '^\[realize\]' "$out/scoreboard-$policy-shard$s.log" | tail -40
done
du -sh "$out"
