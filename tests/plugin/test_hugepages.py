"""lvllm.hugepages: THP settings and this process's huge-page bytes, from the kernel's own files."""
import mmap

from lvllm import hugepages


def test_the_selected_thp_setting_is_the_bracketed_one(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert hugepages._selected(str(f)) == "madvise"
    f.write_text("[always] madvise never\n")
    assert hugepages._selected(str(f)) == "always"
    assert hugepages._selected(str(tmp_path / "missing")) == "unknown"


def test_anon_huge_pages_are_read_from_smaps_rollup(tmp_path):
    f = tmp_path / "smaps_rollup"
    f.write_text("Rss:   123 kB\nAnonHugePages:   4096 kB\nShmemPmdMapped: 0 kB\n")
    assert hugepages.process_huge_page_bytes(str(f)) == 4096 * 1024
    f.write_text("Rss:   123 kB\n")
    assert hugepages.process_huge_page_bytes(str(f)) == -1
    assert hugepages.process_huge_page_bytes(str(tmp_path / "missing")) == -1


def test_this_process_reports_a_figure_that_grows_with_a_touched_huge_mapping():
    before = hugepages.process_huge_page_bytes()
    assert before >= 0  # Linux with smaps_rollup (the supported platform)
    text = hugepages.huge_page_text(1 << 30)
    assert "huge pages" in text and "THP" in text
    if hugepages.thp_mode() not in ("always", "madvise"):
        return
    # private anonymous memory, as the engine maps it (Python's default, shared, is shmem: another THP knob)
    m = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    for off in range(0, 64 << 20, 4096):
        m[off] = 1
    after = hugepages.process_huge_page_bytes()
    m.close()
    # the kernel may not find contiguous memory for every 2 MiB page, but for some of 64 MiB it does
    assert after >= before + (2 << 20)
