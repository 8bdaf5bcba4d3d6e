"""The lowering table: ATen op overloads -> JAX functions, grouped by family.

Importing this package registers every family. Eager, adaptive eager and
torch.compile all read the same table through `rules.rule(op)`.
"""
from . import registry  # noqa: F401
from . import (  # noqa: F401  (registration side effects)
    attention,
    checks,
    control_flow,
    elementwise,
    factories,
    fft,
    flex_attention,
    float8,
    indexing,
    linalg,
    linalg_factorizations,
    nn,
    optim,
    pooling,
    quantization,
    random,
    recurrent,
    reductions,
    shape,
    sorting,
    special_functions,
    transformer,
)
from . import foreach  # noqa: E402,F401  (last: it mirrors the per-tensor ops registered above)

# after the families, some of which give a higher-order op a rule of their own (flex attention's)
control_flow.dense_rules_for_neuron()
