#!/usr/bin/env bash
# Turns the workplace's wheel payload (../shared/device/make-vllm-payload.sh 0.33.0, which writes .payload/
# with the wheels as one tar in parts) into a pre-installed one: the wheels are installed HERE into a site
# folder for CPython 3.12 (the GPU machine's), then tarred and zstd-compressed into parts. On the GPU
# machine dev/install_site_payload.sh (carried as .payload/install.sh) only unpacks it: no pip run there
# (that took ~4 minutes of device time in session 14), and fewer parts to carry (zstd -10 over the
# unpacked files beats the wheels' per-file deflate on torch, vLLM and triton).
#   bash dev/make_site_payload.sh [WHEEL_PAYLOAD_DIR]     (default .payload; the result replaces .payload/)
# SITE_EXTRA_WHEELS=DIR adds that folder's wheels to the lean list's: tilelang 0.1.12 + z3-solver 4.15.4.0
# (vLLM 0.33.0's pins; the lean list leaves them out) run DeepSeek-V4's mHC kernels, which vLLM imports
# unconditionally on CUDA for that model (session 20: "tilelang is required for mhc").
# Needs a CPython 3.12 (PY312, else python3.12 or pyenv's 3.12.x) and zstd here.
set -euo pipefail
root="$(git rev-parse --show-toplevel)"
src="$(cd "${1:-$root/.payload}" && pwd)"
out="$root/.payload"
work="${SITE_PAYLOAD_WORK:-/tmp/lk-site-payload}"
part=62914560          # 60 MiB, as the wheel payload's parts
first=$((52 * 1048576)) # p00 travels with the metadata (the zstandard wheel: ~5.3 MiB) and the tree
py="${PY312:-}"
if [ -z "$py" ]; then
  if command -v python3.12 > /dev/null && python3.12 -V > /dev/null 2>&1; then py=python3.12
  else
    v=$(ls "$HOME/.pyenv/versions" 2>/dev/null | grep '^3\.12\.' | tail -1 || true)
    [ -n "$v" ] || { echo "no CPython 3.12 here: set PY312" >&2; exit 1; }
    py="$HOME/.pyenv/versions/$v/bin/python3.12"
  fi
fi
command -v zstd > /dev/null || { echo "zstd is needed here (apt install zstd)" >&2; exit 1; }
[ -f "$src/SHA256" ] && ls "$src"/p?? > /dev/null 2>&1 || { echo "$src: no wheel payload (p?? + SHA256)" >&2; exit 1; }
[ "$(cat "$src"/p?? | sha256sum | cut -c1-64)" = "$(cat "$src/SHA256")" ] || { echo "$src: checksum mismatch" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work/wheels" "$work/meta"
cat "$src"/p?? | tar x -C "$work/wheels"
if [ -n "${SITE_EXTRA_WHEELS:-}" ]; then
  cp "$SITE_EXTRA_WHEELS"/*.whl "$work/wheels/"
  echo "added $(ls "$SITE_EXTRA_WHEELS"/*.whl | xargs -n1 basename | tr '\n' ' ')"
fi
cp "$src/VERSION" "$work/VERSION"
cp -r "$src/meta/." "$work/meta/"
echo "installing $(ls "$work/wheels" | wc -l) wheels with $("$py" -V) into $work/site"
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$work"/wheels/*.whl 2>&1 \
  | grep -v -i warning || true
# Console scripts name this machine's interpreter: point them at the GPU machine's python3.
for f in "$work"/site/bin/*; do
  head -c 2 "$f" | grep -q '#!' && sed -i '1s|^#!.*python[0-9.]*$|#!/usr/bin/env python3|' "$f"
done
# PYTHONPATH does not read a folder's .pth files, and nvidia-cutlass-dsl reaches `cutlass` only through
# one: this sitecustomize makes them count, then hands over to the machine's own sitecustomize, if any.
cat > "$work/site/sitecustomize.py" <<'PY'
# From dev/make_site_payload.sh: read this folder's .pth files (PYTHONPATH entries skip them), then run
# the next sitecustomize found further down sys.path. Delete this file to go back to plain PYTHONPATH.
import importlib.machinery
import importlib.util
import os
import site
import sys

_this_dir = os.path.dirname(os.path.abspath(__file__))
site.addsitedir(_this_dir)
for _entry in list(sys.path):
    if not _entry or os.path.abspath(_entry) == _this_dir:
        continue
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [_entry])
    if _spec is not None:
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
PY
# The GPU machine may lack the zstd tool: the zstandard module's wheel is the fallback decoder.
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$work/meta" zstandard 2>&1 | grep -v -i warning || true
ls "$work"/meta/zstandard-*.whl > /dev/null

echo "compressing $(du -sh "$work/site" | cut -f1) (zstd -10, 2 threads: several minutes)"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$work/site" -cf - . | zstd -q -T0 -10 --long=27 -o "$work/site.tar.zst"
bytes=$(stat -c %s "$work/site.tar.zst")

rm -rf "$out" && mkdir -p "$out/meta"
sha256sum "$work/site.tar.zst" | cut -c1-64 > "$out/SHA256"
head -c "$first" "$work/site.tar.zst" > "$out/p00"
tail -c +$((first + 1)) "$work/site.tar.zst" | split -b "$part" -d -a 2 --numeric-suffixes=1 - "$out/p"
cp "$work/VERSION" "$out/VERSION"
cp -r "$work/meta/." "$out/meta/"
echo "site-zstd" > "$out/meta/FORMAT"
(cd "$out" && sha256sum p?? > meta/PARTS.sha256)
cp "$root/dev/install_site_payload.sh" "$out/install.sh"
grep -qx '/.payload/' "$root/.git/info/exclude" 2>/dev/null || echo '/.payload/' >> "$root/.git/info/exclude"
rm -rf "$work/wheels"
echo "payload: vLLM $(cat "$out/VERSION"), pre-installed, $((bytes / 1048576)) MiB in $(ls "$out"/p?? | wc -l) parts" \
  "(sha256 $(cut -c1-8 "$out/SHA256")...); carry .payload/{SHA256,install.sh,VERSION,meta} with p00"
