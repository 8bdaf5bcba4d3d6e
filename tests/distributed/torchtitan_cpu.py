"""examples/torchtitan_llama.py on the CPU over gloo: the reference test_torchtitan.py compares neuron with.

TorchTitan 0.3.0 with torch 2.13 cannot train its language models on the CPU unchanged, so this applies
the fewest changes that let the same trainer, config and data run there:
- the device: torchneuron is not loaded (PyTorch's device-backend autoload is off), and TorchTitan
  trains on `torch._utils._get_available_device_type()` (neuron, here), else
  assumes "cuda". This says "cpu", and gives `torch.cpu` the device-module calls TorchTitan makes that
  it lacks (device name and properties, memory statistics, which read zero).
- the attention: every TorchTitan language model uses `flex_attention` (its only masked backend the
  CPU could run), whose backward torch refuses on the CPU ("FlexAttention does not support backward
  on CPU"), and whose Inductor CPU template has no backward. The reference runs it uncompiled, as
  PyTorch's dense implementation of its higher-order ops: the implementation neuron lowers too.
- the gradient reduction: TorchTitan sets FSDP2's gradient divide factor to 1 (it scales gradients by
  the global token count itself), which FSDP2 reduce-scatters as `ReduceOp.PREMUL_SUM(1.0)`; gloo has no
  PREMUL_SUM ("Cannot use ReduceOp.PREMUL_SUM with Gloo"), so FSDP2 is told to reduce by plain sums and
  apply the factor (1) itself, as it does for devices with SUM only.
"""
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # before torch: a loaded neuron is the accelerator c10d uses

import torch  # noqa: E402


def cpu_device_module() -> None:
    torch._utils._get_available_device_type = lambda: "cpu"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    torch.cpu.current_device = lambda: 0  # torch.cpu says "cpu", which barrier(device_ids=...) refuses
    torch.cpu.get_device_name = lambda device=None: "cpu"
    torch.cpu.get_device_properties = lambda device=None: SimpleNamespace(name="cpu", total_memory=total)
    torch.cpu.reset_peak_memory_stats = lambda device=None: None
    torch.cpu.empty_cache = lambda: None
    torch.cpu.memory_stats = lambda device=None: {
        "active_bytes.all.peak": 0, "reserved_bytes.all.peak": 0, "num_alloc_retries": 0, "num_ooms": 0}


def dense_flex_attention() -> None:
    from torch.nn.attention import flex_attention as flex
    from torchtitan.models.common.attention import FlexAttention

    flex._validate_device = lambda query, key, value: None
    FlexAttention._compiled_flex_attn = flex.flex_attention


def sum_reductions() -> None:
    from torch.distributed.fsdp import FSDPModule

    original = FSDPModule.set_gradient_divide_factor

    def set_gradient_divide_factor(self, factor):
        original(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


if __name__ == "__main__":
    cpu_device_module()
    dense_flex_attention()
    sum_reductions()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import torchtitan_llama

    torchtitan_llama.main()
