"""Control flow on neuron: `torch.cond` and `while_loop`, eager and compiled.

Eager, each runs PyTorch's own dense implementation (the predicate read on the host, then the branch or
the loop body as ordinary ops): a higher-order op reaches a tensor subclass's kernel only through a rule
registered for the subclass. In a compiled graph each becomes XLA's own control flow (`lax.cond`,
`lax.while_loop`) in the graph's program, its branches and body run through the lowering table, so a
data-dependent predicate costs no host round trip and no graph break.
"""
import jax.numpy as jnp
from jax import lax
from torch._higher_order_ops.cond import cond_op, cond_op_dense
from torch._higher_order_ops.while_loop import while_loop_dense, while_loop_op

from ..runtime.tensor import NeuronTensor
from .registry import lower
from .rules import run_graph

cond_op.py_impl(NeuronTensor)(cond_op_dense)
while_loop_op.py_impl(NeuronTensor)(while_loop_dense)


def _outputs(graph, values) -> tuple:
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
