"""The neuron platform: vLLM's CPU platform with the model, its KV cache and its attention on neuron.

vLLM's scheduler, input preparation and sampler keep running on the host (the CPU model runner's buffers);
the model runner moves each step's inputs to neuron and its logits back (worker.py)."""
import contextlib

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import PlatformEnum

ATTENTION_BACKEND = "torchneuron.vllm.attention.NeuronAttentionBackend"
WORKER = "torchneuron.vllm.worker.NeuronWorker"


class NeuronPlatform(CpuPlatform):
    # out of tree, so vLLM's layers run their PyTorch code (forward_native), not its CPU kernels
    _enum = PlatformEnum.OOT
    device_name: str = "neuron"
    device_type: str = "neuron"
    dispatch_key: str = "PrivateUse1"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return f"neuron:{device_id}"

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        for feature in ("use_mla", "use_sparse"):
            if getattr(attn_selector_config, feature, False):
                raise NotImplementedError(f"vLLM on neuron: {feature[4:]} attention is not supported")
        return ATTENTION_BACKEND

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # the layers call our attention directly: its lowerings run as neuron ops, eager or traced
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        check_supported(vllm_config)
        vllm_config.parallel_config.worker_cls = WORKER
        # vLLM's parameter classes (weight loaders as methods) are Parameter subclasses, which a neuron tensor
        # cannot be: weights load on the host, then the model moves to neuron (worker.py)
        vllm_config.load_config.device = "cpu"
        # the CPU platform's settings hold for the host side; it asserts that the device is the CPU
        with _device_type(vllm_config.device_config, "cpu"):
            super().check_and_update_config(vllm_config)
        from vllm.config import CompilationMode  # not at import: vllm.config needs the platform resolved

        # vLLM's compilation is Inductor's; the worker runs the forward in adaptive eager, or compiled by the
        # neuron backend with TORCHNEURON_VLLM_COMPILE=1 (docs/vllm.md)
        vllm_config.compilation_config.mode = CompilationMode.NONE
        vllm_config.model_config.enforce_eager = True


def check_supported(vllm_config) -> None:
    """Features the plugin does not run fail at load, naming them."""
    model_config, parallel = vllm_config.model_config, vllm_config.parallel_config
    unsupported = {
        "quantization": model_config is not None and model_config.quantization,
        "LoRA": vllm_config.lora_config is not None,
        "multimodal models": model_config is not None and model_config.is_multimodal_model,
        "speculative decoding": vllm_config.speculative_config is not None,
        "tensor parallelism": parallel.tensor_parallel_size > 1,
        "pipeline parallelism": parallel.pipeline_parallel_size > 1,
        "a quantized KV cache": vllm_config.cache_config.cache_dtype not in ("auto", None),
    }
    for name, used in unsupported.items():
        if used:
            raise NotImplementedError(f"vLLM on neuron does not support {name}"
                                      + (f" ({model_config.quantization})" if name == "quantization" else ""))
    if model_config is not None and (model_config.use_mla or model_config.is_hybrid):
        raise NotImplementedError(f"vLLM on neuron runs decoder models with standard attention; "
                                  f"{model_config.architecture} is not one")


@contextlib.contextmanager
def _device_type(device_config, device_type):
    saved = device_config.device_type
    device_config.device_type = device_type
    try:
        yield
    finally:
        device_config.device_type = saved
