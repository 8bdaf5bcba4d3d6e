"""The lowering table as its readers see it: one rule per op, and FX graphs run through the rules.

The registry holds the table as it is registered (lowerings and their flags); `rule(op)` reads it once
per op overload, so the rules that combine its parts (a mutating op computes through its functional
variant, a random lowering takes a key, float scalars stay traced...) are written here and only here.
An op without a lowering gets PyTorch's decomposition, traced to an FX graph and run through the rules
of its nodes by `run_graph`, the interpreter torch.compile's graphs use too (hence one module: a rule's
lowering may run a graph, whose nodes have rules).
"""
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import torch
import torch.fx

from ..runtime.dtypes import convert_to, tensor_to_numpy
from . import collectives, registry


@dataclass(frozen=True, eq=False)
class OpRule:
    op: torch._ops.OpOverload
    # the functional op computing what `op` returns and writes: `op` itself, or for an in-place or out= op
    # its functional variant (None when there is none)
    target: torch._ops.OpOverload | None
    lowering: object  # function of JAX arrays for `target`: registered, or PyTorch's decomposition traced
    mutated: tuple  # names of the arguments `op` writes
    out: bool  # writes keyword-only out= arguments (not `self`)
    random: bool  # the lowering takes a PRNG key first
    traced_floats: bool  # float arguments are traced scalars (a new value does not recompile)
    dynamic_shape: bool  # output shapes depend on the data: run outside any compiled program
    cpu_forced: bool  # torchneuron.library.force_cpu
    checked_outputs: bool  # a library lowering: its outputs are checked against the fake kernel
    meta: object  # output metadata (and PyTorch's errors for bad input) of `op`
    # the CPU's errors `op`'s meta kernel lacks (registry.checked_meta), for graphs' nodes, or None
    check: object
    # an out= op that computes in its out tensor's dtype when not given one (the CPU's sums and products)
    dtype_from_out: bool = False
    # refuses an input sharing some but not all of the elements it writes (TensorIterator's check: pointwise
    # ops and copy_)
    refuses_partial_overlap: bool = False
    # a collective's lowering, only for programs mapped over its process group (ops.collectives)
    collective: object = None

    @property
    def compiles(self) -> bool:
        """Whether the op runs inside a compiled program (eager executable, fused queue, compiled graph)."""
        return self.lowering is not None and not self.dynamic_shape and not self.cpu_forced


_RULES = {}


def rule(op: torch._ops.OpOverload) -> OpRule:
    found = _RULES.get(op)
    if found is None:
        found = _RULES[op] = _build(op)
    return found


def _build(op) -> OpRule:
    mutated = tuple(registry.mutated_arguments(op))
    target = registry.functional_variant(op) if mutated else op
    lowering = lowering_for(target) if target is not None else None
    return OpRule(
        op=op,
        target=target,
        lowering=lowering,
        mutated=mutated,
        out=registry.is_out(op),
        random=target is not None and registry.is_random(target),
        traced_floats=target in registry.LOWERINGS and target not in registry.STATIC_SCALAR_OPS,
        dynamic_shape=op in registry.DYNAMIC_SHAPE_OPS or target in registry.DYNAMIC_SHAPE_OPS,
        cpu_forced=op in registry.CPU_FORCED,
        checked_outputs=op in registry.CHECKED_OUTPUTS or target in registry.CHECKED_OUTPUTS,
        meta=registry.META.get(op, op),
        check=registry.argument_check(op),
        dtype_from_out=registry.is_out(op) and op.overloadpacket in _ACCUMULATE_IN_OUT_DTYPE,
        refuses_partial_overlap=torch.Tag.pointwise in op.tags or op is torch.ops.aten.copy_.default,
        collective=collectives.LOWERINGS.get(op),
    )


# their out= overloads accumulate in the out tensor's dtype unless given `dtype` (the structured kernels' meta
# functions read it from the output)
_ACCUMULATE_IN_OUT_DTYPE = {torch.ops.aten.sum, torch.ops.aten.nansum, torch.ops.aten.prod, torch.ops.aten.cumsum,
                            torch.ops.aten.cumprod}


def forget() -> None:
    """After the table changed (torchneuron.library): every rule is read again."""
    _RULES.clear()
    forget_decompositions()


@functools.cache
def _decomposition_table():
    """PyTorch's decompositions and its core ATen set, for the ops the lowering table lacks: what a traced
    decomposition may decompose further."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(decomposition_table)
    table.update(core_aten_decompositions())
    return {op: fn for op, fn in table.items() if op not in registry.LOWERINGS}


@functools.cache
def _core_decomposed():
    from torch._decomp import _core_aten_decompositions_post_autograd

    return frozenset(_core_aten_decompositions_post_autograd())


def _decomposition_of(op):
    """`_decomposition_table().get(op)`, found for this op alone: building the table walks every
    CompositeImplicitAutograd op of every namespace (a tenth of a second of a warm start, where only an op
    without a lowering, such as .item()'s, asks)."""
    from torch._decomp import decomposition_table
    from torch._export.utils import _get_decomp_for_cia, _is_preservable_cia_op
    from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS

    if op in registry.LOWERINGS:
        return None
    # as core_aten_decompositions(): a functional composite op decomposes into its kernel's ops unless the core
    # set or the ops export preserves name it
    if op not in _core_decomposed() and op not in PRESERVED_ATEN_CIA_OPS and _is_preservable_cia_op(op):
        return _get_decomp_for_cia(op)
    return decomposition_table.get(op)


def _example(value):
    if isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer):
        from ..runtime.dtypes import to_torch

        return torch.empty(value.shape, dtype=to_torch(value.dtype))
    return value


def _decomposed(op, decomposition):
    def run(key, args, kwargs):
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        is_array = [isinstance(v, (jax.Array, jax.core.Tracer)) for v in flat]
        return run_graph(_decomposition_graph(decomposition, flat, spec, is_array),
                         [v for v, a in zip(flat, is_array) if a], key=key)

    if registry.is_random(op):
        def lowering(key, *args, **kwargs):
            return run(key, args, kwargs)
    else:
        def lowering(*args, **kwargs):
            return run(None, args, kwargs)

    return lowering


_GRAPHS = {}  # a decomposition and its arguments' signature -> its graph
_GRAPHS_KEPT = 1024


def _decomposition_graph(decomposition, flat, spec, is_array) -> torch.fx.GraphModule:
    """`decomposition` traced by make_fx for these arguments (the arrays' shapes and dtypes, the other values):
    once per signature, as adaptive eager traces each queued op's program again in its fused program. The settings
    decompositions read (the default dtype, deterministic algorithms) are part of the signature."""
    try:
        signature = (decomposition, spec, torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
                     tuple((v.shape, v.dtype) if a else _constant_key(v) for v, a in zip(flat, is_array)))
        gm = _GRAPHS.get(signature)
    except TypeError:  # an argument that is no plain value (a tensor, held by the graph as it is): traced each time
        signature = gm = None
    if gm is None:
        from torch.fx.experimental.proxy_tensor import make_fx

        examples = [_example(v) for v, a in zip(flat, is_array) if a]

        def traced(*tensors):
            feed = iter(tensors)
            filled = [next(feed) if a else v for v, a in zip(flat, is_array)]
            call_args, call_kwargs = torch.utils._pytree.tree_unflatten(filled, spec)
            return decomposition(*call_args, **call_kwargs)

        gm = make_fx(traced, decomposition_table=_decomposition_table(), tracing_mode="fake")(*examples)
        if signature is not None:
            if len(_GRAPHS) >= _GRAPHS_KEPT:
                _GRAPHS.clear()
            _GRAPHS[signature] = gm
    return gm


def _constant_key(value):
    """A value baked into a traced graph, as a key: a float by its bits (-0.0 is not 0.0, and nan is nan); a tensor
    is refused (TypeError), as it may change after the graph took it."""
    if isinstance(value, torch.Tensor):
        raise TypeError("a tensor is no constant")
    return (float, value.hex()) if type(value) is float else (type(value), value)


def decomposed(op):
    """PyTorch's decomposition of `op` as a lowering, also for an op whose registered lowering covers
    only some of its arguments."""
    from torch._decomp import decomposition_table

    return _decomposed(op, decomposition_table[op])


_DECOMPOSED = {}


def forget_decompositions() -> None:
    """After the lowering table changed: decompositions are used only for ops it lacks."""
    _DECOMPOSED.clear()
    _GRAPHS.clear()
    _decomposition_table.cache_clear()


def lowering_for(op):
    """The JAX lowering of a functional op: registered, else traced from PyTorch's decomposition, else None."""
    fn = registry.LOWERINGS.get(op)
    if fn is not None:
        return fn
    if op in _DECOMPOSED:
        return _DECOMPOSED[op]
    decomposition = _decomposition_of(op)
    fn = _decomposed(op, decomposition) if decomposition is not None else None
    _DECOMPOSED[op] = fn
    return fn


class MissingLowering(NotImplementedError):
    def __init__(self, op):
        self.op = op
        super().__init__(
            f"torchneuron: no lowering for {op}. Please report it at the project's issue tracker "
            "with the op name; meanwhile eager mode runs it on the CPU."
        )


def _cast_like(value, meta):
    if isinstance(meta, torch.Tensor) and hasattr(value, "dtype"):
        return convert_to(value, meta.dtype)
    return value


def _like_meta(value, meta):
    """A higher-order op's results in the structure and dtypes of its fake results (nested tuples, None
    where PyTorch gives no tensor: a gradient nothing asked for)."""
    if isinstance(meta, (tuple, list)):
        return tuple(_like_meta(v, m) for v, m in zip(value, meta))
    return None if meta is None else _cast_like(value, meta)


def traced_arguments(node: torch.fx.Node):
    """A node's (args, kwargs) as the graph was traced: its input nodes' fake values."""
    return torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))


def run_graph(gm: torch.fx.GraphModule, inputs, key=None):
    return run_graph_with_inputs(gm, inputs, key)[0]


def run_graph_with_inputs(gm: torch.fx.GraphModule, inputs, key=None, also=(), on_failure=None):
    """The graph's outputs, the final value of each input (inputs the graph mutates change), and the values of
    the nodes named in `also`. A node whose lowering raises raises `on_failure(node, failure)` instead, if that
    gives an exception."""
    env = {}
    feed = iter(inputs)
    placeholders = []
    for index, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            env[node] = next(feed)
            placeholders.append(node)
        elif node.op == "get_attr":
            env[node] = _constant(getattr(gm, node.target))
        elif node.op == "call_function":
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            target = node.target
            if not isinstance(target, torch._ops.OpOverload):
                # a higher-order op with a lowering (flex attention: its subgraphs are arguments), else getitem
                # and the arithmetic of symbolic sizes, plain Python on static values
                lowering = registry.LOWERINGS.get(target)
                env[node] = target(*args, **kwargs) if lowering is None else _like_meta(lowering(*args, **kwargs),
                                                                                        node.meta.get("val"))
                continue
            op = rule(target)
            lowering = op.lowering if op.lowering is not None else op.collective
            if lowering is None:
                raise MissingLowering(target)
            if op.check is not None:
                fake_args, fake_kwargs = traced_arguments(node)
                op.check(*fake_args, **fake_kwargs)
            if op.random:
                args = (jax.random.fold_in(key, index), *args)
            try:
                out = lowering(*args, **kwargs)
            except Exception as failure:
                error = on_failure and on_failure(node, failure)
                if error is None:
                    raise
                raise error from None
            meta = node.meta.get("val")
            registry.check_outputs(target, out, meta)
            if isinstance(out, (tuple, list)) and isinstance(meta, (tuple, list)):
                cast = [_cast_like(o, m) for o, m in zip(out, meta)]
                out = cast if isinstance(out, list) else tuple(cast)  # return_types become plain tuples
            else:
                out = _cast_like(out, meta)
            env[node] = out
            if op.mutated:
                # rebind the mutated node to its new value: later uses, and the caller, see the write
                _rebind_mutated(node, target, op.mutated, out, env)
        elif node.op == "output":
            outputs = torch.fx.node.map_arg(node.args[0], env.__getitem__)
            values_by_name = {n.name: value for n, value in env.items()} if also else {}
            return outputs, [env[p] for p in placeholders], [values_by_name[name] for name in also]
    raise AssertionError("graph has no output node")


def _constant(value):
    if isinstance(value, torch.Tensor):
        return jnp.asarray(tensor_to_numpy(value.cpu()))
    return value


def _rebind_mutated(node, target, mutated, out, env):
    names = [a.name for a in target._schema.arguments]
    values = out if isinstance(out, (tuple, list)) else [out]
    for name, value in zip(mutated, values[len(values) - len(mutated):]):
        position = names.index(name)
        source = node.kwargs.get(name, node.args[position] if position < len(node.args) else None)
        if isinstance(source, torch.fx.Node):
            env[source] = value
    env[node] = values[-len(mutated)] if len(values) == len(mutated) else out


def vjp(forward, grad, primals, *args):
    """The vjp of `forward` (a lowering, or an op whose lowering may be a traced PyTorch decomposition)."""
    if isinstance(forward, torch._ops.OpOverload):
        forward = lowering_for(forward)
    _, pullback = jax.vjp(lambda *p: forward(*p, *args), *primals)
    return pullback(grad.astype(primals[0].dtype))
