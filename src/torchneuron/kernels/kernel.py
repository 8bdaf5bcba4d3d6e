"""@kernel and launches: `k(*args)` runs one program, `k[grid](*args)` a grid of them. NumPy arrays and CPU
tensors run in the simulator (which checks every rule); JAX arrays, traced or not, run the lowering."""
import functools
import inspect

import jax
import numpy as np
import torch

from .context import Active, lowering_choice
from .language import HBMTensor, as_dtype
from .simulator import Simulator
from . import lowering, pallas


class Kernel:
    def __init__(self, fn):
        self.fn, self.name = fn, fn.__name__
        self.signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        return Launch(self, grid)

    def __call__(self, *args, **kwargs):
        return Launch(self, ())(*args, **kwargs)

    def simulate(self, *args, **kwargs):
        return Launch(self, ()).simulate(*args, **kwargs)

    def __repr__(self):
        return f"<kernel {self.name}>"


def kernel(fn):
    """Make `fn` a kernel: its tensor arguments are HBM tensors, it returns the outputs it allocates."""
    return Kernel(fn)


class Launch:
    def __init__(self, kernel, grid):
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not all(isinstance(g, (int, np.integer)) and g > 0 for g in grid):
            raise ValueError(f"kernel {kernel.name}: a grid is a tuple of positive ints, got {grid!r}")
        self.kernel, self.grid = kernel, tuple(int(g) for g in grid)

    def __call__(self, *args, **kwargs):
        values = list(args) + list(kwargs.values())
        if any(isinstance(v, jax.Array) for v in values):
            return self.lower(*args, **kwargs)
        return self.simulate(*args, **kwargs)

    def _bind(self, args, kwargs, convert):
        try:
            bound = self.kernel.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"kernel {self.kernel.name}: {e}") from None
        bound.apply_defaults()
        params = self.kernel.signature.parameters
        return {name: HBMTensor(name, value.shape, as_dtype(value.dtype), convert(name, value))
                if _is_array(value) and _holds_tensor(params[name], value) else value
                for name, value in bound.arguments.items()}

    def simulate(self, *args, **kwargs):
        """Run on NumPy with every check; returns NumPy arrays, or CPU tensors for tensor arguments."""
        torch_in = any(isinstance(v, torch.Tensor) for v in list(args) + list(kwargs.values()))
        arguments = self._bind(args, kwargs, _to_numpy)
        ctx = Simulator(self.kernel.name, self.grid)
        with Active(ctx):
            returned = ctx.run(self.kernel.fn, arguments)
        picked = lowering._returned(self.kernel, returned, ctx.outputs)
        results = [ctx.outputs[i].data for i in picked]
        if torch_in:
            from ..runtime.dtypes import numpy_to_tensor, to_torch
            results = [numpy_to_tensor(r, to_torch(r.dtype)) for r in results]
        return results[0] if picked.single else tuple(results)

    def lower(self, *args, **kwargs):
        """Trace the lowering `nk.use_lowering` chose (inside jax.jit or not); returns JAX arrays."""
        arguments = self._bind(args, kwargs, lambda name, v: v)
        choice = lowering_choice()
        if choice == "jax":
            return lowering.run(self.kernel, self.grid, arguments)
        from ..runtime.platform import pallas_pays
        on_gpu = pallas_pays()
        if choice == "pallas":
            return pallas.run(self.kernel, self.grid, arguments, interpret=not on_gpu)
        if on_gpu:
            try:
                return pallas.run(self.kernel, self.grid, arguments, interpret=False)
            except NotImplementedError:
                pass  # a construct Pallas does not lower: XLA fuses the JAX lowering instead
        return lowering.run(self.kernel, self.grid, arguments)


def _is_array(value):
    return isinstance(value, (np.ndarray, jax.Array, torch.Tensor, jax.ShapeDtypeStruct))


_SCALARS = (float, int, bool)


def _holds_tensor(param, value):
    """An argument is an HBM tensor unless annotated as a scalar, or a 0-d array without annotation (a
    traced float from a lowering)."""
    if param.annotation in _SCALARS:
        return False
    return param.annotation is not inspect.Parameter.empty or len(value.shape) > 0


def _to_numpy(name, value):
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise TypeError(f"argument {name!r} is on {value.device}: simulate on CPU tensors or NumPy arrays; "
                            "run kernels on devices through torchneuron.kernels.custom_op")
        from ..runtime.dtypes import tensor_to_numpy
        return tensor_to_numpy(value.detach())
    if isinstance(value, jax.Array):
        return np.asarray(value)
    return np.asarray(value)
