"""A source checkout without the built extension says so on import (not Python's 'partially initialized
module ... circular import'), and how to build it."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_without_the_extension_names_the_way_out(tmp_path):
    shutil.copytree(os.path.join(ROOT, "lk_moe"), tmp_path / "lk_moe",
                    ignore=shutil.ignore_patterns("_C*.so", "_lk_cuda*.so", "__pycache__"))
    r = subprocess.run([sys.executable, "-c", "import lk_moe"], cwd=tmp_path, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=120)
    assert r.returncode != 0
    assert "lk_moe._C) cannot be loaded: it was never built here" in r.stderr, r.stderr[-2000:]
    assert "tools/setup_env.sh" in r.stderr and "circular import" not in r.stderr
