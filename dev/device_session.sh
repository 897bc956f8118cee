#!/usr/bin/env bash
# On the GPU machine (see dev/README.md): install the carried vLLM payload once per
# machine, build lk_moe there, then run what follows as a command, logging into $OUT.
#   bash dev/device_session.sh python3 -m pytest -s tests/e2e -k qwen3
# A session that fits the 10-minute runs and the 30-minute budget: the vLLM 0.33.0 payload is 45 parts
# of ~4 s each (~220 s held, session 13) to 17-20 s each (910 s, session 14; dev/README.md); carry .payload/{SHA256,install.sh,VERSION,meta} with the FIRST
# part (carried paths stay on the machine), so a machine lost before the last part costs no extra run
# shape; install + wheel build take ~4 minutes of the first real run (pin1: 479 s with doctor, tests/gpu
# and the serve test). The machine is given back after 30 s idle, so have every command ready before
# the first part goes. Keep results coming back with
# inner `timeout`s shorter than the run's limit (a run killed by the limit loses the tail of its script).
#   1. ... timeout 480 python3 benchmarks/e2e_decode.py --modes hybrid --results $OUT/bench.json --log-dir $OUT --timeout 470
#      (then --modes offload; stock: the issue's reference numbers exist)
#   2. ... e2e bf16 suite on GPU 0 and the quantized suite on GPU 1 at once (nvidia-h200-x2), each with
#      its own --basetemp=/root/e2e-tmp/<suite>, `taskset` half of the cores and a `timeout`;
#      then `-k tensor_parallel` (both GPUs). The 2026-11-30 fourth-session runs are quoted with their
#      commands in docs/results/2026-11-30_h200x2_session4.log (7 runs + payload in 27 minutes).
#   3. bash dev/device_gpu_tests.sh all 60   (tests/gpu alone; no vLLM needed: can run before the payload)
# dev/device_acceptance.sh {decode,baseline,rest} runs that plan in three parts through this script.
set -uo pipefail
# Commands can size their inner `timeout`s from the run's end: $((LVLLM_DEVICE_DEADLINE - $(date +%s)))
export LVLLM_DEVICE_DEADLINE=$(( $(date +%s) + ${LVLLM_DEVICE_LIMIT:-570} ))
export PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 LVLLM_USE_SYSTEM_PYTHON=1
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
out="${OUT:-/tmp/lvllm-out}"; mkdir -p "$out"
# LVLLM_DEVICE_NO_VLLM=1: engine-only runs (benchmarks/moe_layer.py) skip the payload: the machine's own
# torch builds and runs lk_moe, and the run needs no 9 payload parts first.
if [ "${LVLLM_DEVICE_NO_VLLM:-0}" != "1" ] && [ ! -d /root/site/vllm ]; then
  t_install=$(date +%s)
  bash .payload/install.sh > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
  echo "[device] payload installed in $(( $(date +%s) - t_install )) s"
  tail -1 "$out/install.log"
fi
bash dev/jit_cache.sh restore  # a previous machine's kernel caches, where carried in .jitcache/
# LVLLM_DEVICE_WHEEL=1: build the release wheel here (Python 3.12), install it outside the source
# tree and run the command from a copy of tests/, benchmarks/ and commands/ in /root/wheel-run, so
# vLLM loads the plugin through the wheel's own entry point (issue: release). Falls back to the
# in-place build if the wheel cannot be built.
in_place=1
if [ "${LVLLM_DEVICE_WHEEL:-0}" = "1" ]; then
  # The wheel is rebuilt when the sources changed since it was built (a fix carried by the next run would
  # otherwise run the old wheel: session 18 lost a run to that).
  src_stamp=$(find lk_moe lvllm csrc setup.py pyproject.toml CMakeLists.txt -type f \( -name '*.py' -o -name '*.cpp' \
    -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.toml' -o -name '*.txt' \) | sort | xargs sha256sum | sha256sum | cut -c1-16)
  # ... and against the torch it was built with (a bare machine's wheel, built on its own torch, fails to load once
  # the payload's torch is installed: session 23)
  src_stamp="$src_stamp $(PYTHONPATH=/root/site python3 -c 'import torch; print(torch.__version__, torch.__file__)' 2>/dev/null)"
  [ "$(cat /root/lvllm-wheel/.src-stamp 2>/dev/null)" = "$src_stamp" ] || rm -rf /root/lvllm-wheel
  if [ ! -d /root/lvllm-wheel/lvllm ]; then
    mkdir -p "$out/wheel"
    t_wheel=$(date +%s)
    if PYTHONPATH=/root/site python3 -m pip wheel . --no-build-isolation --no-deps -w "$out/wheel" > "$out/wheel.log" 2>&1 \
        && python3 -m pip install -q --no-deps --target /root/lvllm-wheel "$out"/wheel/lvllm-*.whl >> "$out/wheel.log" 2>&1; then
      echo "$src_stamp" > /root/lvllm-wheel/.src-stamp
      echo "[device] built and installed $(basename "$out"/wheel/lvllm-*.whl) ($(du -h "$out"/wheel/lvllm-*.whl | cut -f1)) in $(( $(date +%s) - t_wheel )) s"
    else
      tail -20 "$out/wheel.log"; echo "[device] wheel build failed: falling back to the in-place build"
      rm -rf /root/lvllm-wheel
    fi
  fi
  if [ -d /root/lvllm-wheel/lvllm ]; then
    rm -rf /root/wheel-run && mkdir -p /root/wheel-run && cp -r tests benchmarks commands tools dev /root/wheel-run/
    cd /root/wheel-run || exit 1
    export PYTHONPATH=/root/lvllm-wheel:/root/site
    python3 -c "import lk_moe, lvllm; print('[device] from the wheel:', lk_moe.__file__, lvllm.__version__)"
    in_place=0
  fi
fi
if [ $in_place = 1 ]; then
  source tools/setup_env.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
mkdir -p /root/e2e-tmp  # parent of the e2e runs' --basetemp=/root/e2e-tmp/<suite>
set +e
"$@" 2>&1 | tee -a "$out/session.log"
rc=${PIPESTATUS[0]}
# vLLM run logs and results of the e2e tests (the checkpoints stay behind), and any folders the
# command wrote under $OUT (tests/gpu logs and backtraces), in one archive: the device tool brings
# back at most 8 files.
bundle=$(mktemp -d)
if [ -d /root/e2e-tmp ]; then
  mkdir -p "$bundle/e2e"
  # <basetemp>/<test>/<tag>.json|log only (not the checkpoints' or compile caches' files below them)
  find /root/e2e-tmp -mindepth 3 -maxdepth 3 \( -name '*.log' -o -name '*.json' \) -size -8M | while read -r f; do
    cp "$f" "$bundle/e2e/$(basename "$(dirname "$f")")-$(basename "$f")"
  done
fi
for d in "$out"/*/; do [ -d "$d" ] && mv "$d" "$bundle/"; done
tar -C "$bundle" -czf "$out/details.tar.gz" . && echo "[device] e2e runs and sub-folders bundled in \$OUT/details.tar.gz"
exit $rc
