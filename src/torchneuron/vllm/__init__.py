"""vLLM on neuron: a vLLM platform plugin (entry point `vllm.platform_plugins`: neuron). See docs/vllm.md.

Nothing in torchneuron imports this package; it imports vLLM, an optional extra (`torchneuron[vllm]`)."""
from ..device.guard import device_count


def register():
    """The neuron platform's qualified name when torchneuron finds a device, else None (vLLM's plugin protocol)."""
    return "torchneuron.vllm.platform.NeuronPlatform" if device_count() > 0 else None
