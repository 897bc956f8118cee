#!/usr/bin/env bash
# Runs ON the GPU machine from the project root (as .payload/install.sh, written by dev/make_site_payload.sh),
# once every part is in /root/stage and .payload/{SHA256,VERSION,meta} came along: checks the parts and
# unpacks the pre-installed site folder into /root/site (PYTHONPATH; the machine's torch 2.11 stays).
# PAYLOAD_STAGE / PAYLOAD_SITE move them, for a dry run elsewhere.
set -euo pipefail
pay="$(pwd)/.payload"
meta="$pay/meta"
site="${PAYLOAD_SITE:-/root/site}"
cd "${PAYLOAD_STAGE:-/root/stage}"
echo "payload: vLLM $(cat "$pay/VERSION"), pre-installed site ($(ls p?? | wc -l) parts here)"
if [ "$(cat p?? | sha256sum | cut -c1-64)" != "$(cat "$pay/SHA256")" ]; then
  echo "payload checksum mismatch: a part is missing or damaged"
  sha256sum -c --quiet "$meta/PARTS.sha256" 2>&1 | head -20 || true
  exit 1
fi
rm -rf "$site" && mkdir -p "$site"
if command -v zstd > /dev/null; then
  cat p?? | zstd -dc --long=27 | tar x -C "$site"
else
  # no zstd tool: the carried zstandard wheel decodes (its C extension cannot be imported from the zip)
  dec="$(mktemp -d)"
  python3 -m zipfile -e "$(ls "$meta"/zstandard-*.whl | head -1)" "$dec"
  cat p?? | PYTHONPATH="$dec" python3 -c "
import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=1 << 27).copy_stream(sys.stdin.buffer, sys.stdout.buffer)" \
    | tar x -C "$site"
  rm -rf "$dec"
fi
echo "installed: export PYTHONPATH=$site VLLM_USE_FLASHINFER_SAMPLER=0"
# What vLLM's metadata asks for against what Python finds (the site folder first): reports, never stops.
if [ -f "$meta/check-payload.py" ]; then
  PYTHONPATH="$site" python3 "$meta/check-payload.py" --installed --site "$site" --list "$meta/wheels.txt" || true
fi
PYTHONPATH="$site" python3 -c "import vllm, torch, torch.cuda.nccl, importlib.util as u; print('vllm', vllm.__version__, \
'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), \
'cudnn', torch.backends.cudnn.version(), 'cutlass', u.find_spec('cutlass') is not None)"
