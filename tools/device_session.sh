#!/usr/bin/env bash
# On the GPU machine (see ../shared/device/README.md): install the carried vLLM payload once per
# machine, build lk_moe there, then run what follows as a command, logging into $OUT.
#   bash tools/device_session.sh python3 -m pytest -s tests/e2e -k qwen3
# A session that fits the 10-minute runs and the 30-minute budget (learned 2026-11-30): the payload
# costs ~80 s held, install + build ~110 s of the first run; the machine is given back after 30 s
# idle, so have every command ready before the first part goes. Keep results coming back with
# inner `timeout`s shorter than the run's limit (a run killed by the limit loses the tail of its script).
#   1. ... timeout 480 python3 benchmarks/e2e_decode.py --modes hybrid --results $OUT/bench.json --log-dir $OUT --timeout 470
#      (then --modes offload; stock: the issue's reference numbers exist)
#   2. ... e2e bf16 suite on GPU 0 and the quantized suite on GPU 1 at once (nvidia-h200-x2), each with
#      its own --basetemp and `timeout`; then `-k tensor_parallel` (both GPUs)
#   3. bash tools/device_gpu_tests.sh all 60   (tests/gpu alone; no vLLM needed: can run before the payload)
set -uo pipefail
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 LVLLM_USE_SYSTEM_PYTHON=1
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
out="${OUT:-/tmp/lvllm-out}"; mkdir -p "$out"
if [ ! -d /root/site/vllm ]; then
  bash .payload/install.sh > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
  tail -1 "$out/install.log"
fi
source tools/setup_env.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
set +e
"$@" 2>&1 | tee -a "$out/session.log"
rc=${PIPESTATUS[0]}
# vLLM run logs and results of the e2e tests (the checkpoints stay behind)
if [ -d /root/e2e-tmp ]; then
  mkdir -p "$out/e2e"
  find /root/e2e-tmp \( -name '*.log' -o -name '*.json' \) -size -8M | while read -r f; do
    cp "$f" "$out/e2e/$(basename "$(dirname "$f")")-$(basename "$f")"
  done
fi
exit $rc
