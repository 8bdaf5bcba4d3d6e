"""flex_attention on neuron: PyTorch's own dense implementation of its higher-order ops.

`torch.nn.attention.flex_attention` calls the `flex_attention` higher-order op (and autograd calls
`flex_attention_backward`). PyTorch implements both for any device as ATen ops (`sdpa_dense`,
`sdpa_dense_backward`: the score matrix, `score_mod` and the block mask applied through vmap);
a higher-order op reaches a tensor subclass's kernel only through a rule registered for the subclass,
so each is registered here for `NeuronTensor`. Every ATen op inside then runs through the lowering
table like any other. Compiled graphs run these two ops the same way, between compiled pieces
(`EAGER_HOPS`), so XLA gets the pieces around them (see also the compile patch
`flex_attention_runs_under_aot_analysis`).
"""
from torch._higher_order_ops.flex_attention import (
    flex_attention,
    flex_attention_backward,
    sdpa_dense,
    sdpa_dense_backward,
)

from ..runtime.tensor import NeuronTensor

EAGER_HOPS = (flex_attention, flex_attention_backward)

flex_attention.py_impl(NeuronTensor)(sdpa_dense)
flex_attention_backward.py_impl(NeuronTensor)(sdpa_dense_backward)

