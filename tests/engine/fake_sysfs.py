"""Synthetic /sys trees for topology tests."""
import os


def make_sysfs(tmp_path, nodes, smt=1, memory_only=()):
    """nodes: {node_id: [cpu ids]}; smt: logical CPUs per core (consecutive ids share a core)."""
    root = tmp_path / "sys"
    for nid, cpus in nodes.items():
        d = root / "devices/system/node" / f"node{nid}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(_to_list(cpus) + "\n")
        for c in cpus:
            t = root / "devices/system/cpu" / f"cpu{c}" / "topology"
            t.mkdir(parents=True)
            (t / "core_id").write_text(f"{c // smt}\n")
            (t / "physical_package_id").write_text(f"{nid}\n")
    for nid in memory_only:
        d = root / "devices/system/node" / f"node{nid}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text("\n")
    (root / "devices/system/node").mkdir(parents=True, exist_ok=True)
    return os.fspath(root)


def _to_list(cpus):
    return ",".join(str(c) for c in cpus)
