#!/usr/bin/env bash
# On the GPU machine (see ../shared/device/README.md): install the carried vLLM payload once per
# machine, build lk_moe there, then run what follows as a command, logging into $OUT.
#   bash tools/device_session.sh python3 -m pytest -s tests/e2e -k qwen3
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
