"""What a fresh process sees: the entry point, and executables reused from the disk cache."""
import json
import os
import subprocess
import sys
import time

import torch

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
                  "xla_cache_misses": events["/jax/compilation_cache/cache_misses"],
                  "xla_compile_requests": events["/jax/compilation_cache/compile_requests_use_cache"]}))
"""


def _caches(tmp_path, neuron="cache") -> dict:
    """The torchneuron cache `tmp_path / neuron`, and an AOTAutograd cache of the test's own: PyTorch keys its
    entries without naming torchneuron, so a developer's cache may hold graphs other torchneuron code saved."""
    return {"TORCHNEURON_CACHE_DIR": str(tmp_path / neuron), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}


def _run(code, env_extra, *argv):
    path = [SRC] + ([METADATA_DIR] if METADATA_DIR else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **env_extra)
    done = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=600)
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


def test_dynamo_entry_points_trace_neuron_tensors_in_a_fresh_process(tmp_path):
    """`torch._dynamo.explain` and `optimize` trace neuron tensors as tensors without a `torch.compile` first:
    the compile patches were applied by torch.compile and torch.export only, and explain failed."""
    code = (
        "import torch\n"
        "def f(x): return (x.sin() * 2).sum()\n"
        "x = torch.linspace(-1, 1, 4, device='neuron')\n"
        "explained = torch._dynamo.explain(f)(x)\n"
        "print([explained.graph_count, explained.graph_break_count, "
        "round(torch._dynamo.optimize('eager')(f)(x).item(), 5), round(f(x.cpu()).item(), 5)])\n"
    )
    graphs, breaks, optimized, expected = json.loads(_run(code, _caches(tmp_path)))
    assert (graphs, breaks) == (1, 0) and optimized == expected


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
    # eager op executables (the transfers, the loss, backward's accumulations) come from the disk too, as
    # compiled: nothing is lowered, so nothing asks JAX's cache
    assert cold["xla_cache_misses"] > 0
    assert warm["xla_compile_requests"] == 0
    for kind in ("graphs", "xla"):
        versions = os.listdir(os.path.join(tmp_path, kind))
        assert len(versions) == 1 and "torch-" in versions[0] and "jaxlib-" in versions[0]
        assert _size(os.path.join(tmp_path, kind, versions[0])) <= bound


ADAPTIVE_TRAINING = """
import collections, json, jax, torch
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kwargs: events.update([name]))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 2)).to("neuron")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(4, 8).to("neuron")
losses = []
for _ in range(4):
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "weight": model[0].weight.cpu().tolist(),
                  "ops_fused": torch.neuron.adaptive_eager_stats()["ops_fused"],
                  "xla_compile_requests": events["/jax/compilation_cache/compile_requests_use_cache"]}))
"""


def test_adaptive_eager_programs_come_from_the_disk_in_a_second_process(tmp_path):
    """A training loop's op programs and the fused programs adaptive eager makes of its steps are stored as
    compiled: a second process runs the same loop without lowering or compiling any program, fused from its
    first step on (the first process ran its first step op by op and its second queue by queue)."""
    cold = json.loads(_run(ADAPTIVE_TRAINING, _caches(tmp_path)))
    warm = json.loads(_run(ADAPTIVE_TRAINING, _caches(tmp_path)))
    assert warm["ops_fused"] > cold["ops_fused"] > 0
    assert cold["xla_compile_requests"] > 0 and warm["xla_compile_requests"] == 0
    # fused, XLA may round differently in the last bits than op by op (docs/adaptive_eager.md)
    torch.testing.assert_close((warm["losses"], warm["weight"]), (cold["losses"], cold["weight"]), rtol=1e-5,
                               atol=1e-7)


USER_LOWERING = """
import json, sys, torch, torchneuron
factor = float(sys.argv[1])
@torch.library.custom_op("users::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * factor
scaled.register_fake(lambda x: torch.empty_like(x))
@torchneuron.library.lowering(torch.ops.users.scaled.default)
def _(x):
    return x * factor
def f(x):
    return torch.ops.users.scaled(x + 1)
x = torch.ones(2, device="neuron")
print(json.dumps([f(x).cpu().tolist(), torch.compile(f, backend="neuron")(x).cpu().tolist()]))
"""


def test_a_lowering_changed_between_runs_is_traced_again(tmp_path):
    """The disk caches key a program by its op or graph and torchneuron's own source, which does not hold a user's
    lowering (torchneuron.library, kernels): a graph calling one was loaded as the first run had lowered it."""
    env = _caches(tmp_path)
    assert json.loads(_run(USER_LOWERING, env, "2")) == [[4.0, 4.0], [4.0, 4.0]]
    assert json.loads(_run(USER_LOWERING, env, "3")) == [[6.0, 6.0], [6.0, 6.0]]


PRECOMPILED_STEP = """
import json, os, sys, torch
path = sys.argv[1]
torch._dynamo.config.enable_aot_compile = True  # off by default in older PyTorch releases
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to("neuron")
def loss_and_host_copy(model, x):
    out = model(x)
    return out.square().mean(), (out.detach().cpu() * 2).sum()
if os.path.exists(path):
    with open(path, "rb") as f:
        step = torch.compiler.load_compiled_function(f)
else:
    compiled = torch.compile(loss_and_host_copy, backend="neuron", fullgraph=True)
    step = compiled.aot_compile(((model, torch.ones(4, 8, device="neuron")), {}))
    step.save_compiled_function(path)
loss, host = step(model, torch.randn(4, 8).to("neuron"))
loss.backward()
from torchneuron.compile import report
print(json.dumps({"report": report(), "loss": loss.item(), "host": host.item(), "host_device": str(host.device),
                  "grad": model[0].weight.grad.sum().item()}))
"""


def test_precompiled_function_runs_in_a_fresh_process_without_tracing(tmp_path):
    """`torch.compile(...).aot_compile` saves Dynamo's and AOTAutograd's work: a process that loads it traces
    nothing, and its graphs' programs come from the disk cache. The graph's CPU part is saved with it."""
    env = _caches(tmp_path)
    path = str(tmp_path / "step.bin")
    saved = json.loads(_run(PRECOMPILED_STEP, env, path))
    loaded = json.loads(_run(PRECOMPILED_STEP, env, path))
    assert saved["report"]["dynamo_graphs"] == 1 and saved["report"]["xla_compiles"] == 2
    assert loaded["report"]["dynamo_graphs"] == 0 and loaded["report"]["xla_compiles"] == 0
    assert loaded["report"]["disk_cache_hits"] == 2  # forward and backward
    assert loaded["report"]["host_ops"] == saved["report"]["host_ops"] != {}
    assert loaded["host_device"] == "cpu"
    assert {k: loaded[k] for k in ("loss", "host", "grad")} == {k: saved[k] for k in ("loss", "host", "grad")}


WHOLE_GRAPHS_STEP = PRECOMPILED_STEP.replace(
    "return out.square().mean(), (out.detach().cpu() * 2).sum()", "return out.square().mean(), out.sum() * 2"
).replace("import json, os, sys, torch", """import json, os, sys, torch
from torch.fx._graph_pickler import GraphPickler
unpickled = []
loads = GraphPickler.loads
GraphPickler.loads = staticmethod(lambda *args: unpickled.append(1) or loads(*args))""").replace(
    '"host_device": str(host.device),', '"graphs_unpickled": len(unpickled),')


def test_precompiled_whole_graphs_are_unpickled_only_to_trace_a_program(tmp_path):
    """A graph compiled whole is saved with what its programs need but the graph itself: a loading process
    whose disk cache holds the programs never unpickles the graph (its fake tensors were most of the load);
    one whose cache lacks them unpickles it to trace them, with the same results."""
    path = str(tmp_path / "step.bin")
    saved = json.loads(_run(WHOLE_GRAPHS_STEP, _caches(tmp_path), path))
    warm = json.loads(_run(WHOLE_GRAPHS_STEP, _caches(tmp_path), path))
    cold = json.loads(_run(WHOLE_GRAPHS_STEP, _caches(tmp_path, "empty"), path))
    assert saved["report"]["xla_compiles"] == 2 and saved["report"]["host_ops"] == {}
    assert warm["report"]["disk_cache_hits"] == 2 and warm["graphs_unpickled"] == 0
    assert cold["report"]["xla_compiles"] == 2 and cold["graphs_unpickled"] == 2  # forward and backward
    for loaded in (warm, cold):
        assert loaded["report"]["graphs"] == 2 and loaded["report"]["dynamo_graphs"] == 0
        assert {k: loaded[k] for k in ("loss", "host", "grad")} == {k: saved[k] for k in ("loss", "host", "grad")}


# a process saving as an older torchneuron release would: other source, a CompiledGraph without a later attribute
AS_AN_OLDER_RELEASE = """from torchneuron.compile import executable
from torchneuron.runtime import compilation_cache
compilation_cache.source_digest = lambda: "an older release"
saved = executable.CompiledGraph.saved
executable.CompiledGraph.saved = lambda self: {k: v for k, v in saved(self).items() if k != "out_layouts"}
"""


def test_a_function_precompiled_by_another_release_is_compiled_again_from_its_graphs(tmp_path):
    """PyTorch's AOTAutograd cache and saved precompiled functions outlive a torchneuron upgrade, and their keys
    do not name it: a loaded graph that other torchneuron code saved is compiled again from its ATen graph, with
    the same results (it was run from the other code's saved state, and failed on an attribute it lacked)."""
    path = str(tmp_path / "step.bin")
    env = _caches(tmp_path)
    imports = "import json, os, sys, torch\n"
    older = WHOLE_GRAPHS_STEP.replace(imports, imports + AS_AN_OLDER_RELEASE, 1)
    saved = json.loads(_run(older, env, path))
    loaded = json.loads(_run(WHOLE_GRAPHS_STEP, env, path))
    assert loaded["graphs_unpickled"] == 2 and loaded["report"]["dynamo_graphs"] == 0
    assert {k: loaded[k] for k in ("loss", "host", "grad")} == {k: saved[k] for k in ("loss", "host", "grad")}


def _size(directory) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(directory))


def test_trimming_removes_the_least_recently_used_entries_first(tmp_path):
    for age in range(6):
        (tmp_path / f"entry{age}").write_bytes(b"x" * 100)
        os.utime(tmp_path / f"entry{age}", (1_000_000 + age, 1_000_000 + age))
    compilation_cache.trim(str(tmp_path), 350)
    assert sorted(os.listdir(tmp_path)) == ["entry3", "entry4", "entry5"]


def test_directories_other_torchneuron_sources_left_in_jax_cache_go_once_a_day_old(tmp_path):
    named = [("0", "new"), ("0", "old"), ("0", "edited"), ("1", "old")]
    current, stale, recent, other_versions = (tmp_path / f"jax-{v}_cpu_torchneuron-{source}" for v, source in named)
    for directory in (current, stale, recent, other_versions):
        directory.mkdir()
    day_old = time.time() - compilation_cache.STALE_SECONDS - 60
    for directory in (current, stale, other_versions):
        os.utime(directory, (day_old, day_old))
    compilation_cache.remove_stale_sources(str(current))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (current, recent, other_versions))
