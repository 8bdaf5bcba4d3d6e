"""Higher-order ops on neuron: control flow (`torch.cond`, `while_loop`, `scan`, `map`), nested compile
regions, and the rule that runs any other one op by op.

Eagerly, a higher-order op reaches a tensor subclass only through a rule registered for the subclass; each
runs PyTorch's own dense rule (its CompositeExplicitAutograd kernel: the predicate read on the host, then the
branch, loop body or subgraph as ordinary ops), as the CPU and CUDA do: every higher-order op PyTorch has
defined gets it when the lowering table is imported (`dense_rules_for_neuron`: `torch.cond`, `while_loop`,
`scan`, `map`, `associative_scan`, `print`, `out_dtype`, ...), one defined later when a compiled graph that
cannot lower it runs it between its compiled pieces. In a compiled graph `cond`, `while_loop`, `scan` and
`map` become XLA's own control flow (`lax.cond`, `lax.while_loop`, `lax.scan`), and a nested compile region,
a `hints_wrapper` or a `foreach_map` its subgraph, in the graph's program, run through the lowering table: a
data-dependent predicate costs no host round trip and no graph break, a scan or map no op-by-op loop.
`with_effects`, which orders an effectful op (`_linalg_check_errors` after torch.linalg's factorizations and
solvers), is that op's lowering in the program; one without a lowering (`print`) runs between pieces.
"""
import jax
import jax.numpy as jnp
from jax import lax
from torch._C import DispatchKey
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.effects import with_effects
from torch._higher_order_ops.foreach_map import _foreach_map
from torch._higher_order_ops.hints_wrap import hints_wrapper
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph
from torch._higher_order_ops.map import map_impl
from torch._higher_order_ops.out_dtype import out_dtype
from torch._higher_order_ops.scan import scan_op
from torch._higher_order_ops.while_loop import while_loop_op
from torch._ops import _higher_order_ops

from ..runtime.dtypes import to_jax
from ..runtime.tensor import NeuronTensor
from . import checks, promotion
from .registry import lower
from .rules import lowering_for, run_graph


def dense_rule_for_neuron(hop) -> None:
    """PyTorch's dense rule of `hop` as its rule for neuron tensors, which it otherwise lacks ("no rule
    registered for HOP ... and subclass")."""
    dense = hop.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
    if dense is not None and NeuronTensor not in hop.python_key_table:
        hop.py_impl(NeuronTensor)(dense)


def dense_rules_for_neuron() -> None:
    """PyTorch's dense rule for neuron tensors of every higher-order op defined so far that has none of ours."""
    for hop in list(_higher_order_ops.values()):
        dense_rule_for_neuron(hop)


def _outputs(graph, values) -> tuple:
    out = run_graph(graph, list(values))
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _checks_of(graph, values) -> list:
    """The checks `graph` makes, as `collecting` finds them ((condition, error_type, message)), with
    `condition` a shape: found by tracing it aside, as a branch or loop body must return them as values
    of a structure fixed before it is traced."""
    found = []

    def trace(values):
        with checks.collecting() as conditions:
            _outputs(graph, values)
        found.extend((jax.ShapeDtypeStruct(c.shape, c.dtype), error, message) for c, error, message in conditions)
        return ()

    jax.eval_shape(trace, tuple(jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in values))
    return found


def _checked(graph, slots):
    """`graph` returning its outputs and a value for each check slot: its own checks' conditions in its own
    slots (each slot's owner is a graph), `checks.held` in the others'."""
    def run(values):
        with checks.collecting() as conditions:
            out = _outputs(graph, values)
        mine = iter(conditions)
        return out, tuple(next(mine)[0] if owner is graph else checks.held(shape) for owner, (shape, *_) in slots)
    return run


def _report(conditions, slots) -> None:
    """The conditions an inner trace returned for `slots`, for the enclosing program."""
    checks.report((condition, error, message) for condition, (_, (_, error, message)) in zip(conditions, slots))


def _flag(value):
    return jnp.asarray(value, dtype=bool).reshape(())


@lower(cond_op)
def cond(pred, true_graph, false_graph, operands):
    """The branch that runs reports its checks; the other's hold."""
    operands = tuple(operands)
    slots = [(graph, check) for graph in (true_graph, false_graph) for check in _checks_of(graph, operands)
             ] if checks.collected() else []
    out, conditions = lax.cond(_flag(pred), _checked(true_graph, slots), _checked(false_graph, slots), operands)
    _report(conditions, slots)
    return out


@lower(while_loop_op)
def while_loop(cond_graph, body_graph, carried_inputs, additional_inputs):
    """The checks are carried through the loop, each keeping its first failure: the body's, and the
    predicate's, whose test lax's loop condition cannot return (it returns the predicate alone): the first
    test is made again before the loop, each later one again at the end of the iteration before it."""
    additional = tuple(additional_inputs)
    carried = tuple(jnp.asarray(c) for c in carried_inputs)
    slots = [(graph, check) for graph in (body_graph, cond_graph) for check in _checks_of(graph, carried + additional)
             ] if checks.collected() else []
    body, next_test = _checked(body_graph, slots), _checked(cond_graph, slots)
    tests_checked = any(owner is cond_graph for owner, _ in slots)
    if tests_checked:
        _outputs(cond_graph, carried + additional)  # in this program's trace, which keeps its checks

    def step(state):
        values, conditions = state
        new, found = body(values + additional)
        # the body's results carried with the carried values' dtypes, as the loop requires of every iteration
        new = tuple(jnp.asarray(n, dtype=old.dtype) for n, old in zip(new, values))
        if tests_checked:
            found = tuple(map(checks.first_failure, found, next_test(new + additional)[1]))
        return new, tuple(map(checks.first_failure, conditions, found))

    def predicate(state):
        with checks.unchecked():
            return _flag(_outputs(cond_graph, state[0] + additional)[0])

    start = tuple(checks.held(shape) for _, (shape, *_) in slots)
    out, conditions = lax.while_loop(predicate, step, (carried, start))
    _report(conditions, slots)
    return out


@lower(scan_op)
def scan(combine_graph, init, xs, additional_inputs):
    """The combine graph maps (carry, slice) to (new carry, this step's outputs), which are stacked."""
    carry = tuple(jnp.asarray(c) for c in init)
    if not xs:
        return carry  # nothing to scan: PyTorch's dense rule returns the initial carry
    carry, stacked = _over_leading_axis(combine_graph, carry, tuple(xs), tuple(additional_inputs))
    return carry + stacked


@lower(map_impl)
def map_op(body_graph, xs, pos_args):
    """A scan without a carry: each slice's outputs, stacked."""
    return list(_over_leading_axis(body_graph, (), tuple(xs), tuple(pos_args))[1])


def _over_leading_axis(graph, carry, xs, additional):
    """One loop (lax.scan) over the leading axis of `xs` (PyTorch's scan and map have moved the mapped dim
    there), `graph(*carry, *slices, *additional)` giving the new carry, then the step's outputs to stack. Its
    checks are carried through the loop as while_loop carries them, each keeping its first failure."""
    first = tuple(x[0] for x in xs)
    slots = [(graph, check) for check in _checks_of(graph, carry + first + additional)] if checks.collected() else []
    body = _checked(graph, slots)

    def step(state, sliced):
        values, conditions = state
        out, found = body(values + tuple(sliced) + additional)
        # the new carry with the initial one's dtypes, as the loop requires of every iteration
        new = tuple(jnp.asarray(n, dtype=old.dtype) for n, old in zip(out, values))
        return (new, tuple(map(checks.first_failure, conditions, found))), tuple(out[len(values):])

    start = tuple(checks.held(shape) for _, (shape, *_) in slots)
    (carry, conditions), stacked = lax.scan(step, (carry, start), xs)
    _report(conditions, slots)
    return carry, stacked


@lower(invoke_subgraph)
def nested_compile_region(subgraph, identifier, *operands):
    """Run inline, in the enclosing program's trace, which keeps its checks."""
    return _outputs(subgraph, operands)


@lower(_foreach_map)
def foreach_map(subgraph, *operands, **inductor_options):
    """Its subgraph is the whole loop over the lists (PyTorch's dense rule calls it so); the keyword options
    some releases pass are for Inductor's fusion."""
    return _outputs(subgraph, operands)


@lower(hints_wrapper)
def hinted(body_graph, args, kwargs, hints):
    """The hints are for Inductor's scheduling; the body runs inline."""
    return _outputs(body_graph, tuple(args))


@lower(out_dtype)
def with_out_dtype(op, output_dtype, *args):
    """As PyTorch's dense rule computes it off CUDA: the arguments in the promotion of their dtypes and the
    output's (int8 products in int32, bfloat16 ones in float32), the result in the output dtype."""
    # the output dtype as a one-element tensor, which promotes as a full one (a 0-d tensor would give way)
    compute, _ = promotion.dtypes(*(a for a in args if promotion.is_array(a)), jnp.zeros((1,), to_jax(output_dtype)))
    casted = [promotion.cast(a, compute) if promotion.is_array(a) else a for a in args]
    return promotion.cast(lowering_for(op)(*casted), to_jax(output_dtype))


@lower(with_effects)
def effects(token, op, *args, **kwargs):
    """The op run in the program, which keeps the graph's order; the token (None when the graph runs: AOTAutograd
    passes none) goes through."""
    out = lowering_for(op)(*args, **kwargs)
    return (token, *out) if isinstance(out, tuple) else (token, out)
