"""What a fresh process sees: the entry point, and executables reused from the disk cache."""
import json
import os
import subprocess
import sys

from torchneuron.runtime import compilation_cache

from . import entry_point
from .conftest import METADATA_DIR

SRC = os.path.join(entry_point.ROOT, "src")

TRAIN_STEP = """
import collections, json, sys, jax, torch
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kwargs: events.update([name]))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to("neuron")
step = torch.compile(model, backend="neuron")
loss = step(torch.randn(4, 8).to("neuron")).square().mean()
loss.backward()
with torch.no_grad():
    out = step(torch.ones(4, 8).to("neuron"))
from torchneuron.compile import report
print(json.dumps({"report": report(), "loss": loss.item(), "out": out.cpu().tolist(),
                  "grad": model[0].weight.grad.sum().item(),
                  "xla_cache_misses": events["/jax/compilation_cache/cache_misses"]}))
"""


def _run(code, env_extra):
    path = [SRC] + ([METADATA_DIR] if METADATA_DIR else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **env_extra)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_entry_point_declared():
    assert entry_point.declared() == {"neuron": "torchneuron.compile:neuron_backend"}


def test_backend_found_without_importing_torchneuron(tmp_path):
    code = (
        "import sys, torch\n"
        "assert 'torchneuron.compile' not in sys.modules\n"
        "assert 'neuron' in torch._dynamo.list_backends()\n"
        "f = torch.compile(lambda x: x * 2 + 1, backend='neuron')\n"
        "print(f(torch.ones(3, device='neuron')).cpu().tolist())\n"
    )
    assert _run(code, {"TORCHNEURON_CACHE_DIR": str(tmp_path)}) == "[3.0, 3.0, 3.0]"


def test_second_process_loads_executables_from_disk_and_trims_the_cache_when_it_exits(tmp_path):
    env = {"TORCHNEURON_CACHE_DIR": str(tmp_path)}
    cold = json.loads(_run(TRAIN_STEP, env))
    (versions,) = os.listdir(tmp_path / "xla")
    bound = _size(tmp_path / "xla" / versions) // 2
    warm = json.loads(_run(TRAIN_STEP, dict(env, TORCHNEURON_CACHE_MAX_BYTES=str(bound))))
    assert cold["report"]["xla_compiles"] == 3  # forward, backward, inference
    assert cold["report"]["disk_cache_hits"] == 0
    assert warm["report"]["xla_compiles"] == 0
    assert warm["report"]["disk_cache_hits"] == 3
    assert {k: warm[k] for k in ("loss", "out", "grad")} == {k: cold[k] for k in ("loss", "out", "grad")}
    # eager op executables (the transfers, the loss, backward's accumulations) come from JAX's cache too
    assert cold["xla_cache_misses"] > 0
    assert warm["xla_cache_misses"] == 0
    for kind in ("graphs", "xla"):
        versions = os.listdir(os.path.join(tmp_path, kind))
        assert len(versions) == 1 and "torch-" in versions[0] and "jaxlib-" in versions[0]
        assert _size(os.path.join(tmp_path, kind, versions[0])) <= bound


def _size(directory) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(directory))


def test_trimming_removes_the_least_recently_used_entries_first(tmp_path):
    for age in range(6):
        (tmp_path / f"entry{age}").write_bytes(b"x" * 100)
        os.utime(tmp_path / f"entry{age}", (1_000_000 + age, 1_000_000 + age))
    compilation_cache.trim(str(tmp_path), 350)
    assert sorted(os.listdir(tmp_path)) == ["entry3", "entry4", "entry5"]
