"""Transparent huge pages behind lk_moe's expert memory (no engine import: doctor reads these too).

The engine maps its expert buffers with madvise(MADV_HUGEPAGE) (csrc/cpu/host_memory.cpp). Whether the
kernel backs them with 2 MiB pages depends on the THP mode and on free contiguous memory; with 4 KiB
pages, decode that reads a few experts out of tens of GiB pays a page walk every 4 KiB (a walk that
misses the caches once the page tables outgrow them). These read what the kernel says.
"""
from __future__ import annotations

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_DEFRAG = "/sys/kernel/mm/transparent_hugepage/defrag"


def _selected(path: str) -> str:
    """The bracketed choice of a THP setting file ("always [madvise] never" -> "madvise"), or "unknown"."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1:text.find("]")] if "[" in text else (text or "unknown")


def thp_mode() -> str:
    return _selected(THP_ENABLED)


def thp_defrag() -> str:
    return _selected(THP_DEFRAG)


def process_huge_page_bytes(smaps_rollup: str = "/proc/self/smaps_rollup") -> int:
    """Anonymous memory of this process backed by transparent huge pages (AnonHugePages), bytes; -1 if
    the kernel does not say."""
    try:
        with open(smaps_rollup) as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return -1


def huge_page_text(expert_bytes: int) -> str:
    """One phrase for startup lines and benchmarks: how much of the process's memory sits on huge pages
    next to the expert bytes, and the THP mode."""
    huge = process_huge_page_bytes()
    if huge < 0:
        return f"huge pages unknown (THP {thp_mode()})"
    share = f", {min(1.0, huge / expert_bytes) * 100:.0f}% of the experts' size" if expert_bytes > 0 else ""
    return f"huge pages {huge / 2**30:.2f} GiB in this process{share} (THP {thp_mode()}, defrag {thp_defrag()})"
