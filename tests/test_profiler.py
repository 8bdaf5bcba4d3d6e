"""torch.profiler on neuron code: op ranges, compiles, fallbacks, transfers, memory, device and JAX tracks."""
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import torchneuron
from torchneuron.runtime import events

NEURON = ProfilerActivity.PrivateUse1


@pytest.fixture(scope="module")
def traced_step(tmp_path_factory):
    """One profiled training step (after a warm-up step) with a new shape, a planted fallback and a transfer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step(extra):
        with record_function("train_step"):
            loss = model(x.to("neuron")).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if extra:
                torch.arange(7.0, device="neuron").cumsum(0)  # forced onto the CPU below
                torch.ones(5, 3, device="neuron").exp()  # a signature not seen before: compiled here
            return loss.item()

    cumsum = torch.ops.aten.cumsum.default
    torchneuron.library.force_cpu(cumsum)  # first: changing the lowering table empties the executable cache
    try:
        # a disk cache of its own: each first run compiles, rather than loading what another test stored
        with pytest.MonkeyPatch.context() as patched, torch.neuron.adaptive_eager(False):
            patched.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
            step(extra=False)  # each op's own launch (adaptive eager's flushes: below)
            with profile(activities=[ProfilerActivity.CPU, NEURON], record_shapes=True, profile_memory=True) as prof:
                step(extra=True)
    finally:
        torchneuron.library.force_cpu(cumsum, False)
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    prof.export_chrome_trace(str(path))
    return prof, json.loads(path.read_text())


def _cpu_events(trace, name):
    return [e for e in trace["traceEvents"] if e.get("name") == name and e.get("ph") == "X" and isinstance(e["pid"], int)]


def test_ops_appear_by_name_with_their_launches_and_device_time(traced_step):
    prof, _ = traced_step
    rows = {e.key: e for e in prof.key_averages()}
    for name in ("neuron::aten.addmm.default", "neuron::aten.mm.default", "neuron::launch", "neuron::execute"):
        assert name in rows, sorted(rows)
    assert rows["neuron::aten.addmm.default"].count == 2  # two Linear layers, one step
    assert rows["neuron::launch"].count >= rows["neuron::aten.addmm.default"].count
    # the backend is no longer one opaque row: its dispatch is the neuron:: ranges' time
    assert rows["PythonSubclass"].self_cpu_time_total < rows["PythonSubclass"].cpu_time_total / 2


def test_compile_events_say_cache_miss_and_name_the_op(traced_step):
    _, trace = traced_step
    compiles = _cpu_events(trace, "neuron::compile")
    assert compiles and all(e["args"]["cache"] == "miss" for e in compiles)
    assert "aten.exp.default" in {e["args"]["op"] for e in compiles}
    assert all(e["args"]["cache"] == "hit" for e in _cpu_events(trace, "neuron::launch"))


def test_an_executable_loaded_from_the_disk_cache_is_a_disk_hit(own_disk_cache, tmp_path):
    """An eager op's first run loads its executable where a process before stored it: not a compile."""
    x = torch.ones(3, 7, device="neuron")
    for expected in ("miss", "disk hit"):
        torch.neuron.clear_executable_cache()  # as a new process would start
        activities = [ProfilerActivity.CPU, NEURON]
        with torch.neuron.adaptive_eager(False), profile(activities=activities, record_shapes=True) as prof:
            x.sinh().cpu()
        prof.export_chrome_trace(str(tmp_path / "trace.json"))
        trace = json.loads((tmp_path / "trace.json").read_text())
        assert [e["args"]["cache"] for e in _cpu_events(trace, "neuron::compile")] == [expected]


def test_fallback_and_transfers_are_recorded(traced_step):
    _, trace = traced_step
    assert {e["args"]["op"] for e in _cpu_events(trace, "neuron::cpu_fallback")} == {"aten.cumsum.default"}
    h2d = _cpu_events(trace, "neuron::transfer_h2d")
    assert any(e["args"]["bytes"] == 4 * 8 * 4 for e in h2d)  # x, 4x8 float32
    d2h = _cpu_events(trace, "neuron::transfer_d2h")
    assert any(e["args"]["bytes"] == 4 for e in d2h)  # loss.item()
    assert any(e["args"]["bytes"] == 7 * 4 for e in d2h)  # the fallback's input going to the CPU


def test_memory_events_are_neuron_allocations_and_frees(traced_step):
    prof, trace = traced_step
    memory = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    neuron = [e for e in memory if e["args"].get("Device Type") == int(torch._C._autograd.DeviceType.PrivateUse1)]
    sizes = [e["args"]["Bytes"] for e in neuron]
    assert any(b == 5 * 3 * 4 for b in sizes)  # ones(5, 3), float32
    assert any(b < 0 for b in sizes)  # frees
    exp = next(e for e in prof.key_averages() if e.key == "neuron::aten.exp.default")
    assert exp.self_device_memory_usage == 5 * 3 * 4  # key_averages' "Self NEURON Mem" column


def test_record_function_ranges_contain_the_neuron_work(traced_step):
    _, trace = traced_step
    (step,) = _cpu_events(trace, "train_step")
    inside = [e for e in _cpu_events(trace, "neuron::launch") if step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    assert len(inside) == len(_cpu_events(trace, "neuron::launch"))


def test_device_track_lines_up_with_the_execute_ranges(traced_step):
    _, trace = traced_step
    executes = _cpu_events(trace, "neuron::execute")
    device = [e for e in trace["traceEvents"] if e.get("pid") == "neuron:0" and e.get("ph") == "X"]
    assert len(device) >= len(executes) > 0
    for e in executes:
        (same,) = [d for d in device if d["ts"] == e["ts"]]
        assert same["name"] == e["args"]["op"] and same["dur"] == e["dur"]


def test_jax_trace_is_merged_on_the_same_time_axis(traced_step):
    _, trace = traced_step
    error_us = trace["torchneuron"]["jax_trace_alignment_error_us"]
    assert 0 <= error_us < 100
    jax_events = [e for e in trace["traceEvents"] if str(e.get("pid", "")).startswith("XLA ")]
    # executables carry their op's name: XLA reports the jitted function by it
    calls = [e for e in jax_events if e.get("name") == "PjitFunction(jit(addmm))"]
    assert calls
    ranges = _cpu_events(trace, "neuron::launch") + _cpu_events(trace, "neuron::compile")
    slack = error_us + 1  # us; XLA's call starts within its launch range (measured: 1-4 us after its start)
    for call in calls:
        assert any(r["ts"] - slack <= call["ts"] and call["ts"] + call["dur"] <= r["ts"] + r["dur"] + slack
                   for r in ranges if r["args"]["op"] == "aten.addmm.default")


def test_without_the_neuron_activity_there_is_no_jax_trace(tmp_path):
    a = torch.ones(3, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (a + 1).cpu()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = json.loads((tmp_path / "t.json").read_text())
    assert "torchneuron" not in trace
    assert _cpu_events(trace, "neuron::aten.add.Tensor")
    assert not events.listening  # nothing listens once the profile ends


def test_adaptive_flush_and_compiled_graph_events(tmp_path):
    double = torch.compile(lambda t: t * 2 + 1, backend="neuron")
    a = torch.ones(6, device="neuron")
    ((a + 1) * 3 - 2).sum().item()  # ops are queued once they have run op by op
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.neuron.adaptive_eager():
            ((a + 1) * 3 - 2).sum().item()
        double(a)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = json.loads((tmp_path / "t.json").read_text())
    (flush,) = _cpu_events(trace, "neuron::adaptive_flush")
    assert flush["args"]["ops"] >= 3 and flush["args"]["op"].startswith("adaptive_eager_")
    (graph,) = _cpu_events(trace, "neuron::graph_compile")
    assert graph["args"]["op"].startswith("neuron_graph_")
    assert any(e["args"]["op"] == graph["args"]["op"] for e in _cpu_events(trace, "neuron::launch"))


def test_memory_history_and_snapshot():
    torch.neuron.memory._record_memory_history()
    try:
        kept = torch.zeros(1000, device="neuron")
        freed = torch.zeros(300, device="neuron")
        del freed
        snapshot = torch.neuron.memory_snapshot()
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    (block,) = [s["blocks"][0] for s in snapshot["segments"] if s["address"] == kept.untyped_storage().data_ptr()]
    assert block["size"] == 4000 and block["state"] == "active_allocated"
    assert block["frames"][0]["filename"] == __file__  # the innermost frame outside torchneuron
    trace = snapshot["device_traces"][0]
    assert [e["action"] for e in trace if e["size"] == 1200] == ["alloc", "free_completed"]
    assert [e["action"] for e in trace if e["size"] == 4000] == ["alloc"]
    assert not events.listening


def test_docs_tutorial_runs_as_written(tmp_path):
    """docs/profiling.md's python blocks, run in order from a fresh process (the demo's model trains)."""
    root = Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "profiling.md").read_text(), re.S)
    assert len(blocks) == 2
    (tmp_path / "tutorial.py").write_text("\n".join(blocks))
    paths = [str(root), str(Path(torchneuron.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    done = subprocess.run([sys.executable, "tutorial.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "neuron::launch" in done.stdout and "live storages" in done.stdout
    trace = json.loads((tmp_path / "demo_trace.json").read_text())
    assert _cpu_events(trace, "neuron::execute") and _cpu_events(trace, "neuron::aten.mm.default")
    assert any(e.get("pid") == "neuron:0" for e in trace["traceEvents"])
    with open(tmp_path / "demo_memory.pickle", "rb") as f:
        assert pickle.load(f)["device_traces"][0]


def test_a_program_taking_view_offsets_is_reported_as_an_offset_recompile():
    from torchneuron.profiler import collector

    listener = collector.Collector()
    events.listen(listener)
    try:
        x, y = torch.zeros(10, 7, device="neuron"), torch.ones(10, 7, device="neuron")
        for i in range(4):  # the second position builds the program that takes offsets as arguments
            x[i] = y[i] * 2
        torch.neuron.synchronize()
    finally:
        events.stop_listening(listener)
    causes = {(name, cause) for name, cause, _, _ in listener.recompiles}
    assert causes == {("aten.mul.Tensor", "strides or storage offset"), ("aten.copy_.default", "strides or storage offset")}


def test_nvtx_annotations_are_profiler_ranges(tmp_path):
    """torch.neuron.nvtx as torch.cuda.nvtx: depths as NVTX returns them, ranges around the neuron work."""
    import threading

    from torch.neuron import nvtx

    a = torch.ones(4, device="neuron")

    @nvtx.range("decorated {}", 1)
    def decorated():
        return (a * 2).sum()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert nvtx.range_push("outer") == 0
        assert nvtx.range_push("inner") == 1
        nvtx.mark("instant")
        decorated().item()
        assert nvtx.range_pop() == 1 and nvtx.range_pop() == 0 and nvtx.range_pop() == -1
        started = nvtx.range_start("across threads")
        ended = threading.Thread(target=nvtx.range_end, args=(started,))
        ended.start()
        ended.join()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = json.loads((tmp_path / "t.json").read_text())
    (outer,), (inner,), (op,) = (_cpu_events(trace, name) for name in ("outer", "inner", "decorated 1"))
    assert outer["ts"] <= inner["ts"] <= op["ts"] and op["ts"] + op["dur"] <= inner["ts"] + inner["dur"]
    assert any(e["name"].startswith("neuron::") and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]
               for e in trace["traceEvents"])
    assert _cpu_events(trace, "instant") and _cpu_events(trace, "across threads")
