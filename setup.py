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

    def copy_extensions_to_source(self) -> None:
        super().copy_extensions_to_source()
        # The GPU fallback kernels (built only where nvcc exists) are a plain shared library that
        # setuptools does not know about: bring it along for in-place builds too.
        built = Path(self.build_lib) / "lk_moe" / "_lk_cuda.so"
        if built.exists():
            shutil.copy2(built, ROOT / "lk_moe" / "_lk_cuda.so")


setup(ext_modules=[CMakeExtension("lk_moe._C")], cmdclass={"build_ext": CMakeBuild})
