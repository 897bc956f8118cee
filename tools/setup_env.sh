#!/usr/bin/env bash
# Sets up what the project needs and builds the extension in place; meant to be sourced:
#   source tools/setup_env.sh
# - Python venv kept OUTSIDE the clone as a cache: $LVLLM_VENV, default
#   ~/.cache/lvllm/venv-py<major.minor>; (re)installed when requirements/*.txt change.
# - LVLLM_USE_SYSTEM_PYTHON=1 skips the venv and uses python3 as it is (e.g. the GPU machine,
#   whose own torch is 2.11: run it on the carried payload, see dev/device_session.sh).
# - Builds lk_moe._C in place (build/ and lk_moe/_C*.so are git-ignored).
set -euo pipefail
_lk_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_lk_py="${PYTHON:-python3}"

if [ "${LVLLM_USE_SYSTEM_PYTHON:-0}" != "1" ]; then
  _lk_ver="$("$_lk_py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  _lk_venv="${LVLLM_VENV:-$HOME/.cache/lvllm/venv-py$_lk_ver}"
  _lk_stamp="$(cat "$_lk_root"/requirements/cpu.txt "$_lk_root"/requirements/build.txt "$_lk_root"/requirements/test.txt | sha256sum | cut -c1-16)"
  if [ ! -x "$_lk_venv/bin/python" ] || [ "$(cat "$_lk_venv/.lvllm-stamp" 2>/dev/null)" != "$_lk_stamp" ]; then
    echo "[setup] preparing venv $_lk_venv (torch 2.14.0 is a ~3 GB download the first time)" >&2
    "$_lk_py" -m venv "$_lk_venv"
    "$_lk_venv/bin/python" -m pip install -q --upgrade pip >&2
    "$_lk_venv/bin/python" -m pip install -q -r "$_lk_root/requirements/cpu.txt" \
      -r "$_lk_root/requirements/build.txt" -r "$_lk_root/requirements/test.txt" >&2
    echo "$_lk_stamp" > "$_lk_venv/.lvllm-stamp"
  fi
  export PATH="$_lk_venv/bin:$PATH"
  _lk_py="$_lk_venv/bin/python"
fi
export LVLLM_PYTHON="$_lk_py"
# vLLM finds plugins through installed package metadata: give the source tree an entry point
# (what `pip install` of the wheel registers), so vLLM loads lvllm.plugin from here.
_lk_meta="$_lk_root/build/dev-metadata"
mkdir -p "$_lk_meta/lvllm-0.0.0.dev0.dist-info"
printf 'Metadata-Version: 2.1\nName: lvllm\nVersion: 0.0.0.dev0\n' > "$_lk_meta/lvllm-0.0.0.dev0.dist-info/METADATA"
printf '[vllm.general_plugins]\nlvllm = lvllm.plugin:register\n' > "$_lk_meta/lvllm-0.0.0.dev0.dist-info/entry_points.txt"
export PYTHONPATH="$_lk_root:$_lk_meta${PYTHONPATH:+:$PYTHONPATH}"

echo "[setup] building lk_moe._C ($("$_lk_py" -c 'import torch; print("torch", torch.__version__)'))" >&2
(cd "$_lk_root" && MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$_lk_py" setup.py -q build_ext --inplace >&2)
