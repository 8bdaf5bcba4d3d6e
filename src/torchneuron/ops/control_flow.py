"""Higher-order ops on neuron: control flow (`torch.cond`, `while_loop`), nested compile regions, and the
rule that runs any other one op by op.

Eagerly, a higher-order op reaches a tensor subclass only through a rule registered for the subclass; each
runs PyTorch's own dense rule (its CompositeExplicitAutograd kernel: the predicate read on the host, then the
branch, loop body or subgraph as ordinary ops). `torch.cond` and `while_loop` get it at import, as eager code
calls them; any other (scan, map, a mutating custom op's auto_functionalized) when a compiled graph that
cannot lower it runs it between its compiled pieces (`dense_rule_for_neuron`). In a compiled graph `cond`
and `while_loop` become XLA's own control flow (`lax.cond`, `lax.while_loop`) and a nested compile region
its subgraph, in the graph's program, run through the lowering table: a data-dependent predicate costs no
host round trip and no graph break. `with_effects`, which orders an effectful op (`_linalg_check_errors`
after torch.linalg's factorizations and solvers), is that op's lowering in the program.
"""
import jax.numpy as jnp
from jax import lax
from torch._C import DispatchKey
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.effects import with_effects
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph
from torch._higher_order_ops.while_loop import while_loop_op

from ..runtime.tensor import NeuronTensor
from . import checks
from .registry import lower
from .rules import lowering_for, run_graph


def dense_rule_for_neuron(hop) -> None:
    """PyTorch's dense rule of `hop` as its rule for neuron tensors, which it otherwise lacks ("no rule
    registered for HOP ... and subclass")."""
    dense = hop.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
    if dense is not None and NeuronTensor not in hop.python_key_table:
        hop.py_impl(NeuronTensor)(dense)


dense_rule_for_neuron(cond_op)
dense_rule_for_neuron(while_loop_op)


def _outputs(graph, values) -> tuple:
    with checks.unchecked():
        out = run_graph(graph, list(values))
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _flag(value):
    return jnp.asarray(value, dtype=bool).reshape(())


@lower(cond_op)
def cond(pred, true_graph, false_graph, operands):
    return lax.cond(_flag(pred), lambda values: _outputs(true_graph, values),
                    lambda values: _outputs(false_graph, values), tuple(operands))


@lower(while_loop_op)
def while_loop(cond_graph, body_graph, carried_inputs, additional_inputs):
    additional = tuple(additional_inputs)

    def step(carried):
        # the body's results carried with the carried values' dtypes, as the loop requires of every iteration
        return tuple(jnp.asarray(new, dtype=old.dtype) for new, old in zip(_outputs(body_graph, carried + additional),
                                                                           carried))

    return lax.while_loop(lambda carried: _flag(_outputs(cond_graph, carried + additional)[0]), step,
                          tuple(jnp.asarray(c) for c in carried_inputs))


@lower(invoke_subgraph)
def nested_compile_region(subgraph, identifier, *operands):
    return _outputs(subgraph, operands)


@lower(with_effects)
def effects(token, op, *args, **kwargs):
    """The op run in the program, which keeps the graph's order; the token (None when the graph runs: AOTAutograd
    passes none) goes through."""
    out = lowering_for(op)(*args, **kwargs)
    return (token, *out) if isinstance(out, tuple) else (token, out)
