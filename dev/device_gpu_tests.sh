#!/usr/bin/env bash
# On the GPU machine, without vLLM (tests/gpu need only torch): build lk_moe, run tests/gpu in
# groups; a group still running after its limit gets every thread's native backtrace (cuda-gdb)
# written to $OUT/<group>.bt before it is killed.
#   bash dev/device_gpu_tests.sh          (in groups)
#   bash dev/device_gpu_tests.sh all 90   (one process, 90 s limit)
set -uo pipefail
out="${OUT:-/tmp/lvllm-out}"; mkdir -p "$out"
export LVLLM_USE_SYSTEM_PYTHON=1 PYTHONUNBUFFERED=1
# An lk_moe already importable (the wheel of dev/device_session.sh) is used as it is.
if ! python3 -c "import lk_moe._C" 2>/dev/null; then
  source tools/setup_env.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
set +e
group() {  # name, seconds, pytest args...
  local name=$1 limit=$2; shift 2
  python3 -m pytest -q -s -p no:cacheprovider "$@" > "$out/$name.log" 2>&1 &
  local pid=$! i
  for ((i = 0; i < limit; i++)); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "HUNG after ${limit}s" >> "$out/$name.log"
    timeout 60 cuda-gdb -batch -ex "info threads" -ex "thread apply all bt" -p $pid > "$out/$name.bt" 2>&1
    kill -9 $pid
  fi
  wait $pid; echo "rc=$?" >> "$out/$name.log"
  tail -n 2 "$out/$name.log"
}
if [ "${1:-}" = "all" ]; then group all "${2:-90}" tests/gpu; exit 0; fi
group graph_hostfn 30 tests/gpu/test_cpu_path.py -k "graph_replay and hostfn"
group graph_mailbox 30 tests/gpu/test_cpu_path.py -k "graph_replay and mailbox"
group totals 40 tests/gpu/test_cpu_path.py -k "engine_totals"
group rest 150 tests/gpu -k "not graph_replay and not engine_totals"
