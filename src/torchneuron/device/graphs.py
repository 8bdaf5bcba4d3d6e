"""`torch.neuron.graph` and `torch.neuron.NeuronGraph`: torch.cuda.graph's capture and replay.

Ops run inside a capture are recorded, not run (adaptive eager's queue, which no flush may cut while it
captures), and `replay()` runs them as one program on the storages they read and wrote (eager/adaptive.py
`CapturedGraph`). As with CUDA graphs: inputs are static tensors made before the capture, whose values at
replay the graph reads; outputs are the tensors made in the capture, rewritten at each replay; reading a
captured value or waiting for the device while capturing raises; random ops draw new numbers at each replay.
A copy from the host inside a capture is made once, at capture time: copy new inputs into the static ones
before `replay()`. `make_graphed_callables` captures a callable's forward and backward as two graphs
replayed by one autograd node.
"""
import gc

import torch
from torch.utils import _pytree as pytree

from .guard import _adaptive, synchronize


class NeuronGraph:
    """torch.cuda.CUDAGraph's counterpart."""

    def __init__(self, keep_graph: bool = False):
        self._captured = None
        self._capture_ended = False

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        _adaptive().begin_capture()
        self._captured, self._capture_ended = None, False

    def capture_end(self) -> None:
        self._captured = _adaptive().end_capture()
        self._capture_ended = True

    def replay(self) -> None:
        if not self._capture_ended:
            raise RuntimeError("neuron: NeuronGraph.replay() without a preceding successful capture")
        if self._captured is not None:
            self._captured.replay()

    def reset(self) -> None:
        self._captured, self._capture_ended = None, False

    def pool(self):
        """An opaque handle, as CUDA's: neuron graphs share no private memory pool (each replay's results
        are new buffers of the same storages)."""
        return graph_pool_handle()

    def enable_debug_mode(self) -> None:
        """Nothing to enable: the replayed program is XLA's, which XLA_FLAGS=--xla_dump_to=DIR dumps."""


class graph:
    """`with torch.neuron.graph(g):` captures the block's neuron ops into `g` (torch.cuda.graph's arguments;
    `pool`, `stream` and `capture_error_mode` change nothing here)."""

    def __init__(self, neuron_graph: NeuronGraph, pool=None, stream=None, capture_error_mode: str = "global"):
        self.neuron_graph = neuron_graph

    def __enter__(self):
        synchronize()
        gc.collect()
        self.neuron_graph.capture_begin()

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.neuron_graph.capture_end()
        else:
            _adaptive().end_capture(keep=False)
        return False


def graph_pool_handle():
    return object()


def is_current_stream_capturing() -> bool:
    return _adaptive().capturing()


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None):
    """torch.cuda.make_graphed_callables: each callable (a function or a module) with its forward and its
    backward captured as two graphs and replayed by one autograd node. A callable's sample arguments are its
    static inputs; a module's parameters are read as they are at each replay, and its forward is replaced by
    the graphed one in the training mode it was captured in."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    graphed = tuple(_graphed(fn, tuple(args), num_warmup_iters, allow_unused_input)
                    for fn, args in zip(callables, sample_args))
    return graphed[0] if single else graphed


def _graphed(fn, sample_args, num_warmup_iters: int, allow_unused_input: bool):
    parameters = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
    surface = sample_args + parameters  # what the graphs read: copied into before each forward replay
    differentiable = tuple(t for t in surface if t.requires_grad)

    def forward_and_backward():
        outputs = [o for o in pytree.tree_leaves(fn(*sample_args)) if o.requires_grad]
        torch.autograd.grad(outputs, differentiable, [torch.ones_like(o) for o in outputs],
                            allow_unused=allow_unused_input)

    for _ in range(num_warmup_iters):  # optimizers' and autograd's first-use work, outside the captures
        forward_and_backward()
    forward_graph, backward_graph = NeuronGraph(), NeuronGraph()
    with graph(forward_graph):
        outputs, spec = pytree.tree_flatten(fn(*sample_args))
    grad_outputs = [torch.empty_like(o) if o.requires_grad else None for o in outputs]
    with graph(backward_graph):
        grads = iter(torch.autograd.grad([o for o in outputs if o.requires_grad], differentiable,
                                         [g for g in grad_outputs if g is not None], allow_unused=allow_unused_input))
    grad_inputs = [next(grads) if t.requires_grad else None for t in surface]

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *given):
            for static, value in zip(surface, given):
                if static.data_ptr() != value.data_ptr():
                    static.copy_(value)
            forward_graph.replay()
            return tuple(o.detach() for o in outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads_given):
            for static, value in zip(grad_outputs, grads_given):
                if static is not None and value is not None:
                    static.copy_(value)
            backward_graph.replay()
            return tuple(None if g is None else g.detach() for g in grad_inputs)

    def graphed_call(*args):
        return pytree.tree_unflatten(list(Graphed.apply(*args, *parameters)), spec)

    if not isinstance(fn, torch.nn.Module):
        return graphed_call
    eager_forward, captured_training = fn.forward, fn.training

    def forward(*args):
        return graphed_call(*args) if fn.training == captured_training else eager_forward(*args)

    fn.forward = forward
    return fn
