"""`torch.neuron.amp`: torch.cuda.amp's names for code written against it (`torch.cuda.amp.autocast()`,
`GradScaler()`, `@custom_fwd`), each the device-generic torch.amp API with the device set to neuron."""
import functools

import torch


class autocast(torch.amp.autocast):
    """`torch.autocast("neuron", ...)`, usable as a context manager and as a decorator."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("neuron", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        super().__init__("neuron", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="neuron")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="neuron")
