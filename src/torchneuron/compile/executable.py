"""An ATen FX graph run on neuron tensors as one XLA executable per input signature.

The program reads every input straight from its storage through the tensor's
view, interprets the graph with the lowering table (ops.graph), writes the
new values of inputs the graph mutates back into their storages (donating
the old buffers), and returns fresh flat buffers for the outputs. Shapes are
specialised: a new signature (tensor views, or the values of symbolic-size
inputs under dynamic=True) builds and counts a new program.
"""
import hashlib

import jax
import numpy as np
import torch
from torch.utils import _pytree as pytree

from ..device import rng
from ..eager import adaptive, special
from ..ops import registry
from ..ops.graph import run_graph_with_inputs
from ..runtime import events, layout, sync
from ..runtime.tensor import NeuronTensor, wrap_buffer
from . import disk_cache
from .stats import counters


class CompiledGraph:
    """Callable on the graph's inputs; returns outputs in the graph's own output structure.

    AOTAutograd calls compiled graphs boxed (one list argument); pieces of a
    split graph are called with positional arguments (see backend).
    """

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.mutated = _mutated_inputs(gm, placeholders)
        self.random = any(_is_op(n) and registry.is_random(n.target) for n in gm.graph.nodes)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        leaves, self.out_spec = pytree.tree_flatten(output.args[0])
        self.out_sources = [placeholders.index(v) if getattr(v, "op", None) == "placeholder" else None
                            for v in leaves]
        self.default_device = _meta_device(gm)
        self.specialisations = {}
        # named by content: the name is part of the program's text, which keys the disk cache
        self.name = f"neuron_graph_{hashlib.sha256(gm.code.encode()).hexdigest()[:10]}"

    def __call__(self, args):
        args = list(args)
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        tensors = [args[i] for i in positions]
        if any(type(t) is not NeuronTensor for t in tensors):
            special.bring_to_device(tensors)
            for i, t in zip(positions, tensors):
                args[i] = t
        storages, pattern = _distinct_storages(tensors)
        key = (
            tuple(t._spec for t in tensors),
            tuple(pattern),
            tuple(s.numel for s in storages),
            tuple(a for i, a in enumerate(args) if i not in positions),
        )
        program = self.specialisations.get(key)
        if program is None:
            counters["specialisations"] += 1
            if self.specialisations:
                counters["recompiles"] += 1
            if events.listening: events.signature("graph", self.name, key)
            program = self.specialisations[key] = _Program(self, args, positions, storages, pattern)
        return pytree.tree_unflatten(program.run(args, storages), self.out_spec)


def _is_op(node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)


def _mutated_inputs(gm, placeholders) -> set:
    """Indices of inputs the graph writes (AOTAutograd keeps such writes as copy_ onto the input)."""
    mutated = set()
    for node in gm.graph.nodes:
        if not (_is_op(node) and registry.is_mutating(node.target)):
            continue
        schema_names = [a.name for a in node.target._schema.arguments]
        for name in registry.mutated_arguments(node.target):
            position = schema_names.index(name)
            target = node.kwargs.get(name, node.args[position] if position < len(node.args) else None)
            if target in placeholders:
                mutated.add(placeholders.index(target))
    return mutated


def _meta_device(gm) -> int:
    """The device of a graph without tensor inputs (a graph of factories): where its outputs live."""
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device.index or 0
    return 0


def _distinct_storages(tensors):
    storages, pattern, index = [], [], {}
    for t in tensors:
        s = t._storage
        i = index.get(id(s))
        if i is None:
            i = index[id(s)] = len(storages)
            storages.append(s)
        pattern.append(i)
    return storages, pattern


class _Program:
    """The executable for one input signature, and how to turn its results into tensors."""

    def __init__(self, graph: CompiledGraph, args, positions, storages, pattern):
        specs = [args[i]._spec for i in positions]
        devices = {spec[4] for spec in specs}
        if len(devices) > 1:
            raise RuntimeError(f"torchneuron: a compiled graph got tensors on several devices: {sorted(devices)}")
        self.device_index = devices.pop() if devices else graph.default_device
        self.random = graph.random
        self.mutated_storages = sorted({pattern[k] for k, i in enumerate(positions) if i in graph.mutated})
        self.read_storages = [p for p in range(len(storages)) if p not in self.mutated_storages]
        self.sources = graph.out_sources
        self.array_outputs = []
        statics = list(args)
        storage_dtypes = [s.dtype for s in storages]
        mutated_storages, read_storages = self.mutated_storages, self.read_storages
        gm, mutated, sources, array_outputs = graph.gm, graph.mutated, graph.out_sources, self.array_outputs
        self.constants = {}
        constants = self.constants

        def program(mutable_buffers, read_buffers, raw_key):
            buffers = dict(zip(mutated_storages, mutable_buffers))
            buffers.update(zip(read_storages, read_buffers))
            inputs = list(statics)
            for k, i in enumerate(positions):
                inputs[i] = layout.read_view(buffers[pattern[k]], specs[k])
            key = rng.key_from(raw_key) if raw_key is not None else None
            outputs, finals = run_graph_with_inputs(gm, inputs, key)
            for k, i in enumerate(positions):
                if i in mutated:
                    p = pattern[k]
                    buffers[p] = layout.write_view(buffers[p], finals[i], specs[k], storage_dtypes[p])
            arrays = []
            for j, (value, source) in enumerate(zip(pytree.tree_leaves(outputs), sources)):
                if source is not None:
                    continue
                if isinstance(value, jax.Array):
                    array_outputs.append((j, value.shape))
                    arrays.append(value.reshape(-1))
                else:
                    # symbolic sizes saved for the backward, None gradients: fixed for this signature
                    constants[j] = value
            return [buffers[p] for p in mutated_storages], arrays

        program.__name__ = program.__qualname__ = self.op = graph.name
        self.traced = True  # compiled ahead of time, below (events.launch's protocol)
        mutable = [storages[p].buffer for p in mutated_storages]
        readonly = [storages[p].buffer for p in read_storages]
        # a stand-in key: compiling must not advance the generator, or a cold run would draw other numbers
        key = np.zeros(4, np.uint32) if self.random else None
        lowered = jax.jit(program, donate_argnums=(0,)).lower(mutable, readonly, key)
        self.compiled = disk_cache.compile_lowered(lowered, self.device_index)

    def run(self, args, storages):
        adaptive.flush()  # queued ops come first, and may read buffers this program donates
        mutable = [storages[p].buffer for p in self.mutated_storages]
        readonly = [storages[p].buffer for p in self.read_storages]
        flat = (mutable, readonly, rng.next_key(self.device_index) if self.random else None)
        new_buffers, arrays = events.launch(self, flat) if events.listening else self.compiled(*flat)
        for launched in (arrays or new_buffers)[-1:]:
            sync.launched(self.device_index, launched)
        for p, buffer in zip(self.mutated_storages, new_buffers):
            storages[p].buffer = buffer
        outputs = [None if source is None else args[source] for source in self.sources]
        for j, value in self.constants.items():
            outputs[j] = value
        for (j, shape), array in zip(self.array_outputs, arrays):
            outputs[j] = wrap_buffer(array, shape, self.device_index)
        return outputs
