"""NUMA topology from sysfs: real layouts, missing information, many nodes."""
import lk_moe
from lk_moe import _C

from .fake_sysfs import make_sysfs


def test_parse_cpu_list():
    assert _C.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert _C.parse_cpu_list("") == []
    assert _C.parse_cpu_list("5,3,3-4") == [3, 4, 5]
    assert _C.parse_cpu_list("garbage,2") == [2]


def test_no_numa_information(tmp_path):
    """Desktop/VM/container without /sys/devices/system/node: one node of all allowed CPUs."""
    t = _C.read_topology(str(tmp_path / "nothing"), [0, 1, 2, 3])
    assert len(t["nodes"]) == 1 and not t["numa_from_sysfs"]
    assert t["logical_cpus"] == 4 and t["physical_cores"] == 4


def test_smt_siblings_form_one_core(tmp_path):
    root = make_sysfs(tmp_path, {0: list(range(8))}, smt=2)
    t = _C.read_topology(root, list(range(8)))
    assert t["physical_cores"] == 4 and t["logical_cpus"] == 8
    assert t["nodes"][0]["cores"][0] == [0, 1]
    pool = lk_moe.make_pool(threads=0, binding="NONE", sysfs_root=root, allowed=list(range(8)))
    assert pool.num_threads == 4  # default: physical cores


def test_sparse_ids_memory_only_and_cpuset(tmp_path):
    root = make_sysfs(tmp_path, {0: [0, 1], 2: [2, 3], 5: [4, 5]}, memory_only=(1, 7))
    t = _C.read_topology(root, [0, 1, 2, 3, 4, 5])
    assert [n["id"] for n in t["nodes"]] == [0, 2, 5]
    # a cpuset that excludes node 2 entirely
    t = _C.read_topology(root, [0, 1, 4])
    assert [n["id"] for n in t["nodes"]] == [0, 5]


def test_thirty_two_nodes(tmp_path):
    root = make_sysfs(tmp_path, {n: [2 * n, 2 * n + 1] for n in range(32)})
    t = _C.read_topology(root, list(range(64)))
    assert len(t["nodes"]) == 32 and t["physical_cores"] == 64
    pool = lk_moe.make_pool(threads=32, binding="NONE", sysfs_root=root, allowed=list(range(64)))
    assert pool.num_nodes == 32 and all(pool.threads_on_node(s) == 1 for s in range(32))


def test_cpus_missing_from_sysfs_are_kept(tmp_path):
    root = make_sysfs(tmp_path, {0: [0, 1]})
    t = _C.read_topology(root, [0, 1, 2])
    assert t["logical_cpus"] == 3


def test_this_machine():
    t = _C.read_topology("/sys", [])
    assert t["logical_cpus"] >= 1 and len(t["nodes"]) >= 1
