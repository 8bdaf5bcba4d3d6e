"""Where the time, the compiles, the fallbacks and the memory go (docs/profiling.md).

- torch.profiler on neuron code shows the backend's work (torch_profiler.py);
- `torch.neuron.memory._record_memory_history()` / `torch.neuron.memory_snapshot()` (memory.py);
- `torch.neuron.nvtx`: torch.cuda.nvtx's annotations as torch.profiler ranges (nvtx.py);
- `python -m torchneuron.doctor script.py` runs a script and reports on it (doctor.py).
"""
import sys

import torch

from ..runtime import events
from . import memory, nvtx
from .torch_profiler import Sessions

events.session_handler = Sessions()

# the device module's memory API, as torch.cuda's (the device layer sits below this one)
torch.neuron.memory = sys.modules["torch.neuron.memory"] = memory
torch.neuron.memory_snapshot = memory.memory_snapshot
torch.neuron.nvtx = sys.modules["torch.neuron.nvtx"] = nvtx

__all__ = ["memory", "nvtx"]
