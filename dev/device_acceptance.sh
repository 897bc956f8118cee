#!/usr/bin/env bash
# The acceptance runs of the GPU-facing issues on nvidia-h200-x2, in three parts that each fit one
# 10-minute device run (the plan that fitted the 30-minute budget on 2026-11-30, fourth session:
# payload ~70 s, then these back to back). Each part splits the machine into two 16-core halves
# (GPU0 + cores 0-15, GPU1 + cores 16-31; a half is the single-H200 machine) so two jobs run at once.
#   bash dev/device_acceptance.sh decode    # hybrid decode benchmark + tests/gpu + serve | bf16 e2e suite
#   bash dev/device_acceptance.sh baseline  # offload + stock benchmarks | quantized e2e
#   bash dev/device_acceptance.sh formats   # tests/gpu, per-format decode, TP=2 + KV-cache e2e | quantized e2e
#   bash dev/device_acceptance.sh rest      # TP=2 and KV-cache e2e, CPU-path signals, per-format decode, demo, doctor
#   bash dev/device_acceptance.sh e2e2      # bf16 e2e suite + serve | quantized e2e suite (every e2e test but TP=2)
#   bash dev/device_acceptance.sh final     # TP=2 e2e (both GPUs), then clean exits of vLLM runs | the CPU tests as final1
#   (setup, e2e2, final: the whole e2e suite on one code state in ~22 minutes of device time)
# On the single-H200 machine (16 cores, one GPU: no TP=2), the same suites one after another:
#   bash dev/device_acceptance.sh setup     # (with the last payload part) install vLLM, build + install the wheel
#   bash dev/device_acceptance.sh gpu1      # tests/gpu, per-format decode (every format, 5 rounds, schedule
#                                             # units/guided A/B), serve, doctor, demo
#   bash dev/device_acceptance.sh quant1    # quantized e2e suite (every format, CPU and GPU prefill)
#   bash dev/device_acceptance.sh bf16_1    # KV-cache e2e, the bf16 e2e suite, then clean exits of gpt-oss LLM() runs
#                                             # (LVLLM_EXIT_CHECK=0: not those)
#   bash dev/device_acceptance.sh final1    # the CPU tests ($cpu_dirs) but the checkpoint-loading file (AMX tier, GPU visible)
#   bash dev/device_acceptance.sh final1b   # the CPU tests' checkpoint-loading file, its two halves at once (~9 min alone)
#   bash dev/device_acceptance.sh decode1   # fp4 CPU tests, then per-format M=1 decode (all cores and serve's
#                                             # threads; fp4: q15 / bf16 activations A/B)
#   bash dev/device_acceptance.sh probe1    # where 4-bit M=1 decode time goes: hot weights (8 experts, one
#                                             # copy: the kernels' ceiling) at 1 and 16 threads, cold thread scan
#   bash dev/device_acceptance.sh probe2    # the 4-bit tile's instructions in core cycles (dev/decode_ops_micro.cpp)
#   bash dev/device_acceptance.sh harden1   # engine-hardening + format tests (every tier), prefill vs bf16
#   bash dev/device_acceptance.sh prefill1  # prefill vs bf16 on the DeepSeek-V3 shape
#   bash dev/device_acceptance.sh prefill2  # every format vs bf16 on the amx tier, Qwen3-30B-A3B and DeepSeek-V3 shapes
#   bash dev/device_acceptance.sh mxfp8     # the mxfp8 format's tests on every tier, its decode vs fp8_block
# The vLLM 0.33.0 pin on the single H200 (after the payload parts; see dev/README.md):
#   bash dev/device_acceptance.sh pin1      # install, wheel, versions, doctor, vllm serve e2e, tests/gpu
#   bash dev/device_acceptance.sh pin2      # install, wheel, versions, doctor, vllm serve e2e, the demo
#                                             # (pin1 without tests/gpu)
#   bash dev/device_acceptance.sh pin3      # install, wheel, versions, doctor, then the vllm serve e2e test (4 engine
#                                             # threads) and the bf16 e2e suite side by side (KV-cache test aside)
#   bash dev/device_acceptance.sh hybrid1   # e2e_decode hybrid and hybrid-v1 (V2 vs V1 model runner; decode vs
#                                             # the bandwidth bound, TTFT, startup, GPU weights; HYBRID_MODES=...)
#   bash dev/device_acceptance.sh v4flash   # e2e_decode on DeepSeek-V4-Flash's shape (MXFP4 experts), V4_LAYERS (20) of 43
#                                             # layers, V4_MODES (hybrid; then V4_MODES=stock as a second part; the
#                                             # CPU-placement A/B: V4_MODES=hybrid,hybrid-excl,hybrid-bsync,hybrid-t12)
#   bash dev/device_acceptance.sh bench24   # issue 24's benchmark: e2e_decode on a family's release shape in its release
#                                             # format over dummy weights (BENCH_ARCH qwen3_next, BENCH_QUANT fp8, BENCH_LAYERS
#                                             # all, BENCH_MODES hybrid,stock; BENCH_ARGS more options)
#   bash dev/device_acceptance.sh archprobe # e2e_decode on a new architecture's config (dummy weights; PROBE_ARCH, default
#                                             # deepseek_v41), hybrid then stock: does it start, decode, where are its tables
#   bash dev/device_acceptance.sh spec1     # e2e_decode hybrid vs n-gram speculative decoding (SPEC_MODES, default
#                                             # hybrid,hybrid-ng3; then hybrid-ng1,hybrid-ng2,hybrid-ng4 as a second part)
#   bash dev/device_acceptance.sh base1     # e2e_decode offload + stock (carry hybrid1's bench.json as
#                                             # benchmarks/results-carry.json: one table with the ratios)
#   bash dev/device_acceptance.sh amx1      # every format's engine tests on every tier, AMX included (wheel)
#   bash dev/device_acceptance.sh serve1    # default `vllm serve` startup by phase, hybrid vs stock, gpt-oss-120b
#                                             # shape: lk_moe counters on /metrics right after startup, SIGINT exit
#   bash dev/device_acceptance.sh serve2    # Qwen3-30B-A3B shape: hybrid under `vllm bench serve` (c=1,8,32),
#                                             # disconnects, /metrics, SIGINT exit; then stock's startup
#   bash dev/device_acceptance.sh serve3    # the same load against stock vLLM with --cpu-offload-gb (the baseline);
#                                             # SERVE_MODES=hybrid as a second part: both in one table; SERVE_ARGS more
#                                             # serve_load.py options
#   bash dev/device_acceptance.sh soak1     # starts benchmarks/serve_soak.py detached (setsid: it outlives the run;
#                                             # SOAK_MIN minutes, default 20; SOAK_ARGS more of its options, e.g. the
#                                             # 24 GB cap of the expert cache and auto-fit issues: SOAK_MIN=10 SOAK_ARGS="--streams 4
#                                             # --serve-arg=--gpu-memory-utilization=0.17 --lvllm-env
#                                             # LVLLM_AUTO_FIT=1 --long-prompt-words 1230"), then follows it
#   bash dev/device_acceptance.sh soakwait  # follows it again (call back to back, within 30 s); when it has ended:
#                                             # its report, samples.jsonl, soak.png and the server log into $OUT
#   bash dev/device_acceptance.sh cache1    # the GPU expert cache: tests/gpu/test_expert_cache.py, then its e2e
#                                             # tests (switch off vs cache on, bf16 and fp8)
#   bash dev/device_acceptance.sh cache2    # benchmarks/expert_cache.py on the Qwen3-30B-A3B shape (CACHE_SHAPE, CACHE_TRACES,
#                                             # CACHE_BUDGETS, CACHE_MODES): tok/s vs budget per trace, the PNG into
#                                             # $OUT; each mode's vLLM start takes 100-200 s there, so run
#                                             # CACHE_MODES=off and CACHE_MODES=cache as two parts (results add up
#                                             # in /root/expert_cache-<shape>.json on the machine)
#   bash dev/device_acceptance.sh rotate1   # M=1 decode of one layer rotating over 4 GiB vs ~50 GB of packed copies
#                                             # (random routing over all the expert memory vs a few GiB of it)
#   bash dev/device_acceptance.sh moeoracle # the MoE-layer oracle on tiny DeepSeek-V4.1 alone (tests/e2e/moe_capture.py,
#                                             # eager): stock, CPU prefill and streamed GPU prefill record their MoE layers'
#                                             # inputs, routing and outputs; tests/e2e/moe_oracle.py holds each to fp32
#                                             # experts (arch1 runs the same recordings for its verdicts); ~300 s or more
#   bash dev/device_acceptance.sh arch1     # the newer architectures' e2e suite (tests/e2e/test_architectures.py:
#                                             # Qwen3-Next, GLM-5, MiniMax-M2, Qwen3.5-MoE, DeepSeek-V4, Kimi-K2.5),
#                                             # switch on vs off (LVLLM_E2E_ARCHS=a,b: only these)
#   then bf16_1 and quant1 as above
#   (decode1, harden1, prefill1 and probe1/2 need no vLLM: run them without the payload, as the first
#   command of a machine)
#   (the CPU tests as one run did not fit 10 minutes there: ~560 of ~735 tests on 2026-12-01; final1 took 212 s
#   and the loading file alone 630 s on 2026-12-01, ninth session)
# Runs through dev/device_session.sh from the wheel (LVLLM_DEVICE_WHEEL=1); results land in $OUT.
# Carry the previous part's $OUT/bench.json as benchmarks/results-carry.json (untracked) to get the
# hybrid-vs-offload ratios printed in one table.
set -uo pipefail
part="${1:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LVLLM_DEVICE_WHEEL=1 LVLLM_DEVICE_LIMIT="${LVLLM_DEVICE_LIMIT:-560}"
half0="taskset -c 0-15" half1="taskset -c 16-31"
left='$((LVLLM_DEVICE_DEADLINE - $(date +%s) - 15))'  # seconds to the part's deadline, less copy-back time
e2e="python3 -m pytest -q -s -p no:cacheprovider"
e2e_lines="grep -h '^[.sFE]*\[e2e\]\|passed\|FAILED'"  # an e2e log's verdict lines (behind any progress marks)
# the tests that need no GPU (tests/gpu and tests/e2e are the GPU machine's own parts)
cpu_dirs="tests/engine tests/gpu_layout tests/plugin tests/e2e_harness"
loads=tests/plugin/test_plugin_loads_checkpoints.py  # half of the CPU tests' time: final1b runs it alone
# SIGINT at the part's deadline: pytest stops and still prints its failures and slowest tests
cpu_tests='timeout -s INT -k 10 $((LVLLM_DEVICE_DEADLINE - $(date +%s) - 30)) python3 -m pytest -q -rfE --tb=short --durations=15 -p no:cacheprovider'
# a CPU test log's verdict: failures, the summary line, the slowest tests
verdict="verdict() { grep -h '^FAILED\|^ERROR\|passed\|failed\|KeyboardInterrupt' \"\$1\" | tail -8; \
grep -q ' passed\| failed\| error' \"\$1\" || tail -5 \"\$1\"; grep -A16 'slowest 15' \"\$1\"; }"
# the pin parts' first checks: versions, the hooks, doctor; then (pin1, pin2) the vllm serve e2e test
pin_versions="python3 -c 'import vllm, torch, lvllm.plugin as p; print(\"[pin] vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda); print(\"[pin] hooks:\", p.check_hook_targets())'
timeout 120 python3 -m lvllm doctor > \$OUT/doctor.log 2>&1; echo \"doctor rc \$?\"; grep -h 'vllm\|torch\|plugin\|hook\|FAIL' \$OUT/doctor.log | head -12"
pin_checks="$pin_versions
timeout 240 $e2e --basetemp=/root/e2e-tmp/serve tests/e2e/test_serve.py > \$OUT/e2e_serve.log 2>&1
$e2e_lines \$OUT/e2e_serve.log"
# the soak's progress until it ends or the run's deadline; its files so far into $OUT on every follow (session 20
# lost a machine between two follows, and the soak's samples and server log with it)
soak_follow='while kill -0 $(cat /root/soak/pid) 2> /dev/null && [ $(date +%s) -lt $((LVLLM_DEVICE_DEADLINE - 25)) ]; do sleep 5; done
tail -4 /root/soak/soak.log; kill -0 $(cat /root/soak/pid) 2> /dev/null || tail -12 /root/soak/soak.log
grep -h "LVLLM_AUTO_FIT\|LVLLM_GPU_EXPERT_CACHE=auto\|lk_moe: hybrid\|KV cache\|Traceback\|Error" /root/soak/serve.log 2>/dev/null | cut -c1-400 | head -16
cp /root/soak/samples.jsonl /root/soak/soak.log /root/soak/serve.log $OUT/ 2>/dev/null; cp /root/soak/soak.png $OUT/ 2>/dev/null || true'
case "$part" in
  decode)
    body="(CUDA_VISIBLE_DEVICES=0 $half0 timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 120)) python3 benchmarks/e2e_decode.py \
--modes hybrid --results \$OUT/bench.json --log-dir \$OUT --timeout 330 > \$OUT/bench_hybrid.log 2>&1
OUT=\$OUT/gpu LK_THREADS=14 CUDA_VISIBLE_DEVICES=0 $half0 bash dev/device_gpu_tests.sh all 240
CUDA_VISIBLE_DEVICES=0 $half0 timeout $left $e2e --basetemp=/root/e2e-tmp/serve tests/e2e/test_serve.py > \$OUT/e2e_serve.log 2>&1) &
CUDA_VISIBLE_DEVICES=1 $half1 timeout $left $e2e --basetemp=/root/e2e-tmp/bf16 tests/e2e/test_switch.py \
-k 'not quantized and not gpt_oss and not tensor_parallel and not kv_cache' > \$OUT/e2e_bf16.log 2>&1
wait; grep -v '^ *\$' \$OUT/bench_hybrid.log | tail -12; tail -2 \$OUT/gpu/all.log
$e2e_lines \$OUT/e2e_serve.log \$OUT/e2e_bf16.log" ;;
  baseline)
    body="cp benchmarks/results-carry.json \$OUT/bench.json 2>/dev/null
(CUDA_VISIBLE_DEVICES=0 $half0 timeout $left python3 benchmarks/e2e_decode.py --modes offload,stock \
--reps 2 --decode-tokens 64 --results \$OUT/bench.json --log-dir \$OUT --timeout 400 > \$OUT/bench_baseline.log 2>&1) &
CUDA_VISIBLE_DEVICES=1 $half1 timeout $left $e2e --basetemp=/root/e2e-tmp/quant \
tests/e2e -k 'quantized or gpt_oss' > \$OUT/e2e_quant.log 2>&1
wait; $e2e_lines \$OUT/e2e_quant.log
grep -v '^ *\$' \$OUT/bench_baseline.log | tail -14" ;;
  formats)
    body="(OUT=\$OUT/gpu LK_THREADS=14 CUDA_VISIBLE_DEVICES=0 $half0 bash dev/device_gpu_tests.sh all 240
timeout 120 bash -c 'for f in bf16 fp8_block wna16_int4 nvfp4 mxfp4; do $half0 python3 benchmarks/moe_layer.py \
--format \$f --shapes qwen3-30b-a3b --tokens 1,4 --threads all; done; for f in wna16_int4 nvfp4 mxfp4; do \
echo \"## LK_INT8_ACT=0\"; LK_INT8_ACT=0 $half0 python3 benchmarks/moe_layer.py --format \$f --shapes qwen3-30b-a3b \
--tokens 1 --threads all; done' > \$OUT/moe_layer.log 2>&1
timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 20)) $half0 $e2e --basetemp=/root/e2e-tmp/tp2 tests/e2e \
-k 'tensor_parallel or kv_cache' > \$OUT/e2e_tp2.log 2>&1) &
LVLLM_E2E_PARALLEL=14 CUDA_VISIBLE_DEVICES=1 $half1 timeout $left $e2e --basetemp=/root/e2e-tmp/quant \
tests/e2e -k 'quantized or gpt_oss' > \$OUT/e2e_quant.log 2>&1
wait; $e2e_lines \$OUT/e2e_tp2.log \$OUT/e2e_quant.log; tail -2 \$OUT/gpu/all.log
grep -h 'read bandwidth\|^## \|^ *[14] \|phases' \$OUT/moe_layer.log" ;;
  rest)
    body="timeout 400 $e2e --basetemp=/root/e2e-tmp/tp2 tests/e2e -k 'tensor_parallel or kv_cache' > \$OUT/e2e_tp2.log 2>&1
$e2e_lines \$OUT/e2e_tp2.log
timeout 100 bash -c 'for f in bf16 fp8_block wna16_int4 nvfp4 mxfp4; do $half0 python3 benchmarks/moe_layer.py \
--format \$f --shapes qwen3-30b-a3b --tokens 1,4 --threads all; done' > \$OUT/moe_layer.log 2>&1
(CUDA_VISIBLE_DEVICES=0 $half0 timeout 120 bash commands/demo_tiny_serve_tp1.sh > \$OUT/demo.log 2>&1) &
LK_THREADS=14 CUDA_VISIBLE_DEVICES=1 $half1 timeout 75 python3 benchmarks/cpu_path.py --shapes qwen3-30b-a3b \
--tokens 1,4 --reps 20 > \$OUT/cpu_path.log 2>&1
python3 tools/make_tiny_checkpoint.py --arch qwen3_moe --out /root/tiny-qwen > /dev/null
python3 tools/make_tiny_checkpoint.py --arch deepseek_v3 --size big --out /root/dsv3big > /dev/null
(python3 -m lvllm doctor --model /root/tiny-qwen; python3 -m lvllm doctor --model /root/dsv3big --tp 2) > \$OUT/doctor.log 2>&1
cuobjdump --list-elf /root/lvllm-wheel/lk_moe/_lk_cuda.so > \$OUT/cuobjdump.txt 2>&1
wait; cat \$OUT/cpu_path.log; grep -h 'read bandwidth\|^ *[14] ' \$OUT/moe_layer.log; tail -3 \$OUT/demo.log" ;;
  e2e2)
    body="(CUDA_VISIBLE_DEVICES=0 $half0 timeout $left $e2e --basetemp=/root/e2e-tmp/bf16 tests/e2e/test_switch.py \
-k 'not quantized and not gpt_oss and not tensor_parallel' > \$OUT/e2e_bf16.log 2>&1
CUDA_VISIBLE_DEVICES=0 $half0 timeout $left $e2e --basetemp=/root/e2e-tmp/serve tests/e2e/test_serve.py > \$OUT/e2e_serve.log 2>&1) &
LVLLM_E2E_PARALLEL=14 CUDA_VISIBLE_DEVICES=1 $half1 timeout $left $e2e --basetemp=/root/e2e-tmp/quant \
tests/e2e -k 'quantized or gpt_oss' > \$OUT/e2e_quant.log 2>&1
wait; $e2e_lines \$OUT/e2e_bf16.log \$OUT/e2e_serve.log \$OUT/e2e_quant.log" ;;
  final)
    body="$verdict; timeout 330 $e2e --basetemp=/root/e2e-tmp/tp2 tests/e2e -k tensor_parallel > \$OUT/e2e_tp2.log 2>&1
$e2e_lines \$OUT/e2e_tp2.log
(CUDA_VISIBLE_DEVICES=0 $half0 timeout 200 bash dev/exit_check.sh gpt_oss 6 2 > \$OUT/exit_check.log 2>&1) &
$half1 $cpu_tests $cpu_dirs --ignore=$loads \
> \$OUT/cpu_amx.log 2>&1
wait; grep -h 'exit-check\]' \$OUT/exit_check.log; verdict \$OUT/cpu_amx.log" ;;
  final1)
    body="$verdict; $cpu_tests $cpu_dirs --ignore=$loads > \$OUT/cpu_amx.log 2>&1
verdict \$OUT/cpu_amx.log" ;;
  final1b)  # its two test functions side by side (each case is a vLLM process of 1-2 engine threads)
    body="$verdict; ($cpu_tests $loads -k loaded_experts > \$OUT/cpu_loads_a.log 2>&1) &
$cpu_tests $loads -k tensor_parallel > \$OUT/cpu_loads_b.log 2>&1; wait
verdict \$OUT/cpu_loads_a.log; verdict \$OUT/cpu_loads_b.log" ;;
  setup)
    body="true" ;;
  pin1)
    body="$pin_checks
OUT=\$OUT/gpu LK_THREADS=15 bash dev/device_gpu_tests.sh all 200" ;;
  pin2)
    body="$pin_checks
timeout $left bash commands/demo_tiny_serve_tp1.sh > \$OUT/demo.log 2>&1; echo \"demo rc \$?\"; tail -6 \$OUT/demo.log" ;;
  pin3)  # under 0.33.0 each vLLM start takes ~2 min on that machine: the serve test and the bf16 suite
         # (one wave of 13 runs) overlap instead of following each other
    body="$pin_versions
(LK_THREADS=4 timeout 300 $e2e --basetemp=/root/e2e-tmp/serve tests/e2e/test_serve.py > \$OUT/e2e_serve.log 2>&1) &
LVLLM_E2E_PARALLEL=13 timeout $left $e2e --basetemp=/root/e2e-tmp/bf16 tests/e2e/test_switch.py \
-k 'not quantized and not gpt_oss and not tensor_parallel and not kv_cache' > \$OUT/e2e_bf16.log 2>&1; wait
$e2e_lines \$OUT/e2e_serve.log; $e2e_lines \$OUT/e2e_bf16.log" ;;
  hybrid1)
    body="timeout $left python3 benchmarks/e2e_decode.py --modes \${HYBRID_MODES:-hybrid,hybrid-v1} --results \$OUT/bench.json \
--log-dir \$OUT --timeout 300 > \$OUT/bench_hybrid.log 2>&1; grep -v '^ *\$' \$OUT/bench_hybrid.log | tail -16" ;;
  v4flash)  # DeepSeek-V4-Flash's shape as released (MXFP4 experts, FP8 projections, dummy weights), V4_LAYERS of
            # its 43 layers (all 43 hold 147 GB of experts: more than the host's RAM); one mode a run (V4_MODES),
            # results adding up in /root/bench_v4.json on the machine; vLLM's JIT kernel warmup and DeepGEMM warmup off in
            # every mode (with them, the hybrid start did not finish in 536 s on 2026-12-04: 208 TileLang compile keys after
            # 285 s of start; in session 23: 858 of 2541 DeepGEMM shapes after 348 s); V4_MODES=hybrid,hybrid-mt1: MTP
            # drafts from the release's MTP layer (dummy weights: the cost side of issue 27 on V4's shape). The k = 1..4
            # cost table: V4_LAYERS=10 V4_MODES=hybrid-ru,hybrid-mt1-ru, then hybrid-mt2-ru,hybrid-mt3-ru, then
            # hybrid-mt4-ru (a step's cost is per layer; a mode with drafts writes the checkpoint with its MTP layer, and
            # the results file keeps one checkpoint's rows, so the plain mode goes with the first drafts)
    body="timeout $left python3 benchmarks/e2e_decode.py --arch deepseek_v4 --quant mxfp4 --layers \${V4_LAYERS:-20} --no-jit-warmup \
--modes \${V4_MODES:-hybrid} \${V4_ARGS:-} --results /root/bench_v4.json --log-dir \$OUT --timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 40)) \
> \$OUT/bench_v4.log 2>&1; cp /root/bench_v4.json \$OUT/ 2>/dev/null; grep -v '^ *\$' \$OUT/bench_v4.log | tail -16" ;;
  bench24)  # Qwen3-Next-80B-A3B FP8 by default (48 layers: 72 GiB of experts in host RAM; stock: ~80 GB on the GPU, an
            # H200's); MiniMax-M2 FP8: BENCH_ARCH=minimax_m2 BENCH_LAYERS=24 (84 GiB of its 218); Qwen3.5:
            # BENCH_ARCH=qwen3_5_moe; GLM-5.3-Flash FP8: BENCH_ARCH=glm5_next BENCH_LAYERS=11 (8 MoE layers, 58 GB:
            # stock finds no room for its KV cache on an H100, BENCH_LAYERS=9 there); Qwen3.8-Flash-Next (not yet run
            # big): BENCH_ARCH=qwen4_exp BENCH_QUANT=bf16 BENCH_LAYERS=12 BENCH_ARGS="--ple-rows 2000000" (48 GB of
            # experts; the release's 20M-row FP8 PLE table needs ~95 GiB of host RAM for vLLM's dummy fill); results adding up in
            # /root/bench_24.json, one checkpoint's at a time; three reps (one stalled @4 rep in two spoilt
            # session 36's median); DeepGEMM's warmup of the FP8 projections off in both modes (cold, it took the
            # whole run's share in session 35: 1949 shapes at 3-6 a second)
    body="timeout $left python3 benchmarks/e2e_decode.py --arch \${BENCH_ARCH:-qwen3_next} --quant \${BENCH_QUANT:-fp8} \
--layers \${BENCH_LAYERS:-0} --no-jit-warmup --modes \${BENCH_MODES:-hybrid,stock} --reps 3 --decode-tokens 64 \${BENCH_ARGS:-} \
--results /root/bench_24.json --log-dir \$OUT --total-timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 40)) \
> \$OUT/bench_24.log 2>&1; cp /root/bench_24.json \$OUT/ 2>/dev/null; grep -v '^ *\$' \$OUT/bench_24.log | tail -24" ;;
  archprobe)  # a new architecture's first start through vLLM with dummy weights (e2e_decode, short): PROBE_ARCH
              # (deepseek_v41: its own 0.33 runner, kv-sharing compressed attention, Engram tables in pinned host RAM),
              # PROBE_SIZE (big: V4-Flash's backbone for V4.1), PROBE_LAYERS (10), PROBE_QUANT (mxfp4), PROBE_MODES
              # (hybrid,stock), each mode its share of the run; kimi_k3: PROBE_ARCH=kimi_k3 PROBE_SIZE=tiny
              # PROBE_LAYERS=0 PROBE_QUANT=bf16; MiniMax-M3 the same with PROBE_ARCH=minimax_m3; Kimi-K3's release
              # shape in its compressed-tensors MXFP4: PROBE_ARCH=kimi_k3 PROBE_SIZE=big PROBE_LAYERS=6
              # PROBE_QUANT=mxfp4_ct (5 MoE layers: 73 GiB of experts in host RAM); Qwen3.8-Flash-Next:
              # PROBE_ARCH=qwen4_exp PROBE_SIZE=tiny PROBE_LAYERS=0 PROBE_QUANT=bf16 (big: its FP8 PLE table's dummy
              # fill takes a full-size fp16 temporary, ~95 GiB: too much for the machine's RAM); V4.1's DSpark drafts
              # (3 stages, a block of 4): PROBE_MODES=hybrid,hybrid-ds4
    body="timeout $left python3 benchmarks/e2e_decode.py --arch \${PROBE_ARCH:-deepseek_v41} --quant \${PROBE_QUANT:-mxfp4} \
--size \${PROBE_SIZE:-big} --layers \${PROBE_LAYERS:-10} --no-jit-warmup --modes \${PROBE_MODES:-hybrid,stock} --reps 1 \
--decode-tokens 32 --results \$OUT/bench_probe.json --log-dir \$OUT \
--total-timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 60)) \
> \$OUT/bench_probe.log 2>&1
grep -v '^ *\$' \$OUT/bench_probe.log | tail -20; grep -h 'Engram\|engram\|Traceback\|Error' \$OUT/e2e_decode-*.log | cut -c1-300 | head -20" ;;
  spec1)  # speculative decoding through vLLM on the Qwen3-30B-A3B shape (issue 27): plain hybrid against
          # hybrid-ng<k> (n-gram) and hybrid-eg<k> (EAGLE-3, a random-weight draft: the cost side) on prompts that
          # repeat; SPEC_MODES, results adding up in /root/bench_spec.json: on a fresh machine each mode compiles
          # cold (the speculative config is in vLLM's compile key) and takes ~230 s with its measurement, ~120 s warm
          # (H200, 2026-12-05): two cold modes or four warm ones fit a run; the cost side with every token routed
          # independently (dummy weights route a request's tokens alike): SPEC_MODES=hybrid-ru,hybrid-eg1-ru,...
    body="timeout $left python3 benchmarks/e2e_decode.py --modes \${SPEC_MODES:-hybrid,hybrid-ng3} --prompt-period 16 \
--reps 2 --decode-tokens 64 --results /root/bench_spec.json --log-dir \$OUT \
--total-timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 40)) > \$OUT/bench_spec.log 2>&1
cp /root/bench_spec.json \$OUT/ 2>/dev/null; grep -v '^ *\$' \$OUT/bench_spec.log | tail -24" ;;
  base1)
    body="cp benchmarks/results-carry.json \$OUT/bench.json 2>/dev/null
timeout $left python3 benchmarks/e2e_decode.py --modes offload,stock --reps 2 --decode-tokens 64 \
--results \$OUT/bench.json --log-dir \$OUT --timeout 400 > \$OUT/bench_baseline.log 2>&1
grep -v '^ *\$' \$OUT/bench_baseline.log | tail -16" ;;
  gpu1)
    body="OUT=\$OUT/gpu LK_THREADS=15 bash dev/device_gpu_tests.sh all 200
timeout 200 bash -c 'for f in bf16 fp8_block fp8_channel int8_channel wna16_int4 nvfp4 mxfp4; do \
python3 benchmarks/moe_layer.py --format \$f --shapes qwen3-30b-a3b --tokens 1,4 --threads all --reps 15 --rounds 5 \
--decode-schedule units,guided; done' > \$OUT/moe_layer.log 2>&1
timeout 110 $e2e --basetemp=/root/e2e-tmp/serve tests/e2e/test_serve.py > \$OUT/e2e_serve.log 2>&1
timeout 150 bash -c 'python3 tools/make_tiny_checkpoint.py --arch qwen3_moe --out /root/tiny-qwen \
&& python3 tools/make_tiny_checkpoint.py --arch deepseek_v3 --size big --out /root/dsv3big && python3 -m lvllm doctor \
&& python3 -m lvllm doctor --model /root/tiny-qwen && python3 -m lvllm doctor --model /root/dsv3big --tp 2' > \$OUT/doctor.log 2>&1
echo \"doctor: rc \$?\"; timeout $left bash commands/demo_tiny_serve_tp1.sh > \$OUT/demo.log 2>&1
tail -2 \$OUT/gpu/all.log; grep -h 'read bandwidth\|^## \|^ *[14] \|phases' \$OUT/moe_layer.log
$e2e_lines \$OUT/e2e_serve.log; tail -4 \$OUT/demo.log" ;;
  decode1)  # per-format M=1 decode (every core and serve's thread count; fp4: q15 / bf16 activations A/B),
            # after the fp4 CPU tests on the AMX tier; DECODE_SHAPES (qwen3-30b-a3b) and DECODE_FORMATS (all)
            # narrow it, e.g. DECODE_SHAPES=deepseek-v4-flash DECODE_FORMATS=mxfp4
    export LVLLM_DEVICE_NO_VLLM=1
    body="timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/test_fp4_q15.py tests/engine/test_mxfp4.py \
tests/engine/test_nvfp4.py > \$OUT/fp4_tests.log 2>&1; tail -3 \$OUT/fp4_tests.log
timeout $left bash -c 'for r in 1 2; do for f in \${DECODE_FORMATS:-mxfp4 nvfp4 wna16_int4 fp8_block fp8_channel int8_channel bf16}; do \
a=; case \$f in *fp4) a=\"--fp4-acts q15,bf16\";; esac; python3 benchmarks/moe_layer.py --format \$f \
--shapes \${DECODE_SHAPES:-qwen3-30b-a3b} --tokens 1 --threads all,serve --reps 15 --rounds 6 \$a; done; done' > \$OUT/moe_layer.log 2>&1
grep -h 'read bandwidth\|^## \|^ *1 \|phases' \$OUT/moe_layer.log" ;;
  harden1)  # the engine-hardening tests and every format's tests on every tier of the AMX host, then CPU
             # prefill of every format against bf16 (benchmarks/prefill_formats.py) on its two fastest tiers
    export LVLLM_DEVICE_NO_VLLM=1
    body="$verdict; $cpu_tests tests/engine/test_nan_activations.py tests/engine/test_submit_lifetime.py \
tests/engine/test_validation.py tests/engine/test_chunk_splits.py tests/engine/test_fp8_block.py tests/engine/test_channel_formats.py \
tests/engine/test_wna16.py tests/engine/test_mxfp4.py tests/engine/test_nvfp4.py tests/engine/test_fp4_q15.py \
tests/engine/test_mxfp8.py tests/engine/test_moe_layer.py > \$OUT/cpu_tests.log 2>&1; verdict \$OUT/cpu_tests.log
timeout $left python3 benchmarks/prefill_formats.py --tokens 64,256,1024 --isa avx512_bf16,amx --rounds 3 \
> \$OUT/prefill.log 2>&1; cat \$OUT/prefill.log" ;;
  prefill1)  # CPU prefill of every format against bf16 on the DeepSeek-V3 shape (16 experts), two fastest tiers
    export LVLLM_DEVICE_NO_VLLM=1
    body="timeout $left python3 benchmarks/prefill_formats.py --shape deepseek-v3 --tokens 256,1024 \
--isa avx512_bf16,amx --rounds 3 > \$OUT/prefill_dsv3.log 2>&1; cat \$OUT/prefill_dsv3.log" ;;
  prefill2)  # issue 29's table on the AMX host: every format against bf16 on the amx tier, both shapes, M 64-1024
    export LVLLM_DEVICE_NO_VLLM=1
    body="for s in qwen3-30b-a3b deepseek-v3; do timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 10)) python3 \
benchmarks/prefill_formats.py --shape \$s --tokens 64,256,1024 --isa amx --rounds 3 > \$OUT/prefill_\$s.log 2>&1
tail -28 \$OUT/prefill_\$s.log; done" ;;
  prefill29)  # issue 29 on the AMX host: every quantized format's prefill tests on every tier (the int8-activation
              # tests left out: their kernels are not the panels'), then every format against bf16 on the AVX-512 tiers,
              # M 64-1024, Qwen3-30B-A3B's and DeepSeek-V3's shapes. Tables in $OUT/prefill_*.log, ratios on stdout
    export LVLLM_DEVICE_NO_VLLM=1
    body="$verdict; $cpu_tests -k 'not int8' tests/engine/test_formats.py tests/engine/test_fp8_block.py \
tests/engine/test_channel_formats.py tests/engine/test_wna16.py tests/engine/test_mxfp4.py tests/engine/test_nvfp4.py \
tests/engine/test_mxfp8.py > \$OUT/cpu_tests.log 2>&1; verdict \$OUT/cpu_tests.log
for s in qwen3-30b-a3b deepseek-v3; do timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 10)) python3 benchmarks/prefill_formats.py \
--shape \$s --tokens 64,256,1024 --isa avx512,avx512_bf16,amx --rounds 3 > \$OUT/prefill_\$s.log 2>&1
echo \"== \$s\"; grep -E '^## tier|^ +(64|256|1024) ' \$OUT/prefill_\$s.log | grep -v ' bf16 ' \
| awk '/^##/{print; next} {printf \"%s %s %s | \", \$1, \$2, \$4} END{print \"\"}'; done" ;;
  mxfp8)  # the mxfp8 format (MiniMax-M3's MXFP8 release) on every tier of the AMX host (the dev VM has AVX2 only):
          # its engine tests, then decode against fp8_block on the host's best tier, then prefill against bf16 and
          # fp8_block on the AVX-512 tiers (its exact bf16 panels)
    export LVLLM_DEVICE_NO_VLLM=1
    body="$verdict; $cpu_tests tests/engine/test_mxfp8.py tests/engine/test_formats.py -k mxfp8 > \$OUT/mxfp8_tests.log 2>&1
verdict \$OUT/mxfp8_tests.log
for f in fp8_block mxfp8; do timeout 120 python3 benchmarks/moe_layer.py --format \$f --shapes qwen3-30b-a3b --tokens 1,4,64 \
--threads all --reps 15 --rounds 2 2>&1 | grep -E '^##|read bandwidth|^ +[0-9]+ '; done
timeout 150 python3 benchmarks/prefill_formats.py --shape qwen3-30b-a3b --tokens 64,256,1024 --isa amx,avx512_bf16,avx512 \
--formats bf16,fp8_block,mxfp8 --rounds 3 2>&1 | grep -v '^ *\$'" ;;
  probe1)  # 4-bit decode: compute ceiling (hot) and per-thread scaling (cold) against bf16 and int8
    export LVLLM_DEVICE_NO_VLLM=1
    body="timeout $left bash -c 'for f in mxfp4 nvfp4 wna16_int4 int8_channel bf16; do python3 benchmarks/moe_layer.py \
--format \$f --shapes qwen3-30b-a3b --tokens 1,4 --threads 1,8,16 --reps 30 --max-experts 8 --max-copies 1 \
--rotate-bytes 0; done
for f in mxfp4 bf16 int8_channel; do python3 benchmarks/moe_layer.py --format \$f --shapes qwen3-30b-a3b \
--tokens 1 --threads 4,8,12,16 --reps 15 --rounds 3; done' > \$OUT/moe_layer.log 2>&1
grep -h 'read bandwidth\|^## \|^ *[14] \|phases' \$OUT/moe_layer.log" ;;
  probe2)  # the 4-bit decode tile's building blocks in core cycles (L1-resident), three times, then hot layers
    export LVLLM_DEVICE_NO_VLLM=1
    body="g++ -O2 -march=native -o /tmp/decode_ops_micro dev/decode_ops_micro.cpp && for i in 1 2 3; do \
/tmp/decode_ops_micro; done
timeout $left bash -c 'for r in 1 2; do for f in mxfp4 wna16_int4; do python3 benchmarks/moe_layer.py \
--format \$f --shapes qwen3-30b-a3b --tokens 1 --threads 1 --reps 30 --max-experts 8 --max-copies 1 \
--rotate-bytes 0; done; done' > \$OUT/moe_layer.log 2>&1
grep -h '^## \|^ *1 \|phases' \$OUT/moe_layer.log" ;;
  amx1)  # every format's engine tests on every tier of the AMX host, from the wheel (after pin1)
    body="$verdict; $cpu_tests tests/engine/test_fp8_block.py tests/engine/test_channel_formats.py tests/engine/test_wna16.py \
tests/engine/test_mxfp4.py tests/engine/test_nvfp4.py tests/engine/test_fp4_q15.py tests/engine/test_moe_layer.py \
tests/engine/test_formats.py > \$OUT/cpu_tests.log 2>&1; verdict \$OUT/cpu_tests.log" ;;
  serve1)
    body="python3 benchmarks/serve_load.py --shape gpt-oss-120b --modes hybrid,stock --startup-only \
--results \$OUT/serve.json --log-dir \$OUT/serve > \$OUT/serve_load.log 2>&1; cat \$OUT/serve_load.log" ;;
  serve2)
    body="cp benchmarks/results-carry.json \$OUT/serve.json 2>/dev/null
bash -c 'python3 benchmarks/serve_load.py --shape qwen3-30b-a3b --modes hybrid --prompts-per-conc 1 \
--results \$OUT/serve.json --log-dir \$OUT/serve && python3 benchmarks/serve_load.py --shape qwen3-30b-a3b --modes stock --startup-only \
--results \$OUT/serve.json --log-dir \$OUT/serve' > \$OUT/serve_load.log 2>&1; cat \$OUT/serve_load.log
timeout $left python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cpu_path.py -k 'auto_signal or engine_totals' 2>&1 | tail -3" ;;
  serve3)  # SERVE_MODES (offload; then hybrid as a second part: one table, the results adding up in /root/serve.json);
           # SERVE_ARGS more options: the offload server starts in 230-310 s, so one part fits c=1 and the disconnects,
           # the next SERVE_ARGS="--concurrency 8,32 --disconnects 0" (session 41: c=32 still ran at the deadline)
    body="cp -n benchmarks/results-carry.json /root/serve.json 2>/dev/null
python3 benchmarks/serve_load.py --shape qwen3-30b-a3b --modes \${SERVE_MODES:-offload} --prompts-per-conc 1 \${SERVE_ARGS:-} \
--results /root/serve.json --log-dir \$OUT/serve > \$OUT/serve_load.log 2>&1; cp /root/serve.json \$OUT/; cat \$OUT/serve_load.log" ;;
  soak1)
    body="mkdir -p /root/soak; setsid nohup python3 benchmarks/serve_soak.py --minutes \${SOAK_MIN:-20} \${SOAK_ARGS:-} --out /root/soak \
> /root/soak/soak.log 2>&1 < /dev/null & echo \$! > /root/soak/pid; $soak_follow" ;;
  soakwait)
    body="$soak_follow" ;;
  cache1)
    body="$verdict; timeout 240 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider tests/gpu/test_expert_cache.py \
> \$OUT/gpu_cache.log 2>&1; verdict \$OUT/gpu_cache.log
timeout $left $e2e --basetemp=/root/e2e-tmp/cache tests/e2e/test_switch.py -k expert_cache > \$OUT/e2e_cache.log 2>&1
$e2e_lines \$OUT/e2e_cache.log" ;;
  cache2)
    body="timeout $left python3 benchmarks/expert_cache.py --shape \${CACHE_SHAPE:-qwen3-30b-a3b} --out \$OUT/cache_bench --traces \${CACHE_TRACES:-router,uniform,lru67,lru80,shift67} \
--budgets \${CACHE_BUDGETS:-0,5,10,25,50} --modes \${CACHE_MODES:-off,cache} --results /root/expert_cache-\${CACHE_SHAPE:-qwen3-30b-a3b}.json \
--timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 60)) > \$OUT/expert_cache.log 2>&1; cp \$OUT/cache_bench/expert_cache.png /root/expert_cache-*.json \$OUT/ 2>/dev/null
grep -v '^ *\$' \$OUT/expert_cache.log | grep -v '^  \[' | tail -40" ;;
  rotate1)  # M=1 decode of one Qwen3-30B-A3B layer rotating over 4 GiB vs ~50 GB of packed copies, random routing:
    # whether routing spread over all the expert memory reads slower than the read-bandwidth probe (page walks)
    # (moe_layer.py prints the huge pages behind its copies: the suspect is 4 KiB pages over tens of GiB)
    body="cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
for r in 4e9 5e10; do timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 20)) python3 benchmarks/moe_layer.py --shapes qwen3-30b-a3b \
--tokens 1 --threads all --reps 60 --rotate-bytes \$r --max-copies 48 > \$OUT/rotate_\$r.log 2>&1
grep -h 'read bandwidth\|^## \|^ *1 \|huge pages' \$OUT/rotate_\$r.log; done" ;;
  arch1)
    body="timeout $left $e2e --basetemp=/root/e2e-tmp/archs tests/e2e/test_architectures.py > \$OUT/e2e_archs.log 2>&1
$e2e_lines \$OUT/e2e_archs.log" ;;
  moeoracle)  # the recordings in a sub-folder: bundled into details.tar.gz (the tool returns only so many files)
    body="mkdir -p \$OUT/captures
python3 tools/make_tiny_checkpoint.py --arch deepseek_v41 --out /root/v41 > \$OUT/ckpt.log 2>&1 || tail -3 \$OUT/ckpt.log
(LVLLM_MOE_NUMA_ENABLED=0 timeout $left python3 tests/e2e/moe_capture.py --model /root/v41 --kv-bytes 2147483648 --out \$OUT/captures/v41-off.pt > \$OUT/capture-off.log 2>&1) &
(LVLLM_MOE_NUMA_ENABLED=1 LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=128 timeout $left python3 tests/e2e/moe_capture.py --model /root/v41 --kv-bytes 2147483648 --out \$OUT/captures/v41-gpu.pt \
> \$OUT/capture-gpu.log 2>&1) &
LVLLM_MOE_NUMA_ENABLED=1 LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0 timeout $left python3 tests/e2e/moe_capture.py --model /root/v41 --kv-bytes 2147483648 --out \$OUT/captures/v41-cpu.pt > \$OUT/capture-cpu.log 2>&1
wait; grep -h 'moe_capture\]\|Error\|lk_moe: hybrid' \$OUT/capture-*.log | cut -c1-300
python3 -m tests.e2e.moe_oracle --arch deepseek_v41 --model /root/v41 \$OUT/captures/v41-off.pt \$OUT/captures/v41-cpu.pt \$OUT/captures/v41-gpu.pt" ;;
  quant1)
    body="LVLLM_E2E_PARALLEL=14 timeout $left $e2e --basetemp=/root/e2e-tmp/quant tests/e2e -k 'quantized or gpt_oss' \
> \$OUT/e2e_quant.log 2>&1; $e2e_lines \$OUT/e2e_quant.log" ;;
  bf16_1)
    body="timeout $left $e2e --basetemp=/root/e2e-tmp/bf16 tests/e2e/test_switch.py \
-k 'not quantized and not gpt_oss and not tensor_parallel' > \$OUT/e2e_bf16.log 2>&1
$e2e_lines \$OUT/e2e_bf16.log
if [ \"\${LVLLM_EXIT_CHECK:-1}\" = 1 ]; then timeout \$((LVLLM_DEVICE_DEADLINE - \$(date +%s) - 20)) \
bash dev/exit_check.sh gpt_oss 6 2 > \$OUT/exit_check.log 2>&1; grep -h 'exit-check\]' \$OUT/exit_check.log; fi" ;;
  *)
    sed -n "2,/^set /{/^#/p}" "${BASH_SOURCE[0]}"; exit 2 ;;
esac
exec bash "$here/device_session.sh" bash -c "$body"
