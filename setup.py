"""Build of the lk_moe torch extension (`lk_moe._C`) through CMake.

Torch's include and library paths and its C++ ABI are read from the installed
torch and handed to CMake, so the build does not depend on torch's CMake
package (which probes for CUDA even for CPU-only code).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


def _run(cmd, cwd=ROOT):
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_tiers() -> list:
    """The kernel tiers this source builds, lowest first: the rows of csrc/cpu/isa_tiers.h."""
    import re

    text = (ROOT / "csrc" / "cpu" / "isa_tiers.h").read_text()
    return re.findall(r"^  X\(([a-z0-9_]+),", text, re.M)


def write_build_info(path: Path, build_dir: Path) -> None:
    """What this build holds, readable at run time (lk_moe.build_info(), `lvllm doctor`)."""
    import json
    import re

    import torch

    cache = (build_dir / "CMakeCache.txt").read_text() if (build_dir / "CMakeCache.txt").exists() else ""
    archs = re.search(r"^LK_CUDA_ARCHS:STRING=(.*)$", cache, re.M)
    cuda_built = (path.parent / "_lk_cuda.so").exists()
    nvcc = re.search(r"release ([0-9.]+)", _run(["nvcc", "--version"])) if cuda_built else None
    info = {
        "version": _run([sys.executable, "-c", "import tomllib;print(tomllib.load(open('pyproject.toml','rb'))"
                         "['project']['version'])"]),
        "git_commit": _run(["git", "rev-parse", "--short=12", "HEAD"]) or "unknown",
        "git_dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"])),
        "built_at": __import__("datetime").datetime.now(__import__("datetime").timezone.utc).isoformat(timespec="seconds"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "torch": torch.__version__,
        "cpu_tiers": cpu_tiers(),
        "cuda_toolkit": nvcc.group(1) if nvcc else None,
        "cuda_archs": [a.split("-")[0] for a in archs.group(1).split(";")] if (archs and cuda_built) else [],
    }
    path.write_text(json.dumps(info, indent=1) + "\n")


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import torch
        from torch.utils import cpp_extension

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("LK_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DLK_TORCH_INCLUDES={';'.join(cpp_extension.include_paths())}",
            f"-DLK_TORCH_LIBDIRS={';'.join(cpp_extension.library_paths())}",
            f"-DLK_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DLK_EXT_SUFFIX={self.get_ext_filename('x')[2:]}",
            # LK_CUDA=0: skip the GPU fallback kernels even where nvcc exists.
            f"-DLK_CUDA={'OFF' if os.environ.get('LK_CUDA', '1') == '0' else 'ON'}",
        ]
        gen = []
        try:
            subprocess.run(["ninja", "--version"], check=True, capture_output=True)
            gen = ["-G", "Ninja"]
        except (OSError, subprocess.CalledProcessError):
            pass
        cache = build_dir / "CMakeCache.txt"
        if cache.exists():
            # A cache made by another environment (moved venv, other ninja) cannot be reused.
            if subprocess.run(["cmake", str(ROOT), *args], cwd=build_dir).returncode != 0:
                print("lk_moe: stale CMake cache, configuring from scratch", file=sys.stderr)
                cache.unlink()
                shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        if not cache.exists():
            subprocess.run(["cmake", str(ROOT), *gen, *args], cwd=build_dir, check=True)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", ".", "-j", jobs], cwd=build_dir, check=True)
        write_build_info(out_dir / "_build_info.json", build_dir)

    def copy_extensions_to_source(self) -> None:
        super().copy_extensions_to_source()
        info = Path(self.build_lib) / "lk_moe" / "_build_info.json"
        if info.exists():
            shutil.copy2(info, ROOT / "lk_moe" / "_build_info.json")
        # The GPU fallback kernels (built only where nvcc exists) are a plain shared library that
        # setuptools does not know about: bring it along for in-place builds too.
        built = Path(self.build_lib) / "lk_moe" / "_lk_cuda.so"
        if built.exists():
            shutil.copy2(built, ROOT / "lk_moe" / "_lk_cuda.so")


setup(ext_modules=[CMakeExtension("lk_moe._C")], cmdclass={"build_ext": CMakeBuild})
