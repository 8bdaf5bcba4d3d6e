"""TorchNeuron's native boundary (C++, built at install by `torch.utils.cpp_extension`).

It gives PyTorch what a Python backend cannot: a device guard with device indices (the autograd
engine's per-device threads), device generators, and storages shared by all views that resize; and it
builds each tensor on its storage, at half the cost of doing so from Python.
See docs/native.md. Everything else stays in Python.
"""
try:
    from . import _C
except ImportError as error:
    raise ImportError(
        "torchneuron's native extension (torchneuron.native._C) is not built or does not match this "
        f"torch ({error}). Build it with `bash scripts/setup.sh` (or `pip install --no-build-isolation "
        "-e .`), which compiles it with torch.utils.cpp_extension; a g++ toolchain is required."
    ) from error

__all__ = ["_C"]
