"""An ATen FX graph run on neuron tensors as one XLA executable per input signature.

The program reads every input straight from its storage through the tensor's
view, interprets the graph with the lowering table (ops.rules), writes the
new values of inputs the graph mutates back into their storages (donating
the old buffers), and returns fresh flat buffers for the outputs. Shapes are
specialised: a new signature (tensor views, or the values of symbolic-size
inputs under dynamic=True) builds and counts a new program.
"""
import functools
import hashlib
import math
import operator

import jax
import numpy as np
import torch
from torch._library.utils import lookup_op
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true
from torch.utils import _pytree as pytree

from ..eager import adaptive, cpu_dtypes, fallback, math_bits, transfers, views
from ..ops import checks, collectives, registry, rules
from ..ops.rules import run_graph_with_inputs
from ..runtime import compilation_cache, events, pending_checks, rng, sync
from ..runtime.dtypes import to_torch
from ..runtime.program import StorageProgram, float32_matmul_precision, storage_views
from ..runtime.layout import contiguous_strides, is_contiguous, lay_out
from ..runtime.tensor import new_tensor, wrap
from . import disk_cache
from .stats import counters

_UNKNOWN = object()  # a graph's disk-cache digest before it is computed (None: a graph not cached)


class CompiledGraph:
    """Callable on the graph's inputs; returns outputs in the graph's own output structure.

    AOTAutograd calls compiled graphs boxed (one list argument); pieces of a
    split graph are called with positional arguments (see backend).
    """

    _boxed_call = True
    host_passed = frozenset()
    saved_input_views = frozenset()

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self._digest = _UNKNOWN
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.mutated = _mutated_inputs(gm, placeholders)
        self.random = any(_is_op(n) and rules.rule(n.target).random for n in gm.graph.nodes)
        # raised when the graph runs, as Inductor's programs raise the CPU kernel's error (Dynamo would wrap
        # one raised while compiling)
        self.refused = _cpu_dtype_refusal(gm)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        leaves, self.out_spec = pytree.tree_flatten(output.args[0])
        self.flat_output = _flat_container(self.out_spec)
        self.out_sources = [placeholders.index(v) if getattr(v, "op", None) == "placeholder" else None
                            for v in leaves]
        # CPU tensors the graph only returns: nested tensors' sequence-length tensors, empty CPU tensors that a
        # backward graph hands back; the program never reads them
        self.host_passed = frozenset(i for i, p in enumerate(placeholders) if _on_host(p)
                                     and all(user.op == "output" for user in p.users))
        self.out_aliases = _output_aliases(leaves)
        saved = _saved_for_backward(output, len(leaves))
        self.out_views, hidden = _output_views(leaves, placeholders, self.mutated, self.out_aliases, saved)
        # views of inputs the forward saves for the backward (each linear layer's `t(weight)`), which
        # AOTAutograd detaches: made detached at once (see _Program.run)
        self.saved_input_views = frozenset(j for j, ((kind, _), _) in self.out_views.items()
                                           if kind == "input" and j in saved)
        # intermediates the program returns only for outputs viewing them (dropped once those are made)
        self.hidden_bases = [node.name for node in hidden]
        self.out_sources += [None] * len(hidden)
        fakes = [getattr(v, "meta", {}).get("val") for v in leaves + hidden]
        # a result's dtype is the graph's, not its array's: complex32 is carried as complex64
        self.out_dtypes = [getattr(fake, "dtype", None) for fake in fakes]
        self.out_layouts = [_dense_layout(fake) for fake in fakes]
        self.default_device = _meta_device(gm)
        # a graph with collectives runs as one program of all its group's ranks (ops.collectives)
        self.group = collectives.group_of(gm)
        self.specialisations = {}
        # named by content, as the graph's executable is in XLA's program text and in profiles
        self.name = f"neuron_graph_{hashlib.sha256(gm.code.encode()).hexdigest()[:10]}"

    def graph_module(self) -> torch.fx.GraphModule:
        """The graph module, which a graph loaded from a precompiled function unpickles only when a program is
        traced (see `saved`)."""
        if self.gm is None:
            self.gm, self.load_graph = self.load_graph(), None
        return self.gm

    def digest(self):
        """The graph's part of its disk cache key (disk_cache.graph_digest), None for a graph not cached."""
        if self._digest is _UNKNOWN:
            self._digest = disk_cache.graph_digest(self.gm)
        return self._digest

    def saved(self) -> dict:
        """What a precompiled function keeps of a graph compiled whole besides the graph, which it saves on its own
        (backend.NeuronCode): the loading process unpickles the graph (its fake tensors were most of the load,
        0.2 s of a 1 s start for bench/compile_step.py's small transformer) only to trace a program the disk
        cache lacks. Only for a `portable` graph: one with collectives agrees with its group on each program it
        traces, and one whose ops the CPU refuses holds that error, which is found again from the graph rather
        than pickled."""
        state = dict(self.__dict__, gm=None, specialisations={}, out_spec=pytree.treespec_dumps(self.out_spec),
                     _digest=self.digest())
        state.pop("load_graph", None)
        return state

    @classmethod
    def from_saved(cls, state: dict, load_graph):
        """The graph `saved` kept, which unpickles its graph module with `load_graph()` when it needs it."""
        graph = cls.__new__(cls)
        graph.__dict__.update(state, out_spec=pytree.treespec_loads(state["out_spec"]), load_graph=load_graph)
        return graph

    @property
    def portable(self) -> bool:
        return self.refused is None and not self.group

    def __call__(self, args):
        if self.refused is not None:
            raise self.refused.with_traceback(None)  # one traceback per call, not one grown by each
        args = list(args)
        positions, statics, tensors = [], [], []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if i not in self.host_passed:
                    positions.append(i)
                    tensors.append(a)
            else:
                statics.append(a)
        resolve = None
        if math_bits.any_flagged(tensors):
            # the program reads storages: a lazily conjugated or negated input (x.conj(), a complex view's
            # imag) is read as the values it shows (views of it made by the program keep the original)
            resolve, originals = math_bits.Resolver(), tensors
            tensors = list(map(resolve, tensors))
        storages, views = storage_views(tensors)
        if storages is None:
            transfers.bring_to_device(tensors)
            for i, t in zip(positions, tensors):
                args[i] = t
            storages, views = storage_views(tensors)
        # as in eager: the views, which storage each reads, the storages' sizes and dtypes, and the float32
        # matmul precision
        key = (tuple(views), tuple(statics), float32_matmul_precision())
        program = self.specialisations.get(key)
        if program is None:
            counters["specialisations"] += 1
            if self.specialisations:
                counters["recompiles"] += 1
            if events.listening:
                events.signature("graph", self.name, key)
            program = self.specialisations[key] = _Program(self, args, positions, storages, views, key)
        outputs = program.run(args, storages)
        if resolve is not None:
            resolve.write_back({id(t) for i, t in zip(positions, originals) if i in self.mutated})
        if self.flat_output is not None:
            return self.flat_output(outputs)
        return pytree.tree_unflatten(outputs, self.out_spec)


def _flat_container(spec):
    """`tuple` or `list` if the graph returns a flat one (AOTAutograd's graphs do; None is a leaf), built
    directly: unflattening visits each output (50 us a call for a forward saving 95 activations)."""
    if spec.type in (tuple, list) and spec.num_leaves == spec.num_children == spec.num_nodes - 1:
        return spec.type
    return None


def _output_aliases(leaves) -> dict:
    """Outputs that are detach() or alias() of another output, by position: {alias: aliased}. AOTAutograd's
    forward graphs return a user output and, detached, the same value saved for the backward; one buffer
    serves both, as the two tensors share a storage (and a version counter) in PyTorch (a second buffer would
    double the memory)."""
    first = {}
    for j, leaf in enumerate(leaves):
        if isinstance(leaf, torch.fx.Node):
            first.setdefault(leaf, j)
    aliases = {}
    for j, leaf in enumerate(leaves):
        base = leaf
        while isinstance(base, torch.fx.Node) and base.op == "call_function" and base.target in views.ALIAS_OPS:
            base = base.args[0]
            if first.get(base, j) != j:
                aliases[j] = first[base]
                break
    for j, aliased in aliases.items():
        while aliased in aliases:  # to the output that is no alias
            aliased = aliases[aliased]
        aliases[j] = aliased
    return aliases


def _saved_for_backward(output, n_leaves) -> set:
    """Positions of the outputs AOTAutograd's forward graph saves for its backward, as its descriptors say."""
    descriptors = output.meta.get("desc") or []
    if len(descriptors) != n_leaves:
        return set()
    return {j for j, d in enumerate(descriptors) if type(d).__name__ == "SavedForBackwardsAOTOutput"}


def _output_views(leaves, placeholders, mutated, aliases, saved):
    """Outputs made as views at each run, as eager and Inductor make them, by position: {output: (base, [(view
    op's name, its other arguments, its keyword arguments), ...])}, names as a precompiled function pickles
    them; and the intermediates, not outputs themselves, that some of them view.

    A base is ("input", i), an input the graph does not write: AOTAutograd's forward saves `t(weight)` of
    every linear layer for the backward; made as a view of the input, it is no copy of the weight. Or
    ("output", k), an output of the program: another output (`y, y[1:]` alias as in eager, one buffer), or
    the k-th intermediate after the graph's outputs, for a view a buffer of its own would show otherwise (an
    expand, which its base holds with less memory; a slice or a strided view, whose strides and storage
    offset eager gives). Views of intermediates that are dense from their start and all of them (`view`,
    `transpose`) are the program's own buffers, laid out as they are (no view op at each run), and so are the
    views of outputs and intermediates that a forward graph saves for its backward (`saved`), which no user
    sees: making them at each run cost more than the copies (a small GPT's q, k and v, views of one
    projection: its compiled training step's median 80-82 -> 84-93 ms).

    A view's sizes may be symbolic (`y[:n]` in a dynamic graph): each such size is a result of the program too,
    a number fixed for its signature (`_SizeResult` in the chain, resolved by each program)."""
    first = {}
    for j, leaf in enumerate(leaves):
        if isinstance(leaf, torch.fx.Node):
            first.setdefault(leaf, j)
    views, hidden = {}, []

    def hidden_result(node) -> int:
        if node not in hidden:
            hidden.append(node)
        return len(leaves) + hidden.index(node)

    def size_results(value):
        return _SizeResult(hidden_result(value)) if isinstance(value, torch.fx.Node) else value

    for j, leaf in enumerate(leaves):
        chain, node = [], leaf
        while True:
            if _is_item_of_views(node):  # one view of a split's, an unbind's: the op, then the item
                chain.append((_ITEM, (node.args[1],), {}))
                node = node.args[0]
            elif not _is_static_view(node):
                break
            chain.append((node.target.name(), *pytree.tree_map(size_results, (node.args[1:], node.kwargs))))
            node = node.args[0]
        if not chain or j in aliases:
            continue
        if node.op == "placeholder":
            base = None if placeholders.index(node) in mutated else ("input", placeholders.index(node))
        elif j in saved:
            base = None
        elif node in first:
            base = ("output", first[node])
        elif _needs_its_base(leaf.meta.get("val"), node.meta.get("val")):
            base = ("output", hidden_result(node))
        else:
            base = None
        if base is not None:
            views[j] = (base, chain[::-1])
    return views, hidden


def _needs_its_base(view, base) -> bool:
    """Whether a view of an intermediate shows other memory than a buffer of its own laid out densely."""
    if not isinstance(view, torch.Tensor) or not isinstance(base, torch.Tensor):
        return False
    # of symbolic sizes, a view is made of its base unless it is dense from its start and all of it for every size
    return not (statically_known_true(view.storage_offset() == 0)
                and statically_known_true(view.numel() == base.numel()) and is_non_overlapping_and_dense_or_false(view))


def _is_static_view(node) -> bool:
    """A node viewing its first argument, a tensor, by arguments fixed for each input signature: constants, or
    sizes computed from the inputs' sizes (not from values the program computes)."""
    if not (isinstance(node, torch.fx.Node) and _is_op(node) and isinstance(node.args[0], torch.fx.Node)):
        return False
    returns = node.target._schema.returns
    if len(returns) != 1 or returns[0].alias_info is None or returns[0].alias_info.is_write:
        return False
    return all(_is_backed_size(a) for a in pytree.tree_leaves((node.args[1:], node.kwargs))
               if isinstance(a, torch.fx.Node))


def _is_item_of_views(node) -> bool:
    """`getitem(views, i)` of an op returning a list of views of its first argument (split, unbind, chunk)."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem):
        return False
    source = node.args[0]
    return _is_static_view(source) and isinstance(source.target._schema.returns[0].type, torch.ListType)


# a view chain's step taking one view of a list of them, by its name as a precompiled function pickles it
_ITEM = "getitem"


def _view_op(name):
    return operator.getitem if name == _ITEM else lookup_op(name)


def _is_backed_size(node) -> bool:
    """A symbolic integer of the graph whose value each input signature fixes (not one read from data)."""
    value = node.meta.get("val")
    return isinstance(value, torch.SymInt) and not free_unbacked_symbols(value)


class _SizeResult:
    """In a view's chain of arguments: the program's result at `position`, a symbolic size's value."""

    def __init__(self, position: int):
        self.position = position


def _cpu_dtype_refusal(gm):
    """The error of the first op whose CPU kernel refuses its dtypes, as eager raises it (eager.cpu_dtypes):
    asked once, here, of real CPU tensors (the compiler's fake mode is still on)."""
    with unset_fake_temporarily():
        for node in gm.graph.nodes:
            arguments = _concrete_arguments(node) if _is_op(node) else None
            if arguments is None:
                continue
            error = cpu_dtypes.refusal(node.target, *arguments)
            if error is not None:
                return error
    return None


def _cpu_error_of(node, failure):
    """The CPU kernel's error for a node whose lowering failed (input PyTorch refuses, which its meta kernel
    took: a reduction over an empty dimension), asked on zeros of its traced arguments as eager asks; None
    for symbolic sizes, a failure the CPU is not asked about, or when the CPU accepts them (the lowering's
    own error stands)."""
    if fallback.is_final(rules.rule(node.target), failure):
        return None
    with unset_fake_temporarily():
        arguments = _concrete_arguments(node)
        return None if arguments is None else fallback.cpu_error(node.target, *arguments)


def _concrete_arguments(node):
    """The node's traced arguments, for the CPU to be asked about on zeros of their sizes; None where a size
    is symbolic (a dynamic graph), which the CPU cannot run."""
    arguments = rules.traced_arguments(node)
    return None if any(_symbolic(leaf) for leaf in pytree.tree_leaves(arguments)) else arguments


def _symbolic(value) -> bool:
    """A symbolic number, or a tensor whose sizes or strides are symbolic."""
    if isinstance(value, torch.Tensor):
        return any(isinstance(v, torch.SymInt) for v in (*value.shape, *value.stride()))
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _is_op(node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)


def _mutated_inputs(gm, placeholders) -> set:
    """Indices of inputs the graph writes (AOTAutograd keeps such writes as copy_ onto the input)."""
    mutated = set()
    for node in gm.graph.nodes:
        if not _is_op(node):
            continue
        for target in registry.written_arguments(node.target, node.args, node.kwargs):
            if target in placeholders:
                mutated.add(placeholders.index(target))
    return mutated


def _on_host(placeholder) -> bool:
    value = placeholder.meta.get("val")
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


def _meta_device(gm) -> int:
    """The device of a graph without tensor inputs (a graph of factories): where its outputs live."""
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device.index or 0
    return 0


def _dense_layout(fake):
    """(shape, strides, order of the dimensions, outermost first) of an output whose fake tensor lays it out
    densely but not row-major (channels-last, a transpose): its program writes it so, as Inductor's programs
    and the eager ops do, for code that reads the layout (`y.permute(0, 2, 3, 1).view(...)`, `is_contiguous`).
    Of symbolic sizes, the sizes Dynamo traced with stand for them, and the order gives the strides of the
    others. None for the rest, made contiguous: those laid out row-major, and views into a larger intermediate
    or expanded ones, which would carry memory they do not show."""
    if not isinstance(fake, torch.Tensor):
        return None
    shape, stride = (tuple(_hint(v) for v in values) for values in (fake.shape, fake.stride()))
    if None in shape + stride or is_contiguous(shape, stride):
        return None
    if not is_non_overlapping_and_dense_or_false(torch.empty_strided(shape, stride, device="meta")):
        return None
    return shape, stride, tuple(sorted(range(len(shape)), key=lambda d: -stride[d]))


def _hint(size):
    """A size's value, or for a symbolic one the value Dynamo traced with (None if it has none)."""
    return size.node.hint if isinstance(size, torch.SymInt) else size


def _output_strides(dense_layout, shape) -> tuple:
    """An array output's strides: its fake tensor's dense layout where it has one (for another shape, in the
    same order of dimensions), else row-major."""
    if dense_layout is None:
        return contiguous_strides(shape)
    traced_shape, traced_strides, order = dense_layout
    if traced_shape == tuple(shape):
        return traced_strides
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _output_specs(array_outputs, device_index: int) -> list:
    """(position, view spec) of each array output, built once: outputs are made at every call."""
    return [(j, (tuple(shape), tuple(stride), 0, dtype, device_index)) for j, shape, stride, dtype in array_outputs]


_ALIAS = torch.ops.aten.detach.default


def _sized(views, constants) -> dict:
    """Output views with their symbolic sizes' values for one signature (the program returned them as
    constants)."""
    def value(argument):
        return constants[argument.position] if type(argument) is _SizeResult else argument

    return {j: (base, [(op, *pytree.tree_map(value, (args, kwargs))) for op, args, kwargs in chain])
            for j, (base, chain) in views.items()}


class _Program:
    """The storage program for one input signature, and how to turn its results into tensors."""

    def __init__(self, graph: CompiledGraph, args, positions, storages, views, signature):
        specs = [view[0] for view in views]
        pattern = [view[1] for view in views]
        devices = {spec[4] for spec in specs}
        if len(devices) > 1:
            raise RuntimeError(f"torchneuron: a compiled graph got tensors on several devices: {sorted(devices)}")
        self.device_index = devices.pop() if devices else graph.default_device
        self.random = graph.random
        self.sources = graph.out_sources
        # what tracing tells: outputs that are arrays (with their shapes), and the rest, fixed for this
        # signature (symbolic sizes saved for the backward, None gradients)
        array_outputs, constants = [], {}
        # the device-side checks of its ops (ops.checks: an index in range, a matrix that inverts), each an extra
        # result read at the next synchronisation, as eager's (each process's own in a program of several)
        check_errors = []
        # the non-tensor arguments only: the program outlives this call's tensors, which must not stay alive
        statics = [None if isinstance(a, torch.Tensor) else a for a in args]
        sources, dtypes, layouts = graph.out_sources, graph.out_dtypes, graph.out_layouts
        self.aliases = aliases = graph.out_aliases
        self.saved_input_views, self.saved_view_specs = graph.saved_input_views, {}
        views = {j: (base, [(_view_op(name), *arguments) for name, *arguments in chain])
                 for j, (base, chain) in graph.out_views.items()}
        self.n_outputs = len(sources) - len(graph.hidden_bases)
        mutated_inputs = [k for k, i in enumerate(positions) if i in graph.mutated]

        def compute(values, extras):
            array_outputs.clear()  # filled anew by each trace
            constants.clear()
            inputs = list(statics)
            for k, i in enumerate(positions):
                inputs[i] = values[k]
            with checks.collecting() as conditions:
                outputs, finals, bases = run_graph_with_inputs(graph.graph_module(), inputs,
                                                               rng.key_from(extras[0]) if extras else None,
                                                               graph.hidden_bases, _cpu_error_of)
            check_errors[:] = [(error, message) for _, error, message in conditions]
            arrays = []
            for j, (value, source) in enumerate(zip(pytree.tree_leaves(outputs) + bases, sources)):
                if source is not None or j in aliases or j in views:
                    continue
                if isinstance(value, jax.Array):
                    stride = _output_strides(layouts[j], value.shape)
                    array_outputs.append((j, value.shape, stride, dtypes[j] or to_torch(value.dtype)))
                    arrays.append(lay_out(value, value.shape, stride))
                else:
                    constants[j] = value
            return arrays + [c for c, _, _ in conditions], {k: finals[positions[k]] for k in mutated_inputs}

        self.program = StorageProgram(specs, pattern, storages, mutated_inputs, compute, graph.name)
        self.op, self.ran = graph.name, True  # compiled ahead of its first run (what events.launch reads)
        self.mesh = self.agree = None
        if graph.group:
            group = collectives.program_group(graph.group, self.device_index)
            self.mesh, self.agree = group.mesh, group.agree
            # ranks compiling different programs would run mismatched collectives: compare first
            group.agree(f"compiled graph {graph.name} on {[spec[:4] for spec in specs]}")

        # a stand-in key: compiling must not advance the generator, or a cold run would draw other numbers
        avals = self.program.avals([jax.ShapeDtypeStruct((4,), np.uint32)] if self.random else [])
        if self.mesh is not None:
            # a program of several processes is compiled by each of them for its own device, not cached on disk
            counters["xla_compiles"] += 1
            self.executable = self.compiled = self.program.over_mesh(self.mesh, avals)
            self.constants, self.check_errors = constants, check_errors
            self.output_specs = _output_specs(array_outputs, self.device_index)
            self.views = _sized(views, constants)
            return

        def export():
            jitted = self.program.jit(self.device_index)
            try:
                return jax.export.export(jitted)(*avals), (array_outputs, constants, check_errors)
            except Exception:  # a program export cannot express: compiled (and traced) below, not stored
                return None, (array_outputs, constants, check_errors)

        def compile(exported):
            # compiled now (through JAX's persistent cache), so that a failure surfaces here
            program = self.program.jit(self.device_index, exported.call if exported is not None else None)
            return program.trace(*avals).lower().compile()

        self.executable, (array_outputs, self.constants, self.check_errors), stored_at = disk_cache.load_or_compile(
            graph.digest(), signature, graph.name, self.device_index, export, compile)
        self.compiled = self.executable
        if stored_at is not None:
            self.compiled = functools.partial(self._first_run_from_disk, stored_at, lambda: compile(None))
        self.output_specs = _output_specs(array_outputs, self.device_index)
        self.views = _sized(views, self.constants)

    @property
    def argument_storages(self) -> list:
        return self.program.argument_storages

    @functools.cached_property
    def output_sizes(self) -> list:
        return [math.prod(out.shape) for out in self.executable.out_info]

    def _first_run_from_disk(self, path, recompile, *flat):
        """An executable loaded from disk runs first through `run_first`, which compiles the graph's program
        afresh if it cannot run."""
        self.executable, results = compilation_cache.run_first(path, self.executable, flat, recompile)
        self.compiled = self.executable
        return results

    def run(self, args, storages):
        queue = adaptive.current()
        extras = [rng.next_key(self.device_index)] if self.random else []
        # no thread may queue a read of a buffer this program donates until its storage holds the new one
        with queue.lock:
            if queue.capture is not None:
                # a graph capture (torch.neuron.graph) records the program with the eager ops around it, as it
                # records eager executables
                if self.mesh is not None:
                    queue.capture.spans(self.mesh, self.agree, f"the compiled graph {self.op}")
                results = queue.record(self, storages, extras)
            else:
                results = self._launch(storages, extras)
            if self.check_errors:
                n_checks = len(self.check_errors)
                pending_checks.add(self.device_index, self.op, results[-n_checks:], self.check_errors)
                results = results[:-n_checks]
            n_written = len(self.program.written_storages)
            for p, buffer in zip(self.program.written_storages, results):
                storages[p].buffer = buffer
        outputs = [None if source is None else args[source] for source in self.sources]
        for j, value in self.constants.items():
            outputs[j] = value
        for (j, spec), array in zip(self.output_specs, results[n_written:]):
            outputs[j] = new_tensor(array, spec)
        for j, ((kind, index), chain) in self.views.items():
            view = args[index] if kind == "input" else outputs[index]
            saved_spec = self.saved_view_specs.get(j)
            if saved_spec is not None:
                # what AOTAutograd makes of the view it saves, its detached alias, for a tenth of the view op
                # and the detach: the view's place in the input, fixed for this signature, from the first run
                outputs[j] = wrap(view._storage, *saved_spec, versions_of=view)
                math_bits.copy_bits(None, view, outputs[j])
                continue
            for op, view_args, view_kwargs in chain:
                view = op(view, *view_args, **view_kwargs)
            if j in self.saved_input_views:
                self.saved_view_specs[j] = view._spec[:4]
            outputs[j] = view
        for j, aliased in self.aliases.items():
            # through autograd: the alias shares its output's version counter, as in eager, so that writing
            # in place to a user output whose alias the backward saved raises instead of a wrong gradient
            outputs[j] = _ALIAS(outputs[aliased])
        del outputs[self.n_outputs:]
        return outputs

    def _launch(self, storages, extras) -> list:
        adaptive.current().flush()  # queued ops come first, and may read buffers this program donates
        flat = self.program.buffers_of(storages) + extras
        if self.program.written_storages:
            adaptive.run_readers(flat[: len(self.program.written_storages)])  # so may another thread's
        results = events.launch(self, flat) if events.listening else self.compiled(*flat)
        if results:
            sync.launched(self.device_index, results[-1])
        return results
