"""torch dtype <-> JAX dtype."""
import ctypes

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from jax import lax

_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
}
_JAX_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}
# XLA has no complex32. Its values are carried as complex64 whose parts are float16 values: rounded
# wherever a complex32 value is made (`convert_to`), and laid out as float16 pairs wherever a view
# reinterprets its bytes (layout). Computation on it is in complex64, PyTorch's opmath for complex32.
_TORCH_TO_JAX[torch.complex32] = jnp.complex64
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# what a neuron tensor can hold (torch.accelerator.get_device_capability reports it)
SUPPORTED = tuple(_TORCH_TO_JAX)

# numpy cannot hold these, so host transfers reinterpret their bits.
_BITCAST_FOR_HOST = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.int8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.int8, ml_dtypes.float8_e5m2),
}


class UnsupportedDtype(NotImplementedError):
    """A dtype no neuron tensor can hold: raised wherever one would be made, never a CPU fallback."""

    def __init__(self, dtype):
        super().__init__(
            f"torchneuron: dtype {dtype} is not supported on the neuron device (of the 8-bit floats it holds "
            f"{' and '.join(map(str, FLOAT8))}); please report it at the project's issue tracker if you need it"
        )


def scalar_type_name(dtype) -> str:
    """PyTorch's C++ name of a dtype ("Float", "Int"), as its error messages spell it."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def not_implemented_for(kernel: str, dtype) -> NotImplementedError:
    """The error PyTorch's dtype dispatch raises where its kernel `kernel` takes no `dtype`."""
    return NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dtype)}\'')


def to_jax(dtype: torch.dtype):
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtype(dtype) from None


def check_supported(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED:
        raise UnsupportedDtype(dtype)


# PyTorch from 2.13 saturates conversions to float8_e4m3fn (no infinities) at its largest finite value, inf
# included; older releases, as XLA, give nan: neuron converts as the installed PyTorch's CPU does
_E4M3FN_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
_E4M3FN_SATURATES = bool(torch.tensor(float("inf")).to(torch.float8_e4m3fn).float().isfinite())


def convert(value, dtype):
    """`value` (a JAX array) as `dtype` (a JAX dtype), converted as PyTorch converts."""
    if (_E4M3FN_SATURATES and dtype == jnp.float8_e4m3fn and value.dtype != dtype
            and value.dtype != jnp.bool_):
        value = jnp.clip(value, -_E4M3FN_MAX, _E4M3FN_MAX)
    if dtype == jnp.uint8 and jnp.issubdtype(value.dtype, jnp.inexact):
        # c10's static_cast_with_inter_type goes through int64, so -1.0 wraps to 255 on the CPU and CUDA alike,
        # where XLA's conversion saturates to 0
        value = jnp.real(value).astype(jnp.int64)
    return value.astype(dtype)


def convert_to(value, dtype: torch.dtype):
    """`value` (a JAX array) as the torch dtype `dtype`, converted as PyTorch converts."""
    wanted = to_jax(dtype)
    if value.dtype != wanted:
        value = convert(value, wanted)
    if dtype == torch.complex32:
        value = lax.complex(*(part.astype(jnp.float16).astype(jnp.float32) for part in (value.real, value.imag)))
    return value


def to_torch(dtype) -> torch.dtype:
    return _JAX_TO_TORCH[np.dtype(dtype)]


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a numpy array (sharing memory where numpy can)."""
    check_supported(tensor.dtype)
    tensor = tensor.detach().resolve_conj().resolve_neg()
    if tensor.dtype == torch.complex32:
        tensor = tensor.to(torch.complex64)
    if tensor.dtype in _BITCAST_FOR_HOST:
        carrier, np_dtype = _BITCAST_FOR_HOST[tensor.dtype]
        return tensor.view(carrier).numpy().view(np_dtype)
    return tensor.numpy()


def numpy_to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor owning a copy of `array`, whose dtype corresponds to `dtype`: memory of its own, resizable as
    any CPU tensor's (one wrapping numpy's memory is not: a kernel resizing a host copy failed)."""
    array = np.asarray(array)
    if dtype == torch.complex32:
        return _owned_copy(array, torch.complex64).to(dtype)
    if dtype in _BITCAST_FOR_HOST:
        carrier, _ = _BITCAST_FOR_HOST[dtype]
        return _owned_copy(array.view(_NUMPY_CARRIER[carrier]), carrier).view(dtype)
    return _owned_copy(array, dtype)


def _owned_copy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    # one copy, into memory torch allocated (a numpy view of it, as copyto would need, makes it unresizable)
    array = np.ascontiguousarray(array)
    host = torch.empty(array.shape, dtype=dtype)
    ctypes.memmove(host.data_ptr(), array.ctypes.data, array.nbytes)
    return host


_NUMPY_CARRIER = {torch.int16: np.int16, torch.int8: np.int8}
