#!/usr/bin/env bash
# The compile_peers.py rows behind benchmarks/results/<gpu>-<date>-compile-peers-*.json, as made on a
# device host with several GPUs: one lane per GPU, each lane running its problems one after the
# other on that GPU and on its share of the CPU cores (so one lane's compiles do not slow another's
# timings), each run under what is left of LIMIT_S. A problem is a name in benchmarks/problems/ or
# a path (a KernelBench file). Needs the project installed (pip install --no-deps
# --no-build-isolation -e .).
# Usage: bash benchmarks/peers_device.sh OUTDIR LIMIT_S LANE...
#   LANE is GPU=problem:policy[:peers][,problem:policy[:peers]...]; peers default compile,max-autotune
# Example (the 2026-11-27 runs, one 4 x H200 call):
#   bash benchmarks/peers_device.sh $OUT 580 0=mingpt_block:fp32,mingpt_block:bf16 \
#     1=hf_llama_decoder_4x2048:bf16,relu_self_attention:fp32 2=hf_llama_decoder_4x2048:fp32 \
#     3=KernelBench/level3/16_DenseNet201.py:fp32:compile
# Environment: MAXC (--max-candidates, default 3), PYTHON (default python3).
set -u
out=$1 limit=$2; shift 2
t0=$SECONDS
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$gpus" -ge 1 ] || gpus=1
per=$(( $(nproc) / gpus )); [ "$per" -ge 1 ] || per=1
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
lane() {
  local g=$1 runs=$2 r prob pol peers left name path
  for r in ${runs//,/ }; do
    IFS=: read -r prob pol peers <<< "$r"
    left=$(( limit - (SECONDS - t0) ))
    [ "$left" -gt 60 ] || { echo "gpu $g: no time left for $r"; continue; }
    name=$(basename "$prob" .py)
    case $prob in */*) path=$prob ;; *) path=benchmarks/problems/$prob.py ;; esac
    CUDA_VISIBLE_DEVICES=$g FACTDB_HOME=/tmp/factdb-peers$g \
      taskset -c $(( g * per ))-$(( (g + 1) * per - 1 )) timeout -k 10 "$left" \
      "${PYTHON:-python3}" benchmarks/compile_peers.py "$path" --policy "$pol" --max-candidates "${MAXC:-3}" \
      --peers "${peers:-compile,max-autotune}" --out "$out/peers-$name-$pol.json" > "$out/peers-$name-$pol.log" 2>&1
    echo "gpu $g: $r rc $? after $(( SECONDS - t0 )) s"
    tail -4 "$out/peers-$name-$pol.log"
  done
}
for l in "$@"; do lane "${l%%=*}" "${l#*=}" & done
wait
echo "total $(( SECONDS - t0 )) s"
