"""Turning an op's arguments into a hashable cache key plus the values that vary between calls.

Tensors become slots (their view metadata goes into the key); Python floats
become dynamic scalars so that, say, a changing learning rate does not
recompile; everything else (ints, shapes, dtypes) is static and part of the key.
Static bools, floats and complex numbers carry their type into the key: `1`,
`1.0`, `True` and `1+0j` are equal and hash alike, yet promote differently.
"""
import torch

from ..runtime.tensor import NeuronTensor


class TensorSlot(int):
    __slots__ = ()

    def __repr__(self):
        return f"T{int(self)}"


class ScalarSlot(int):
    __slots__ = ()

    def __repr__(self):
        return f"S{int(self)}"


class _Slots(dict):
    """Slot objects by index, each built once: building them is measurable on the per-op path."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def __missing__(self, index):
        slot = self[index] = self.cls(index)
        return slot


TENSOR_SLOTS = _Slots(TensorSlot)
_SCALAR_SLOTS = _Slots(ScalarSlot)


class _Typed(tuple):
    """(type, value) of a static scalar whose type, not only its value, decides the result's dtype."""

    __slots__ = ()


_TYPED_SCALARS = (bool, float, complex)


def template(value, tensors: list, scalars: list, dynamic_floats: bool):
    """`value` with tensors (and, if asked, floats) replaced by slots; collects them in order."""
    kind = type(value)
    if kind is NeuronTensor:
        tensors.append(value)
        return TENSOR_SLOTS[len(tensors) - 1]
    if kind is float and dynamic_floats:
        scalars.append(value)
        return _SCALAR_SLOTS[len(scalars) - 1]
    if kind is list or kind is tuple:
        slots = []
        for v in value:
            # the common cases inline: a foreach op's lists hold a tensor per parameter, a view's or a
            # reduction's a size or dim each
            item = type(v)
            if item is NeuronTensor:
                tensors.append(v)
                slots.append(TENSOR_SLOTS[len(tensors) - 1])
            elif item is int:
                slots.append(v)
            else:
                slots.append(template(v, tensors, scalars, dynamic_floats))
        return tuple(slots)
    if isinstance(value, torch.Tensor):
        tensors.append(value)  # a CPU (or other) tensor: the dispatcher checks and moves it
        return TENSOR_SLOTS[len(tensors) - 1]
    if kind is torch.Generator:
        return None  # where a random op's key comes from (the dispatcher takes it), not part of its program
    if kind in _TYPED_SCALARS:
        return _Typed((kind, value))
    return value


def generator_of(args, kwargs):
    """A random op's `generator` argument, keyword (every op but rrelu_with_noise) or positional."""
    generator = kwargs.get("generator")
    if generator is None:
        generator = next((a for a in args if type(a) is torch.Generator), None)
    return generator


def fill(value, tensors, scalars):
    """The inverse of `template`: slots replaced by the given tensors/values."""
    kind = type(value)
    if kind is TensorSlot:
        return tensors[value]
    if kind is ScalarSlot:
        return scalars[value]
    if kind is tuple:
        return [fill(v, tensors, scalars) for v in value]
    if kind is _Typed:
        return value[1]
    return value
