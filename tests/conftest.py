"""Test-suite configuration, and the one list of tests expected to fail, each with its reason."""
import pytest

# "file::test[param]" -> why it cannot pass yet (strict: an unexpected pass is reported)
EXPECTED_FAILURES = {
    "test_training.py::test_safetensors_save_neuron_tensors": (
        "safetensors reads tensor.storage().data_ptr() to find shared tensors; neuron tensors have no host "
        "storage pointer. Save .cpu() copies (test_safetensors_round_trip)."
    ),
    "test_training.py::test_dataloader_non_blocking[True]": (
        "pinning for the current accelerator needs PrivateUse1HooksInterface.getPinnedMemoryAllocator, which "
        "PyTorch's Python hooks (torch._C._acc) cannot provide; needs a native shim (DESIGN.md)."
    ),
    "test_training.py::test_safetensors_load_onto_neuron": (
        "safetensors' Rust loader accepts only the device names it knows (cpu, cuda, mps, ...); load onto the "
        "CPU and move with .to('neuron') (test_safetensors_round_trip)."
    ),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = EXPECTED_FAILURES.get(f"{item.path.name}::{item.name}")
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
