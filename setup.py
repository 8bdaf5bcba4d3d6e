"""Builds torchneuron's native boundary (src/torchneuron/native/*.cpp) with torch.utils.cpp_extension.

Everything else is declared in pyproject.toml. Install with `pip install --no-build-isolation -e .`
(scripts/setup.sh does): the extension must be compiled against the torch it will run with.
"""
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

native = Path("src/torchneuron/native")
setup(
    ext_modules=[
        CppExtension(
            "torchneuron.native._C",
            sorted(str(p) for p in native.glob("*.cpp")),
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
