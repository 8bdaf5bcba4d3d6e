"""The running kernel's context, the hardware limits the checker enforces, and the errors it raises.

A kernel body is plain Python calling the language's functions; they find the interpreter (the NumPy
simulator or the JAX lowering) through the context of the launch that runs it, one per thread.
"""
import os
import sys
import threading

PARTITIONS = 128                 # partition axis of every on-chip tile
SBUF_BYTES = 192 * 1024          # per partition (24 MiB in all)
PSUM_BANK_BYTES = 2 * 1024       # per partition per bank: 512 float32
PSUM_BANKS = 8
MATMUL_FREE = 512                # a matmul's output free size (one psum bank of float32)

_local = threading.local()
_HERE = os.path.dirname(os.path.abspath(__file__))
_CORE = {os.path.join(_HERE, f) for f in ("context.py", "language.py", "simulator.py", "lowering.py",
                                           "kernel.py", "custom_op.py")}


class KernelError(RuntimeError):
    """A kernel broke a rule of the language or the hardware; `rule` names it, `filename`/`lineno` point at
    the kernel's own line."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        self.filename, self.lineno, self.kernel = user_line()
        where = f"{self.filename}:{self.lineno}" if self.filename else "?"
        super().__init__(f"kernel {self.kernel}, {where}: {message} [{rule}]")


def user_line():
    """(file, line, function) of the innermost frame outside the language's own modules: the kernel's line."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _CORE:
        frame = frame.f_back
    if frame is None:
        return None, None, "?"
    ctx = current(required=False)
    name = ctx.kernel_name if ctx is not None else frame.f_code.co_name
    return frame.f_code.co_filename, frame.f_lineno, name


def current(required: bool = True):
    ctx = getattr(_local, "ctx", None)
    if ctx is None and required:
        raise RuntimeError("torchneuron.kernels: language functions run only inside a @kernel that is launched")
    return ctx


class Active:
    """Makes `ctx` the current context for the duration of a with-block (launches may nest in helpers)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def __enter__(self):
        self.previous = getattr(_local, "ctx", None)
        _local.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        _local.ctx = self.previous


LOWERING_ENV = "TORCHNEURON_KERNEL_LOWERING"
LOWERINGS = ("auto", "jax", "pallas")


def checked_lowering(choice: str, source: str) -> str:
    if choice not in LOWERINGS:
        raise ValueError(f"torchneuron.kernels: the lowering is one of {', '.join(LOWERINGS)}, got {choice!r} "
                         f"(from {source})")
    return choice


def lowering_choice() -> str:
    """The lowering launches use: the innermost `use_lowering`, else $TORCHNEURON_KERNEL_LOWERING, else auto."""
    choice = getattr(_local, "lowering", None)
    return choice or checked_lowering(os.environ.get(LOWERING_ENV, "auto").lower(), f"${LOWERING_ENV}")


class use_lowering:
    """Choose how launches on JAX arrays (and so custom ops) lower kernels, for a with-block or, called
    alone, for this thread from now on: "pallas" (Pallas: Triton on a GPU, its interpreter elsewhere),
    "jax" (the JAX lowering) or "auto" (Pallas where the platform's devices pay for it and the kernel is
    in what it lowers, else JAX). The choice is read when a launch is traced: a compiled program keeps
    the lowering it was traced with."""

    def __init__(self, choice: str):
        checked_lowering(choice, "use_lowering")
        self.previous = getattr(_local, "lowering", None)
        _local.lowering = choice

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _local.lowering = self.previous
