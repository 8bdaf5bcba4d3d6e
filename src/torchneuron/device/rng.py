"""Per-device random state: a seed and an offset, advanced once per random op.

The state is Philox-shaped (seed in bytes 0-7, offset in bytes 8-15, little
endian), the layout DTensor's RNG tracker assumes for accelerator generators.
Each random op gets the key fold_in(key(seed), offset), so eager runs and
compiled graphs drawing in the same order see the same numbers.
"""
import random as _random

import jax
import numpy as np
import torch

_DEFAULT_SEED = 67280421310721
_state = {}


def _get(index: int) -> list:
    state = _state.get(index)
    if state is None:
        state = _state[index] = [_DEFAULT_SEED, 0]
    return state


def manual_seed(seed: int, index: int) -> None:
    _state[index] = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0]


def initial_seed(index: int) -> int:
    return _get(index)[0]


def seed(index: int) -> int:
    value = _random.getrandbits(63)
    manual_seed(value, index)
    return value


def next_key(index: int) -> np.ndarray:
    """The raw material of one op's key: (seed low, seed high, offset low, offset high) as uint32."""
    state = _get(index)
    offset = state[1]
    state[1] += 1
    s = state[0]
    return np.array([s & 0xFFFFFFFF, s >> 32, offset & 0xFFFFFFFF, offset >> 32], dtype=np.uint32)


def key_from(raw) -> jax.Array:
    """Inside traced code: the JAX key for raw material from `next_key`."""
    key = jax.random.wrap_key_data(raw[:2], impl="threefry2x32")
    return jax.random.fold_in(jax.random.fold_in(key, raw[2]), raw[3])


def get_state(index: int) -> torch.Tensor:
    seed_, offset = _get(index)
    data = np.array([seed_, offset], dtype=np.uint64).view(np.uint8)
    return torch.from_numpy(data.copy())


def set_state(state: torch.Tensor, index: int) -> None:
    if state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError("RNG state must be a torch.ByteTensor of 16 bytes (seed, offset)")
    seed_, offset = state.cpu().numpy().view(np.uint64)
    _state[index] = [int(seed_), int(offset)]
