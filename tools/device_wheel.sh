#!/usr/bin/env bash
# On the GPU machine (Python 3.12, torch 2.11, vLLM from the payload in /root/site): build the
# release wheel there, install it outside the source tree, and run the e2e suite from a copy of
# tests/ so that vLLM loads the plugin through the wheel's own entry point.
#   bash tools/device_wheel.sh [pytest -k expression]
set -uo pipefail
out="${OUT:-/tmp/lvllm-out}"; mkdir -p "$out/wheel"
if [ ! -d /root/site/vllm ]; then
  bash .payload/install.sh > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
fi
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
PYTHONPATH=/root/site python3 -m pip wheel . --no-build-isolation --no-deps -w "$out/wheel" > "$out/wheel.log" 2>&1 \
  || { tail -30 "$out/wheel.log"; exit 1; }
whl=$(ls "$out"/wheel/lvllm-*.whl) && echo "built $(basename "$whl") ($(du -h "$whl" | cut -f1))"
rm -rf /root/lvllm-wheel && python3 -m pip install -q --no-deps --target /root/lvllm-wheel "$whl" || exit 1
rm -rf /root/wheel-tests && mkdir -p /root/wheel-tests && cp -r tests /root/wheel-tests/
cd /root/wheel-tests || exit 1
export PYTHONPATH=/root/lvllm-wheel:/root/site
python3 -c "import lk_moe, lvllm, importlib.metadata as m; print(lk_moe.__file__, lk_moe.build_info()['cuda_archs'], \
[e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'lvllm'])"
python3 -m pytest -q -s -p no:cacheprovider --basetemp=/root/e2e-wheel tests/e2e ${1:+-k "$1"}
