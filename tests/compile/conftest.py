import sys

import pytest
import torch

import torchneuron.compile as neuron_compile

from . import entry_point

METADATA_DIR = entry_point.metadata_dir()
if METADATA_DIR is not None:
    sys.path.append(METADATA_DIR)


@pytest.fixture(autouse=True)
def fresh_compile_state(tmp_path, monkeypatch):
    """Each test starts with no Dynamo caches, zeroed counters and its own empty disk cache."""
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    neuron_compile.reset()
    yield
    torch._dynamo.reset()
