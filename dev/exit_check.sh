#!/usr/bin/env bash
# On the GPU machine: N vLLM runs (tests/e2e/generate.py --implicit-exit: the engine left to vLLM's
# exit-time finalizers, as in a plain LLM() script) of one tiny checkpoint at once, switch on (and M
# with it off), each must exit 0. A run that aborts after its results (as the gpt-oss front
# ends did on 2026-12-01 before the plugin deferred its hooks) shows here with its faulthandler dump.
#   bash dev/exit_check.sh gpt_oss 6 2        # arch, runs with the switch on, runs with it off
set -uo pipefail
arch="${1:-gpt_oss}" on="${2:-6}" off="${3:-2}"
out="${OUT:-/tmp/lvllm-out}/exit_check"; mkdir -p "$out"
ckpt=/root/exit-check-$arch
[ -f "$ckpt/model.safetensors" ] || python3 tools/make_tiny_checkpoint.py --arch "$arch" --out "$ckpt" > /dev/null || exit 1
pids=() tags=()
for ((i = 1; i <= on + off; i++)); do
  sw=$((i <= on ? 1 : 0)); tag="run$i-switch$sw"
  LVLLM_MOE_NUMA_ENABLED=$sw LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0 LK_THREADS=2 LK_THREAD_BINDING=NONE LK_SPIN_US=50 \
    PYTHONFAULTHANDLER=1 VLLM_CACHE_ROOT=/root/exit-check-cache-$i timeout 300 \
    python3 tests/e2e/generate.py --model "$ckpt" --out "$out/$tag.json" --kv-bytes $((2 << 30)) --implicit-exit > "$out/$tag.log" 2>&1 &
  pids+=($!) tags+=("$tag")
done
bad=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"; rc=$?
  echo "[exit-check] $arch ${tags[$k]}: rc=$rc"
  if [ $rc -ne 0 ]; then bad=$((bad + 1)); grep -h -A3 "terminate called\|Fatal Python\|Traceback" "$out/${tags[$k]}.log" | head -8; fi
done
echo "[exit-check] $arch: $bad of $((on + off)) runs did not exit 0"
[ $bad -eq 0 ]
