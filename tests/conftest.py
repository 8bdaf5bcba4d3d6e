"""Test-suite configuration, the one list of tests expected to fail and the one list of tests skipped on older
PyTorch releases, each with its reason."""
import atexit
import contextlib
import os
import shutil
import tempfile

# A fresh on-disk cache per test process: graphs and executables cached by an earlier run on this machine,
# or by the other pytest-xdist worker (which inherits the controller's environment), would skip the tracing
# and compiling that tests count, and would hide a cache that no longer loads. Set before torch is imported,
# since `import torch` autoloads torchneuron.
if os.environ.get("TORCHNEURON_CACHE_DIR", "") == os.environ.get("_TORCHNEURON_TESTS_CACHE_DIR", ""):
    os.environ["TORCHNEURON_CACHE_DIR"] = os.environ["_TORCHNEURON_TESTS_CACHE_DIR"] = tempfile.mkdtemp(
        prefix="torchneuron-tests-")
    atexit.register(shutil.rmtree, os.environ["TORCHNEURON_CACHE_DIR"], True)

import jax  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache as jax_cache  # noqa: E402

import torchneuron  # noqa: F401  (also autoloaded by `import torch`; importing keeps tests explicit)
from torchneuron.runtime.program import wait_for_compiles  # noqa: E402

# "file::test[param]" -> why it cannot pass yet (strict: an unexpected pass is reported)
EXPECTED_FAILURES = {}


# "file" or "file::test" (all its parameters) -> (the first PyTorch release it runs on, why not before)
_FLOAT8_REFERENCE = ("the CPU kernels the tests compare with changed in torch 2.13: before, conversions to "
                     "float8_e4m3fn overflow to nan (neuron follows the installed release) and _scaled_mm takes "
                     "per-tensor scales only, with other error messages")
SKIPPED_ON_OLDER_PYTORCH = {
    "test_float8.py": ((2, 13), _FLOAT8_REFERENCE),
    "test_bad_input.py::test_float8_conversions_saturate_as_on_the_cpu": ((2, 13), _FLOAT8_REFERENCE),
    "test_device_module.py::test_accelerator_empty_host_cache_once_the_device_is_in_use": (
        (2, 13), "torch.accelerator.empty_host_cache is new in torch 2.13"),
    "test_graphs.py::test_torch_accelerator_graph_captures_on_neuron": (
        (2, 13), "torch.accelerator.Graph and its backend interface are new in torch 2.13"),
    "test_native_core.py::test_accelerator_device_capability_names_the_dtypes_tensors_hold": (
        (2, 13), "torch.accelerator.get_device_capability is new in torch 2.13"),
    "test_foreach.py::test_foreach_powsum_is_lowered": (
        (2, 13), "torch._foreach_powsum (PyTorch #172685) is checked from torch 2.13, the release it was tested with"),
}
_TORCH_RELEASE = tuple(int(part) for part in torch.__version__.split(".")[:2])


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = EXPECTED_FAILURES.get(f"{item.path.name}::{item.name}")
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        for key in (item.path.name, f"{item.path.name}::{item.originalname}"):
            release, why = SKIPPED_ON_OLDER_PYTORCH.get(key, ((0, 0), None))
            if _TORCH_RELEASE < release:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def own_disk_cache(tmp_path, monkeypatch):
    """A disk cache of the test's own for our executables and for JAX's, and an empty eager cache. A program
    another test compiled would be a hit in the suite's JAX cache, and our store skips what JAX loaded
    (compilation_cache.compile_and_store): which programs a test found on disk depended on the tests before it."""
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))
    suite_jax_cache = jax.config.jax_compilation_cache_dir
    _use_jax_cache(str(tmp_path / "jax"))
    torch.neuron.clear_executable_cache()
    yield tmp_path
    torch.neuron.clear_executable_cache()
    _use_jax_cache(suite_jax_cache)


def _use_jax_cache(directory) -> None:
    jax_cache.set_cache_dir(directory)
    jax_cache.reset_cache()  # JAX opens its cache once, at the first compile after a reset


@pytest.fixture(autouse=True)
def _compiles_end_with_their_test():
    """A test's compiles started ahead (a queue seen twice compiles its fused program on a compile thread) finish
    before the next test starts: tests that count page faults, memory or compiles, or time, see their own work."""
    yield
    wait_for_compiles()


@pytest.fixture
def neuron():
    return torch.device("neuron")


def assert_same(neuron_tensor, cpu_tensor, **tolerances):
    """Values, dtype and shape of a neuron result equal the CPU result."""
    assert neuron_tensor.device.type == "neuron"
    torch.testing.assert_close(neuron_tensor.cpu(), cpu_tensor, **tolerances)


@contextlib.contextmanager
def jax_compile_events():
    """The JAX lowerings and XLA compiles (their event names) made inside the block; a persistent-cache hit
    still lowers, so a block that builds no new program records nothing. Compiles started ahead on compile threads
    count where they were started: those of earlier code finish before the block, the block's own inside it."""
    import jax

    names = []

    def record(name, *args, **kwargs):
        if name in ("/jax/core/compile/jaxpr_to_mlir_module_duration", "/jax/core/compile/backend_compile_duration"):
            names.append(name)

    wait_for_compiles()
    jax.monitoring.register_event_duration_secs_listener(record)
    try:
        yield names
        wait_for_compiles()
    finally:
        jax.monitoring.unregister_event_duration_listener(record)


@pytest.fixture
def unrunnable_stored_executables(monkeypatch):
    """Every executable loaded from the disk cache fails when run, consuming nothing, as one XLA serialized
    without a kernel it needs does ("Function ... not found"); the list holds those runs. A CPU fallback is an
    error meanwhile: what cannot run must be compiled again, not run on the CPU."""
    from jax.experimental import serialize_executable

    load, runs = serialize_executable.deserialize_and_load, []

    class Unrunnable:
        def __init__(self, executable):
            self.out_info = executable.out_info

        def __call__(self, *args):
            runs.append(self)
            raise RuntimeError("Function add_bitcast_fusion not found")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *a, **k: Unrunnable(load(*a, **k)))
    monkeypatch.setenv("TORCHNEURON_FALLBACK", "error")
    return runs
