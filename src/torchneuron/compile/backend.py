"""The Dynamo backend `neuron`: AOTAutograd graphs of ATen ops, each run as XLA executables.

Dynamo splits the program at graph breaks; AOTAutograd turns each Dynamo
graph into functional forward/backward graphs (or one inference graph under
no_grad) with core-ATen decompositions, except for ops the lowering table
handles itself, whose lowerings suit XLA better than their decompositions.
A graph whose ops all have lowerings becomes one executable. Ops the table
lacks split the graph: they run eagerly on neuron tensors between compiled
pieces, and are counted in `report()["eager_ops"]` with a warning.

Modes: "default", "reduce-overhead", "max-autotune" and
"max-autotune-no-cudagraphs" all compile each graph to one XLA executable.
Launch overhead is already one call per graph (what CUDA graphs buy
Inductor) and XLA chooses its own kernels, so the modes currently coincide.
"""
import functools
import warnings

import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import default_partition
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..ops import collectives, registry, rules
from ..ops.flex_attention import EAGER_HOPS
from .executable import CompiledGraph
from .stats import counters, eager_ops

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str = "default", options=None):
    if mode not in MODES:
        raise RuntimeError(f"Unrecognized mode={mode!r} for backend 'neuron', should be one of: {', '.join(MODES)}")
    if options:
        raise RuntimeError(f"backend 'neuron' takes no options, got {sorted(options)}")
    counters["dynamo_graphs"] += 1
    return aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=compile_graph,
        bw_compiler=compile_graph,
        partition_fn=default_partition,
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )


@functools.cache
def decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items() if op not in registry.LOWERINGS}


def supported(target, with_collectives: bool = False) -> bool:
    """Whether a graph node's op runs inside a compiled program (collectives: in a graph whose
    collectives share one process group, see ops.collectives)."""
    if target in EAGER_HOPS:
        return False
    if not isinstance(target, torch._ops.OpOverload):
        return True
    op = rules.rule(target)
    return op.compiles or (with_collectives and op.collective is not None)


def compile_graph(gm: torch.fx.GraphModule, example_inputs):
    counters["graphs"] += 1
    with_collectives = collectives.group_of(gm) is not None
    missing = [n.target for n in gm.graph.nodes if n.op == "call_function" and not supported(n.target, with_collectives)]
    if not missing:
        return CompiledGraph(gm)
    for op in missing:
        eager_ops[str(op)] += 1
    warnings.warn(
        f"torchneuron: no lowering for {sorted({str(op) for op in missing})}; torch.compile runs them "
        "eagerly between compiled pieces (see torchneuron.compile.report())"
    )
    return _Boxed(split_at_missing_ops(gm, with_collectives))


class _Support(OperatorSupportBase):
    def __init__(self, with_collectives: bool):
        self.with_collectives = with_collectives

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and supported(node.target, self.with_collectives)


def split_at_missing_ops(gm: torch.fx.GraphModule, with_collectives: bool = False) -> torch.fx.GraphModule:
    """The graph with each maximal run of supported ops replaced by one compiled piece."""
    partitioner = CapabilityBasedPartitioner(gm, _Support(with_collectives), allows_single_node_partition=True)
    split = partitioner.partition_and_fuse()
    for node in list(split.graph.nodes):
        if node.op == "call_module":
            piece = CompiledGraph(getattr(split, node.target))
            node.op, node.target = "call_function", _Unboxed(piece)
    split.graph.lint()
    split.recompile()
    return split


class _Unboxed:
    """A compiled piece called from generated FX code, which passes positional arguments."""

    def __init__(self, piece: CompiledGraph):
        self.piece = piece
        self.__name__ = "neuron_compiled_piece"

    def __call__(self, *args):
        return self.piece(args)


class _Boxed:
    """A split graph module behind AOTAutograd's boxed calling convention."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm

    def __call__(self, args):
        return self.gm(*args)
