"""The neuron worker and model runner: vLLM's CPU ones, with the model and its KV cache on neuron.

The runner's own buffers (token ids, positions, block tables, sampling state) stay on the host as in the
CPU runner; each step's inputs move to neuron at the model's call and the logits come back for the
sampler, which runs on the host with vLLM's CPU generators."""
import contextlib
import os

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker


class NeuronModelRunner(CPUModelRunner):
    def __init__(self, vllm_config, device):
        # the runner's device is the host: its buffers stay there (see the module's docstring)
        super().__init__(vllm_config, torch.device("cpu"))
        self.neuron = torch.device("neuron", torch.neuron.current_device())

    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights)
        self.model.to(self.neuron)
        if os.environ.get("TORCHNEURON_VLLM_COMPILE") == "1":
            # one program per step shape (token count, metadata shapes): allow many before Dynamo gives up
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.model.forward = torch.compile(self.model.forward, backend="neuron", dynamic=False)
        compute_logits = self.model.compute_logits
        self.model.compute_logits = lambda hidden_states: _to_host(compute_logits(hidden_states))

    def _model_forward(self, *args, **kwargs):
        args, kwargs = _to_device((args, kwargs), self.neuron)
        return super()._model_forward(*args, **kwargs)

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        # vLLM allocates the cache on the runner's device: the runner's device is the host for everything else
        host, self.device = self.device, self.neuron
        try:
            return super().initialize_kv_cache_tensors(kv_cache_config, kernel_block_sizes,
                                                       kv_cache_allocation_context)
        finally:
            self.device = host


class NeuronWorker(CPUWorker):
    def init_device(self):
        super().init_device()  # builds a CPU model runner, replaced: its class is a module global there
        self.model_runner = NeuronModelRunner(self.vllm_config, self.device)
        if "TORCHNEURON_ADAPTIVE_EAGER" not in os.environ:
            torch.neuron.set_adaptive_eager(True)  # the measured choice (docs/vllm.md)

    def _maybe_get_memory_pool_context(self, tag):
        return contextlib.nullcontext()  # no sleep mode, as on the CPU


def _to_host(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


def _to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value
