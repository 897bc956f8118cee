#!/usr/bin/env bash
# The GPU machine's kernel caches from one machine to the next. A fresh machine compiles vLLM's kernels at
# their first use (torch.compile, Triton, TileLang, DeepGEMM): DeepSeek-V4-Flash's first start spent ~300 s
# of a 10-minute run on that (session 24). Save them at the end of a hold, carry them to the next machine.
#   bash dev/jit_cache.sh save "$OUT"   # on the machine: the caches as 15 MiB parts jit.tgz.NN in /root/jit-parts,
#                                       # the first four copied to $OUT (a call brings back at most ~64 MiB)
#   bash dev/jit_cache.sh more "$OUT"   # the next four parts, one call each until it says none is left
#   (here: copy the parts into .jitcache/ (ignored) and carry them before setup, at most four a call:
#    [".jitcache/jit.tgz.00", ..., ".jitcache/jit.tgz.03"], then the rest; ignored files stay between calls)
#   bash dev/jit_cache.sh restore       # on the machine (setup does it): unpack .jitcache/jit.tgz.* if carried
set -uo pipefail
dirs="/root/.cache/vllm/torch_compile_cache /root/.triton/cache /root/.tilelang/cache /root/.cache/deep_gemm
/root/.deep_gemm /root/.cache/flashinfer /root/.cache/tvm"
parts=/root/jit-parts
case "${1:-}" in
  save)
    out="${2:?save needs the output folder}"
    present=""
    for d in $dirs; do [ -d "$d" ] && present="$present $d" && du -sh "$d"; done
    [ -n "$present" ] || { echo "[jit] no kernel caches on this machine"; exit 0; }
    rm -rf "$parts" && mkdir -p "$parts"
    tar -czf - $present 2> /dev/null | split -b 15m -d - "$parts/jit.tgz."
    echo "[jit] $(du -ch "$parts"/jit.tgz.* | tail -1 | cut -f1) in $(ls "$parts"/jit.tgz.* | wc -l) parts"
    bash "$0" more "$out"
    ;;
  more)
    out="${2:?more needs the output folder}"
    left=$(ls "$parts"/jit.tgz.* 2> /dev/null | head -4)
    [ -n "$left" ] || { echo "[jit] no part left to bring back"; exit 0; }
    for f in $left; do mv "$f" "$out/"; done
    n=$(ls "$parts" | wc -l)
    echo "[jit] brought back: $(cd "$out" && ls jit.tgz.* | tr '\n' ' ')$([ "$n" = 0 ] && echo "(the last)" || echo "($n left: \`more\`)")"
    ;;
  restore)
    ls .jitcache/jit.tgz.* > /dev/null 2>&1 || exit 0
    [ -e /root/.jit-restored ] && exit 0
    cat .jitcache/jit.tgz.* | tar -xzf - -C / && touch /root/.jit-restored \
      && echo "[jit] kernel caches restored ($(du -ch .jitcache/jit.tgz.* | tail -1 | cut -f1))"
    ;;
  *) echo "usage: $0 save OUT | more OUT | restore" >&2; exit 2 ;;
esac
