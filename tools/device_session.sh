#!/usr/bin/env bash
# On the GPU machine (see ../shared/device/README.md): install the carried vLLM payload once per
# machine, build lk_moe there, then run what follows as a command, logging into $OUT.
#   bash tools/device_session.sh python3 -m pytest -s tests/e2e -k qwen3
# A session that fits the 10-minute runs (after the 9 payload-part runs, back to back):
#   1. ... timeout 480 python3 -m pytest -q -s -p no:cacheprovider --basetemp=/root/e2e-tmp tests/e2e \
#          -k "not quantized and not gpt_oss and not tensor_parallel"        (serve, KV, 4 archs x 3)
#   2. ... python3 -m pytest -q -s ... tests/e2e -k "quantized or gpt_oss"; python3 -m pytest -q tests/gpu
#   3. ... python3 benchmarks/e2e_decode.py --modes hybrid --results /root/bench.json --log-dir $OUT
#      then --modes offload, --modes stock (same --results file: the last run prints all ratios)
#   TP=2: the nvidia-h200-x2 machine, pytest tests/e2e -k tensor_parallel
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
