"""A kernel as a PyTorch custom op: torch.library.custom_op for its schema, fake kernel and autograd,
torchneuron.library.lowering for the neuron device (eager, adaptive eager, and one node of a compiled
graph), the lowering jitted on the host for CPU tensors."""
import functools

import jax
import jax.numpy as jnp
import torch

from .. import library
from ..runtime.dtypes import numpy_to_tensor, tensor_to_numpy, to_jax, to_torch
from .context import checked_lowering, lowering_choice, use_lowering
from .kernel import Kernel


def custom_op(name: str, kernel: Kernel, *, grid=(), backward=None, backward_grid=(), lowering=None):
    """Register `kernel` as the op `name` ("namespace::op"); returns the op (a torch CustomOpDef).

    The kernel's arguments are annotated as for torch.library.custom_op (torch.Tensor, float, int...).
    `grid` is a tuple or a function of the kernel's arguments (in order; tensors have .shape) returning one.
    `backward` is a kernel taking the forward's arguments, then its outputs, then their gradients, and
    returning one gradient per tensor argument (it becomes the op `name + "_backward"`, launched on
    `backward_grid`); or a Python function (inputs, outputs, grads) -> gradients of torch code.
    `lowering` ("auto", "jax" or "pallas") fixes how this op lowers its kernels, whatever `nk.use_lowering`
    says around it.
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"custom_op() wraps a @kernel, got {kernel!r}")
    if lowering is not None:
        checked_lowering(lowering, "custom_op(lowering=)")
    signature = kernel.signature
    launch = functools.partial(_launch, kernel, grid, lowering)

    def cpu(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        tensors = {n: v for n, v in bound.arguments.items() if isinstance(v, torch.Tensor)}
        others = {n: v for n, v in bound.arguments.items() if n not in tensors}
        outputs = _jitted(launch, tuple(sorted(others.items(), key=lambda kv: kv[0])), lowering_choice())(
            {n: jnp.asarray(tensor_to_numpy(v.detach())) for n, v in tensors.items()})
        return _map(lambda a: numpy_to_tensor(jax.device_get(a), to_torch(a.dtype)), outputs)

    def fake(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        device = next(v.device for v in bound.arguments.values() if isinstance(v, torch.Tensor))
        shapes = jax.eval_shape(lambda arrays: launch(**{**bound.arguments, **arrays}),
                                {n: jax.ShapeDtypeStruct(tuple(int(s) for s in v.shape), to_jax(v.dtype))
                                 for n, v in bound.arguments.items() if isinstance(v, torch.Tensor)})
        return _map(lambda s: torch.empty(s.shape, dtype=to_torch(s.dtype), device=device), shapes)

    schema = torch.library.infer_schema(kernel.fn, mutates_args=())
    op = torch.library.custom_op(name, cpu, mutates_args=(), device_types="cpu", schema=schema)
    op.register_fake(fake)
    namespace, opname = name.split("::")
    overload = getattr(getattr(torch.ops, namespace), opname).default

    @library.lowering(overload)
    def lowered(*args, **kwargs):
        return launch(**signature.bind(*args, **kwargs).arguments)

    if backward is not None:
        _register_backward(op, name, signature, backward, backward_grid, lowering)
    return op


def _launch(kernel, grid, lowering, **arguments):
    grid = grid(*arguments.values()) if callable(grid) else grid
    if lowering is None:
        return kernel[grid].lower(**arguments)
    with use_lowering(lowering):
        return kernel[grid].lower(**arguments)


@functools.lru_cache(maxsize=256)
def _jitted(launch, others, choice):
    """`choice`: the lowering chosen around the call, which the trace follows."""
    return jax.jit(lambda arrays: launch(**arrays, **dict(others)))


def _map(fn, outputs):
    return tuple(fn(o) for o in outputs) if isinstance(outputs, tuple) else fn(outputs)


def _register_backward(op, name, signature, backward, backward_grid, lowering):
    names = list(signature.parameters)
    if isinstance(backward, Kernel):
        backward_op = custom_op(f"{name}_backward", backward, grid=backward_grid, lowering=lowering)

        def compute(inputs, outputs, grads):
            result = backward_op(*inputs, *outputs, *grads)
            result = result if isinstance(result, tuple) else (result,)
            tensors = iter(result)
            return tuple(next(tensors) if isinstance(v, torch.Tensor) else None for v in inputs)
    else:
        compute = backward

    def setup_context(ctx, inputs, output):
        outputs = output if isinstance(output, tuple) else (output,)
        tensor_at = [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*(inputs[i] for i in tensor_at), *outputs)
        ctx.layout = (inputs, tensor_at, len(outputs))

    def run_backward(ctx, *grads):
        inputs, tensor_at, n_out = ctx.layout
        saved = ctx.saved_tensors
        inputs = list(inputs)
        for k, i in enumerate(tensor_at):
            inputs[i] = saved[k]
        outputs = saved[len(tensor_at):]
        grads = tuple(g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outputs))
        result = compute(tuple(inputs), tuple(outputs), grads)
        if len(result) != len(names):
            raise RuntimeError(f"the backward of {name} returned {len(result)} gradients for {len(names)} arguments")
        return tuple(result)

    op.register_autograd(run_backward, setup_context=setup_context)
