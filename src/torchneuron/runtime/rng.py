"""Random keys from the device generators (native `torch.Generator`s, Philox-shaped: seed, offset).

Each random op takes the key fold_in(key(seed), offset) and advances its generator's offset by one,
so eager, adaptive eager and compiled code drawing in the same order see the same numbers, and a
generator's `get_state`/`set_state` (16 bytes: seed, offset) replays them.
"""
import functools

import jax
import numpy as np
import torch

from ..native import _C as native


@functools.cache
def generator(index: int) -> torch.Generator:
    """The default generator of neuron device `index`."""
    return native.default_generator(index)


def next_key(index: int, source: torch.Generator = None) -> np.ndarray:
    """The raw material of one op's key, from `source` (a user's generator; the native layer refuses
    one of another device with the CPU's error) or else device `index`'s default generator:
    (seed low, seed high, offset low, offset high) as uint32."""
    seed, offset = native.next_seed_offset(generator(index) if source is None else source)
    return np.array([seed & 0xFFFFFFFF, seed >> 32, offset & 0xFFFFFFFF, offset >> 32], dtype=np.uint32)


def key_from(raw) -> jax.Array:
    """Inside traced code: the JAX key for raw material from `next_key`."""
    key = jax.random.wrap_key_data(raw[:2], impl="threefry2x32")
    return jax.random.fold_in(jax.random.fold_in(key, raw[2]), raw[3])
