"""The Dynamo backend `neuron`: AOTAutograd graphs of ATen ops, each run as XLA executables.

Dynamo splits the program at graph breaks; AOTAutograd turns each Dynamo
graph into functional forward/backward graphs (or one inference graph under
no_grad) with core-ATen decompositions, except for ops the lowering table
handles itself, whose lowerings suit XLA better than their decompositions.
A graph whose ops all have lowerings becomes one executable. Ops the table
lacks split the graph: they run eagerly on neuron tensors between compiled
pieces, and are counted in `report()["eager_ops"]` with a warning. Ops on CPU
tensors (CPU scalars aside, which PyTorch lets mix with device tensors) run
eagerly too, on the CPU, as Inductor runs a graph's CPU part on the CPU:
`torch.compile(optimizer.step)` keeps AdamW's step counts on the CPU, and a
`.cpu()` or `.to("neuron")` in a graph is a real transfer. They are counted
in `report()["host_ops"]`.

Modes: "default", "reduce-overhead", "max-autotune" and
"max-autotune-no-cudagraphs" all compile each graph to one XLA executable.
Launch overhead is already one call per graph (what CUDA graphs buy
Inductor) and XLA chooses its own kernels, so the modes currently coincide.
"""
import copy
import functools
import operator
import time
import warnings

import torch
from torch.utils import _pytree as pytree
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import default_partition
from torch._guards import detect_fake_mode
from torch._higher_order_ops.effects import with_effects
from torch._inductor.output_code import OutputCode
from torch.fx._graph_pickler import GraphPickler, Options
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..ops import collectives, control_flow, registry, rules
from ..runtime import compilation_cache
from .executable import CompiledGraph
from .stats import counters, eager_ops, host_ops

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str = "default", options=None):
    if mode not in MODES:
        raise RuntimeError(f"Unrecognized mode={mode!r} for backend 'neuron', should be one of: {', '.join(MODES)}")
    if options:
        raise RuntimeError(f"backend 'neuron' takes no options, got {sorted(options)}")
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        # compiled autograd's graphs take their tensors boxed in a list: flattened as AOTAutograd's own backends
        # flatten them (AOTAutograd refused the list: "all flat_args must be KNOWN_TYPES"); imported here, where
        # only compiled autograd leads, since older releases kept the function elsewhere
        from torch._dynamo.utils import flatten_graph_inputs

        return flatten_graph_inputs(gm, example_inputs, functools.partial(neuron_backend, mode=mode))
    counters["dynamo_graphs"] += 1
    compiled = aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=NeuronCode,
        bw_compiler=NeuronCode,
        partition_fn=default_partition,
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )
    if _AOT_COMPILE_SAVES_ONLY_ITS_OWN_BACKENDS and getattr(compiled, "serialize", None) is not None:
        # under aot_compile (which bundles AOTAutograd's cache entries: `serialize`), torch 2.11 saves only
        # Inductor's and AotAutograd backends' functions; 2.13 saves any that can serialize itself
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

        compiled = BundledAOTAutogradSerializableCallable(compiled)
    return compiled


_AOT_COMPILE_SAVES_ONLY_ITS_OWN_BACKENDS = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13)


@functools.cache
def decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    # an op whose CPU errors are checked (registry.checked_meta) stays a node too: the checks are its rule's
    return {op: fn for op, fn in core_aten_decompositions().items()
            if op not in registry.LOWERINGS and registry.argument_check(op) is None}


def supported(target, with_collectives: bool = False) -> bool:
    """Whether a graph node's op runs inside a compiled program (collectives: in a graph whose
    collectives share one process group, see ops.collectives)."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        # one without a lowering runs eagerly between pieces: its subgraphs are not the lowering table's
        return target in registry.LOWERINGS
    if not isinstance(target, torch._ops.OpOverload):
        return True
    op = rules.rule(target)
    return op.compiles or (with_collectives and op.collective is not None)


def node_supported(gm: torch.fx.GraphModule, node, with_collectives: bool = False) -> bool:
    """`supported`, and for a higher-order op, every op of its subgraphs (flex attention's score_mod and
    mask_mod, cond's branches run inside its lowering; with an op the table lacks, or a random op, whose key
    a subgraph is not given, the op runs eagerly between pieces)."""
    if not supported(node.target, with_collectives):
        return False
    if node.target is with_effects:
        # the effectful op's lowering is its lowering (a `print` has none: it runs between pieces)
        return supported(node.args[1], with_collectives)
    if not (isinstance(node.target, torch._ops.HigherOrderOperator) and node.target in registry.LOWERINGS):
        return True
    subgraphs = [getattr(gm, a.target) for a in pytree.tree_leaves((node.args, node.kwargs))
                 if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
    return all(node_supported(subgraph, inner) and not _random(inner) for subgraph in subgraphs
               for inner in subgraph.graph.nodes if inner.op == "call_function")


def _random(node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and rules.rule(node.target).random


def on_device(node) -> bool:
    """Whether a node computes on neuron tensors: its tensors are neuron's, or CPU scalars read by an op
    whose results are neuron's. A node without tensor values (sizes, asserts, effect tokens) goes with the
    graph."""
    if _is_effect_token(node):
        return True
    value = node.meta.get("val")
    if node.target is with_effects:
        value = value[1:]
    if any(_on_host(t) for t in _tensors(value)):
        return False
    return all(not _on_host(t) or t.dim() == 0 for a in node.all_input_nodes if not _is_effect_token(a)
               for t in _tensors(a.meta.get("val")))


def _is_effect_token(node) -> bool:
    """An effect token of AOTAutograd's, which orders effectful ops (`with_effects`): an empty CPU tensor while
    the graph is traced, None when it runs; no data."""
    if node.op == "call_function" and node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and source.target is with_effects and node.args[1] == 0
    return any(user.target is with_effects and user.args[0] is node for user in node.users)


def _tensors(value) -> list:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _on_host(tensor) -> bool:
    return tensor.device.type != "neuron"


def compile_graph(gm: torch.fx.GraphModule, example_inputs):
    counters["graphs"] += 1
    with_collectives = collectives.group_of(gm) is not None
    on_host, missing = [], []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if not on_device(node):
            on_host.append(node.target)
        elif not node_supported(gm, node, with_collectives):
            missing.append(node.target)
    if not missing and not on_host:
        return CompiledGraph(gm)
    for op in on_host:
        host_ops[str(op)] += 1
    if missing:
        for op in missing:
            eager_ops[str(op)] += 1
        _run_higher_order_ops_eagerly(gm)
        warnings.warn(
            f"torchneuron: no lowering for {sorted({str(op) for op in missing})}; torch.compile runs them "
            "eagerly between compiled pieces (see torchneuron.compile.report())"
        )
    return _Boxed(split_into_pieces(gm, with_collectives))


def _run_higher_order_ops_eagerly(gm: torch.fx.GraphModule) -> None:
    """Every higher-order op of the graph and its subgraphs, one of which runs between compiled pieces, gets
    its dense rule for neuron tensors (an op inside an eager branch runs eagerly too)."""
    for module in gm.modules():
        for node in module.graph.nodes:
            if isinstance(node.target, torch._ops.HigherOrderOperator):
                control_flow.dense_rule_for_neuron(node.target)


class NeuronCode(OutputCode):
    """A graph compiled by `compile_graph`, in the form AOTAutograd bundles into a precompiled function
    (`torch.compile(fn, fullgraph=True).aot_compile(...)`, saved and loaded by PyTorch): what is saved is
    the ATen graph with its nodes' fake tensors and, for a graph compiled whole, its `CompiledGraph`
    without the graph, which the loading process unpickles only to trace a program the disk cache lacks.
    A split graph is compiled again on load, where `compile_graph` is cheap and each program comes from
    the disk cache, so a loaded function neither traces nor compiles."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs):
        super().__init__()
        # on the instance: wrappers AOTAutograd puts around a loaded backward copy its __dict__, not its class
        self._boxed_call = True
        self.gm, self.serialized, self.saved_graph, self.saved_by = gm, None, None, None
        start = time.perf_counter_ns()
        self.run = compile_graph(gm, example_inputs)
        # what AOTAutograd's cache reports as saved by a hit (torch 2.11 fails on a hit without it)
        self._time_taken_ns = time.perf_counter_ns() - start

    def __call__(self, inputs):
        return self.run(inputs)

    def prepare_for_serialization(self) -> None:
        if self.gm is not None:  # else loaded, and saved again
            # ops outside aten too (our kernels' custom ops, functional collectives): the loading process
            # imports torchneuron, which registers them
            self.serialized = GraphPickler.dumps(self.gm, Options(ops_filter=None))
        whole = isinstance(self.run, CompiledGraph) and self.run.portable
        self.saved_graph = self.run.saved() if whole else None
        self.saved_by = compilation_cache.source_digest()
        self.gm = self.run = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        if self.run is not None:
            return
        load = functools.partial(_load_graph, self.serialized, detect_fake_mode(example_inputs))
        # PyTorch's AOTAutograd cache and saved precompiled functions outlive a torchneuron upgrade, and their keys
        # do not name it: a CompiledGraph saved by other torchneuron code is compiled again from the ATen graph
        # (none saved before this check was written has `saved_by`)
        if self.saved_graph is None or getattr(self, "saved_by", None) != compilation_cache.source_digest():
            self.run = compile_graph(load(), example_inputs)
        else:
            counters["graphs"] += 1
            self.run = CompiledGraph.from_saved(self.saved_graph, load)

    def set_triton_bundle(self, triton_bundle) -> None:
        pass  # no Triton kernels


def _load_graph(serialized: bytes, fake_mode) -> torch.fx.GraphModule:
    gm = GraphPickler.loads(serialized, fake_mode)
    gm.recompile()
    return gm


class _Support(OperatorSupportBase):
    def __init__(self, gm: torch.fx.GraphModule, with_collectives: bool):
        self.gm, self.with_collectives = gm, with_collectives

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and node_supported(self.gm, node, self.with_collectives) and on_device(node)


def split_into_pieces(gm: torch.fx.GraphModule, with_collectives: bool = False) -> torch.fx.GraphModule:
    """The graph with each maximal run of ops that compile on the device replaced by one compiled piece."""
    # on a copy: the partitioner rewrites its graph in place, and a precompiled function saves the original
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    partitioner = CapabilityBasedPartitioner(gm, _Support(gm, with_collectives), allows_single_node_partition=True)
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
