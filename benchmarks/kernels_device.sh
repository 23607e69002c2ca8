#!/usr/bin/env bash
# The kernel checks that have not run on a GPU yet (attention, norm and conv families), in one
# device call, each step under its own wall-clock limit so one slow compile cannot cost the
# others their results. Results JSON and logs go to OUTDIR (on the device tool: $OUT).
# Usage: bash benchmarks/kernels_device.sh OUTDIR [STEP...]; steps: fmha-fp32tc fmha-ws fmha-ncu attention norm tests conv conv-tests
# LIMIT_S=N caps every step's limit at N seconds (to share a device call with other work).
# Needs the project installed (pip install --no-deps --no-build-isolation -e .) and the wheels
# of ../shared/gpu-host/wheels.sh on PYTHONPATH.
set -u
out=$1; shift
steps=${*:-fmha-fp32tc attention norm tests}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
run() {  # name limit_s command...
  local name=$1 limit=$2; shift 2
  if [ -n "${LIMIT_S:-}" ] && [ "$LIMIT_S" -lt "$limit" ]; then limit=$LIMIT_S; fi
  echo "=== $name (limit ${limit}s) $(date +%T)"
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  echo "rc $? ($name)"; tail -15 "$out/$name.log"
}
for s in $steps; do
  case $s in
    fmha-fp32tc) run fmha-fp32tc 170 python3 benchmarks/fmha_fp32tc_check.py --quick --out "$out/fmha-fp32tc.json" ;;
    fmha-ws)     run fmha-ws 200 python3 benchmarks/fmha_fp32tc_check.py --quick --families fp32wg --ws \
                   --out "$out/fmha-ws.json" ;;   # fmha_fp32wg's producer configs, with and without turns
    fmha-ncu)    # where fmha_fp32wg's warps wait, by instruction: 64-key tiles with one K/V stage,
                 # with and without turns (minGPT's shape)
                 for cfg in 128x64:smemsplit:ws:kv1:pp 128x64:smemsplit:ws:kv1; do
                   run "ncu-${cfg//:/-}" 150 python3 benchmarks/ncu_profile.py attention --shape 128x8x512x96 \
                     --config "$cfg" --promote 32 --source --name "fmha-${cfg//:/-}" --out "$out/ncu-${cfg//:/-}.json"
                 done ;;
    attention)   run attention 200 python3 benchmarks/attention_realize.py --quick --out "$out/attention.json" ;;
    norm)        run norm 120 python3 benchmarks/norm_realize.py --quick --out "$out/norm.json" ;;
    tests)       run gpu-tests 300 python3 -m pytest -q -x tests/test_norm_gpu.py tests/test_attention_fp32tc_gpu.py \
                   tests/test_attention_gpu.py ;;
    conv)        run conv 470 python3 benchmarks/conv_realize.py --quick --out "$out/conv.json" ;;
    conv-tests)  run conv-tests 470 python3 -m pytest -q -s tests/test_conv_gpu.py ;;
    *) echo "unknown step $s (fmha-fp32tc fmha-ws fmha-ncu attention norm tests conv conv-tests)"; exit 2 ;;
  esac
done
