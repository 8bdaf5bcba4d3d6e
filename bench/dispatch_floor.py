"""What PyTorch's own dispatch costs a Python backend per op, against the eager fixed-cost goal.

    python -m bench.dispatch_floor

The performance issue asks op-by-op eager to cost at most 1.7x a bare `jax.jit` call. Each figure is
thread CPU time per call of a 16x16 float32 add (min over repeats, as bench.fixed_cost measures):

- "neuron tensor, no-op dispatch": a neuron tensor (a tensor subclass with __torch_dispatch__, as
  torchneuron's are) whose dispatch returns a tensor made beforehand: what PyTorch spends before and
  after any backend code;
- "plain tensor, Python fallback kernel": the other design a Python backend has, a plain PrivateUse1
  TensorImpl (no Python key) whose ops reach a boxed Python kernel registered with
  `torch.library.Library("_", "IMPL").fallback(..., "PrivateUse1")`, returning a tensor made beforehand.
  It runs in a process of its own without torchneuron, on a plain tensor built by a 20-line extension
  compiled here with torch.utils.cpp_extension (about a minute the first time);
- "bare jax.jit", neuron eager, adaptive eager and "torch cpu" (PyTorch's own CPU kernel, for scale): as in
  bench.fixed_cost.

The goal's budget is 1.7x the bare call; what is left of it after the bare call and PyTorch's dispatch is
what a backend's own code (cache key, executable lookup, output tensor) may take.
"""
import argparse
import json

_PLAIN_TENSOR_SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

C10_REGISTER_GUARD_IMPL(PrivateUse1, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::PrivateUse1>);

// a float tensor of `sizes` on PrivateUse1 with no data and no Python dispatch key
py::object plain_tensor(std::vector<int64_t> sizes) {
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
      c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, 0)), nullptr, false);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(at::kFloat));
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("plain_tensor", &plain_tensor); }
"""


def _plain_tensor_fallback(calls: int, repeats: int) -> float:
    """Run in a process without torchneuron (its PrivateUse1 is the neuron device, with kernels of its own)."""
    import torch
    from torch.utils.cpp_extension import load_inline

    from .timing import thread_time_per_call

    extension = load_inline("dispatch_floor_plain_tensor", cpp_sources=[_PLAIN_TENSOR_SOURCE],
                            extra_cflags=["-O2"])
    torch.utils.rename_privateuse1_backend("neuron")
    a, b, result = (extension.plain_tensor([16, 16]) for _ in range(3))
    library = torch.library.Library("_", "IMPL")
    library.fallback(lambda op, *args, **kwargs: result, "PrivateUse1")
    if a + b is not result:
        raise AssertionError("the fallback kernel was not called")
    return thread_time_per_call(lambda: a + b, calls, repeats)


def _no_op_dispatch(calls: int, repeats: int) -> float:
    import torch

    from torchneuron.eager import dispatch
    from torchneuron.runtime import tensor

    from .timing import thread_time_per_call

    a, b = torch.randn(16, 16, device="neuron"), torch.randn(16, 16, device="neuron")
    result = a + b
    tensor.bind_dispatch(lambda func, args, kwargs: result)
    try:
        return thread_time_per_call(lambda: a + b, calls, repeats)
    finally:
        tensor.bind_dispatch(dispatch.dispatch)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--plain-fallback-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain_fallback_only:
        print(json.dumps(_plain_tensor_fallback(args.calls, args.repeats)))
        return {}
    import torch

    from .micro import jax_cases, torch_cases
    from .timing import in_own_process, thread_time_per_call

    add = "add 16x16"
    figures = {"neuron tensor, no-op dispatch": _no_op_dispatch(args.calls, args.repeats),
               "bare jax.jit": thread_time_per_call(jax_cases()[add], args.calls, args.repeats)}
    with torch.neuron.adaptive_eager(False):
        figures["neuron eager"] = thread_time_per_call(torch_cases("neuron")[add], args.calls, args.repeats)
    figures["neuron adaptive eager"] = thread_time_per_call(torch_cases("neuron")[add], args.calls, args.repeats)
    figures["torch cpu"] = thread_time_per_call(torch_cases("cpu")[add], args.calls, args.repeats)
    figures["plain tensor, Python fallback kernel"] = in_own_process(
        "bench.dispatch_floor", ["--plain-fallback-only", "--calls", args.calls, "--repeats", args.repeats],
        TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    bare = figures["bare jax.jit"]
    print("| add 16x16 | us per call | / bare jax.jit |\n|---|---:|---:|")
    for name, us in figures.items():
        print(f"| {name} | {us:.2f} | {us / bare:.2f} |")
    budget = 1.7 * bare
    left = budget - bare - figures["neuron tensor, no-op dispatch"]
    print(f"\ngoal 1.7x bare jax.jit: {budget:.2f} us; left for the backend's own code after the bare call and "
          f"PyTorch's dispatch: {left:.2f} us (neuron eager spends "
          f"{figures['neuron eager'] - bare - figures['neuron tensor, no-op dispatch']:.2f})")
    return figures


if __name__ == "__main__":
    main()
