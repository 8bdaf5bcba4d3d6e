"""`torch.neuron.graph` and `torch.neuron.NeuronGraph`: torch.cuda.graph's capture and replay.

Ops run inside a capture are recorded, not run (adaptive eager's queue, which no flush may cut while it
captures), and `replay()` runs them as one program on the storages they read and wrote (eager/adaptive.py
`CapturedGraph`). As with CUDA graphs: inputs are static tensors made before the capture, whose values at
replay the graph reads; outputs are the tensors made in the capture, rewritten at each replay; reading a
captured value or waiting for the device while capturing raises; random ops draw new numbers at each replay.
A copy from the host inside a capture is made once, at capture time: copy new inputs into the static ones
before `replay()`.
"""
import gc

from .guard import _adaptive, synchronize


class NeuronGraph:
    """torch.cuda.CUDAGraph's counterpart."""

    def __init__(self, keep_graph: bool = False):
        self._captured = None
        self._capture_ended = False

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        _adaptive().begin_capture()
        self._captured, self._capture_ended = None, False

    def capture_end(self) -> None:
        self._captured = _adaptive().end_capture()
        self._capture_ended = True

    def replay(self) -> None:
        if not self._capture_ended:
            raise RuntimeError("neuron: NeuronGraph.replay() without a preceding successful capture")
        if self._captured is not None:
            self._captured.replay()

    def reset(self) -> None:
        self._captured, self._capture_ended = None, False

    def pool(self):
        """An opaque handle, as CUDA's: neuron graphs share no private memory pool (each replay's results
        are new buffers of the same storages)."""
        return graph_pool_handle()

    def enable_debug_mode(self) -> None:
        """Nothing to enable: the captured program is XLA's, seen with TORCHNEURON_DEBUG tools."""


class graph:
    """`with torch.neuron.graph(g):` captures the block's neuron ops into `g` (torch.cuda.graph's arguments;
    `pool`, `stream` and `capture_error_mode` change nothing here)."""

    def __init__(self, neuron_graph: NeuronGraph, pool=None, stream=None, capture_error_mode: str = "global"):
        self.neuron_graph = neuron_graph

    def __enter__(self):
        synchronize()
        gc.collect()
        self.neuron_graph.capture_begin()

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.neuron_graph.capture_end()
        else:
            _adaptive().end_capture(keep=False)
        return False


def graph_pool_handle():
    return object()


def is_current_stream_capturing() -> bool:
    return _adaptive().queue.capture is not None
