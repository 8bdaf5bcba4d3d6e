"""TorchNeuron: a native PyTorch device, `neuron`, backed by XLA through PJRT (via JAX).

`import torch` registers it (torch.backends entry point); importing this
package does the same.
"""
import gc
import os

_importing = True


def _autoload() -> None:
    """Entry point of the `torch.backends` group: PyTorch calls it at the end of `import torch`."""
    # `import torchneuron` before torch re-enters here from inside `import torch`: registering then
    # would see a half-imported torch, and the import below registers once torch is complete
    if _importing:
        return
    register()


# The imports below (JAX's above all) make about 280,000 objects that live as long as the process and only a
# few hundred that die young: collecting while they arrive took 0.3 s of each `import torch` (the backend
# autoloads), so the collector waits until they are in.
_collecting = gc.isenabled()
gc.disable()
try:
    import torch  # noqa: E402,F401

    from .device.registration import register  # noqa: E402

    register()

    from .runtime.tensor import NeuronTensor  # noqa: E402
    from . import ops  # noqa: E402,F401
    from .eager import dispatch as _dispatch  # noqa: E402,F401  (ops on neuron tensors go to eager dispatch)
    from . import library  # noqa: E402,F401
    from .eager.fallback import report as fallback_report  # noqa: E402
    from . import profiler  # noqa: E402,F401  (torch.profiler sees neuron work; torch.neuron.memory)
    if torch.distributed.is_available():
        from . import distributed  # noqa: E402,F401  (registers the `neuron` c10d backend)

    # Freezing the import-time objects keeps every later full collection from walking them again: one took
    # 0.2-0.35 s on a 2-core machine, and the first fell inside a compiled model's start-up. Objects made
    # after this import are collected as before. TORCHNEURON_GC_FREEZE=0 leaves them unfrozen.
    if os.environ.get("TORCHNEURON_GC_FREEZE", "1") != "0":
        gc.freeze()
finally:
    if _collecting:
        gc.enable()

_importing = False

__all__ = ["NeuronTensor", "fallback_report", "library", "register"]
