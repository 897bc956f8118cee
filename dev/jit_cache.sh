#!/usr/bin/env bash
# The GPU machine's kernel caches from one machine to the next. A fresh machine compiles vLLM's kernels at
# their first use (torch.compile, Triton, TileLang, DeepGEMM): DeepSeek-V4-Flash's first start spent ~300 s
# of a 10-minute run on that (session 24). Save them at the end of a hold, carry them to the next machine.
#   bash dev/jit_cache.sh save "$OUT"   # on the machine: the caches as <=15 MiB parts jit.tgz.NN in $OUT
#                                       # (the device tool brings back 8 files of at most 16 MiB)
#   (here: copy the parts into .jitcache/ (ignored), carry .jitcache with the setup run)
#   bash dev/jit_cache.sh restore       # on the machine (setup does it): unpack .jitcache/jit.tgz.* if carried
set -uo pipefail
dirs="/root/.cache/vllm/torch_compile_cache /root/.triton/cache /root/.tilelang/cache /root/.cache/deep_gemm
/root/.deep_gemm /root/.cache/flashinfer /root/.cache/tvm"
case "${1:-}" in
  save)
    out="${2:?save needs the output folder}"
    present=""
    for d in $dirs; do [ -d "$d" ] && present="$present $d" && du -sh "$d"; done
    [ -n "$present" ] || { echo "[jit] no kernel caches on this machine"; exit 0; }
    tar -czf - $present 2> /dev/null | split -b 15m -d - "$out/jit.tgz."
    n=$(ls "$out"/jit.tgz.* | wc -l)
    echo "[jit] $(du -ch "$out"/jit.tgz.* | tail -1 | cut -f1) in $n parts"
    [ "$n" -le 7 ] || echo "[jit] more than 7 parts: the device tool brings back only 8 files"
    ;;
  restore)
    ls .jitcache/jit.tgz.* > /dev/null 2>&1 || exit 0
    [ -e /root/.jit-restored ] && exit 0
    cat .jitcache/jit.tgz.* | tar -xzf - -C / && touch /root/.jit-restored \
      && echo "[jit] kernel caches restored ($(du -ch .jitcache/jit.tgz.* | tail -1 | cut -f1))"
    ;;
  *) echo "usage: $0 save OUT | restore" >&2; exit 2 ;;
esac
