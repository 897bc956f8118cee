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
