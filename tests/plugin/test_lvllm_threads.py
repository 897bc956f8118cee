"""Engine threads per vLLM rank: disjoint CPU shares, cores left to the rank's GPU and callback threads."""

import pytest

from lvllm.threads import plan_threads, rank_cpus



def test_rank_shares_are_disjoint_and_cover_everything():
    cpus = list(range(16))
    shares = [rank_cpus(cpus, r, 2) for r in range(2)]
    assert shares == [list(range(8)), list(range(8, 16))]
    shares = [rank_cpus(list(range(10)), r, 3) for r in range(3)]
    assert sorted(sum(shares, [])) == list(range(10)) and all(shares)


def test_small_shares_leave_one_core(tmp_path):
    plan = plan_threads(0, 1, None, allowed=list(range(8)), sysfs_root=str(tmp_path))  # no topology: logical
    assert plan.threads == 7 and plan.cpus == tuple(range(8))
    plan = plan_threads(1, 2, None, allowed=list(range(16)), sysfs_root=str(tmp_path))
    assert plan.threads == 7 and plan.cpus == tuple(range(8, 16))
    assert plan_threads(0, 1, None, allowed=[3], sysfs_root=str(tmp_path)).threads == 1


def test_smt_siblings_count_once(tmp_path):
    for cpu in range(8):  # 4 cores x 2 threads: cpu c and c+4 are siblings
        d = tmp_path / f"devices/system/cpu/cpu{cpu}/topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text("0\n")
        (d / "core_id").write_text(f"{cpu % 4}\n")
    plan = plan_threads(0, 1, None, allowed=list(range(8)), sysfs_root=str(tmp_path))
    assert plan.physical_cores == 4 and plan.threads == 3


def test_big_shares_leave_two_cores(tmp_path):
    # 12+ cores: the GPU thread and the callback/poller thread each keep a core
    assert plan_threads(0, 1, None, allowed=list(range(16)), sysfs_root=str(tmp_path)).threads == 14
    assert plan_threads(0, 1, None, allowed=list(range(11)), sysfs_root=str(tmp_path)).threads == 10
    assert plan_threads(1, 2, None, allowed=list(range(32)), sysfs_root=str(tmp_path)).threads == 14
    assert plan_threads(0, 1, None, allowed=list(range(16)), sysfs_root=str(tmp_path)).cpus == tuple(range(16))


def test_lk_threads_must_fit_the_share(tmp_path):
    assert plan_threads(0, 2, 8, allowed=list(range(16)), sysfs_root=str(tmp_path)).threads == 8
    with pytest.raises(ValueError, match="LK_THREADS=9 is more than the 8 CPUs"):
        plan_threads(0, 2, 9, allowed=list(range(16)), sysfs_root=str(tmp_path))
    with pytest.raises(ValueError, match="cannot be split"):
        rank_cpus([0], 0, 2)


# LVLLM_EXCLUSIVE_ENGINE_CPUS, in a child process: it moves every thread of the process it runs in.
_EXCLUSIVE = r'''
import json, os, sys, threading, time
import lk_moe
from lvllm.threads import keep_others_off_workers
share = sorted(os.sched_getaffinity(0))
threads, binding = int(sys.argv[1]), sys.argv[2]
pool = lk_moe.make_pool(threads=threads, binding=binding, allowed=share)
stop = threading.Event()
before = threading.Thread(target=stop.wait, name="started-before")
before.start()
def poller():  # a thread named as the engine's signal thread (the real one needs CUDA)
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write("lk_moe-poller")
    stop.wait()
threading.Thread(target=poller).start()
time.sleep(0.2)  # the workers have named themselves
line = keep_others_off_workers(share)
after = threading.Thread(target=stop.wait, name="started-after")
after.start()
time.sleep(0.1)
names = {int(t): open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
cpus = {names[t]: sorted(os.sched_getaffinity(t)) for t in names}
stop.set()
print(json.dumps({"line": line, "share": share, "cpus": cpus, "after": after.native_id, "names": names}))
'''


def _exclusive(threads, binding="CPU_CORE"):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _EXCLUSIVE, str(threads), binding], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pool_workers_are_named_and_pinned_one_cpu_each():
    r = _exclusive(1)
    assert r["cpus"]["lk_moe-w0"] == [r["share"][0]]


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_exclusive_cpus_moves_every_other_thread_off_the_workers():
    r = _exclusive(1)
    worker_cpu = r["cpus"]["lk_moe-w0"]
    spare = [c for c in r["share"] if c not in worker_cpu]
    others = {name: cpus for name, cpus in r["cpus"].items() if not name.startswith("lk_moe-w")}
    assert others and all(cpus == spare for cpus in others.values()), others  # the main thread too
    # with 2 CPUs one is spare: the signal thread shares it with the others (3 or more: test_split_spare_cpus)
    assert "lk_moe-poller" in others and (len(spare) >= 2 or "signal thread with them" in r["line"])
    # a thread started afterwards by the main thread inherits the spare CPUs
    assert r["cpus"][r["names"][str(r["after"])]] == spare
    assert f"on CPUs {','.join(map(str, spare))}" in r["line"] and "1 engine workers alone" in r["line"]


def test_exclusive_cpus_leaves_everything_when_nothing_is_spare_or_workers_float():
    import os
    n = len(os.sched_getaffinity(0))
    r = _exclusive(n)
    assert "take every CPU" in r["line"] and "lower LK_THREADS" in r["line"]
    assert all(cpus == r["share"] for name, cpus in r["cpus"].items() if not name.startswith("lk_moe-w"))
    r = _exclusive(1, "NUMA_NODE")
    assert "not pinned one per CPU" in r["line"]
    assert all(cpus == r["share"] for cpus in r["cpus"].values())


def test_split_spare_cpus_gives_the_signal_thread_a_cpu_alone():
    from lvllm.threads import split_spare_cpus
    assert split_spare_cpus([15, 14], True) == ([14], [15])
    assert split_spare_cpus([12, 13, 14, 15], True) == ([12], [13, 14, 15])
    assert split_spare_cpus([15], True) == ([15], [15])  # one spare CPU: shared
    assert split_spare_cpus([14, 15], False) == ([14, 15], [14, 15])  # no signal thread (hostfn signal)
